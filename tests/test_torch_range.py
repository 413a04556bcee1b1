"""The supported torch range is checked at import, with a message naming the versions."""

import pytest

from hetero_ray import torch_range


@pytest.mark.parametrize("installed", ["2.11.0+cu130", "2.11.0", "2.13.0+cpu", "2.14.0", "2.14.1"])
def test_torch_in_range_is_accepted(installed):
    torch_range.check_torch_version(installed)


@pytest.mark.parametrize("installed", ["2.10.1", "1.13.1", "2.15.0", "3.0.0"])
def test_torch_out_of_range_is_refused_naming_both_versions(installed):
    with pytest.raises(ImportError) as raised:
        torch_range.check_torch_version(installed)
    message = str(raised.value)
    assert installed in message and torch_range.range_text() in message and "install" in message


def test_the_range_is_the_one_pyproject_declares():
    import os
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert f"torch{torch_range.range_text()}" in [d.replace(" ", "") for d in dependencies]


def test_the_installed_torch_is_in_range():
    import torch

    assert torch_range.installed_torch_version() is not None
    assert torch_range.parse_version(torch.__version__) == torch_range.parse_version(torch_range.installed_torch_version())
