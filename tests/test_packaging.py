"""What installs: pyproject.toml names the packages by hand (the app's folder, dashboards/,
installs as hetero_ray_dashboards), so a new package folder must be named there too."""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def setuptools_config() -> dict:
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def packages_in(folder: str, name: str) -> set[str]:
    found = set()
    root = os.path.join(REPO_ROOT, folder)
    for directory, children, files in os.walk(root):
        children[:] = [c for c in children if c != "__pycache__"]
        if "__init__.py" in files:
            relative = os.path.relpath(directory, root)
            found.add(name if relative == "." else f"{name}.{relative.replace(os.sep, '.')}")
    return found


def test_every_package_folder_is_installed_and_every_listed_package_exists():
    config = setuptools_config()
    folders = {"hetero_ray": "hetero_ray", **config["package-dir"]}
    found = set().union(*(packages_in(folder, name) for name, folder in folders.items()))
    assert found <= set(config["packages"])
    for package in config["packages"]:  # data-only folders (the app's assets) are listed too
        top, _, rest = package.partition(".")
        assert os.path.isdir(os.path.join(REPO_ROOT, folders[top], *rest.split(".") if rest else [])), package


def test_the_app_is_imported_by_its_own_name_only():
    spec = importlib.util.find_spec("hetero_ray_dashboards")
    assert spec is not None and spec.origin == os.path.join(REPO_ROOT, "dashboards", "__init__.py")
    # The repository root is on sys.path here (as in the job scripts): the folder's name
    # must not give a second copy of the app.
    with pytest.raises(ImportError, match="imported as hetero_ray_dashboards"):
        importlib.import_module("dashboards")
