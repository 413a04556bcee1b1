"""The README's install, as a Ray Train user does it: build the wheel from a copy of the
checkout, install it into a fresh virtual environment that already holds Ray and torch,
and check that ``pip check`` is clean, ``hetero-ray --help`` answers and the public API
imports — from the installed wheel, not from the checkout.

No network: the wheel is built with the running environment's setuptools
(``--no-build-isolation``; torch and dash require setuptools, so any environment that runs
hetero_ray has it), and installed with ``--no-deps --no-index``. The fresh environment
sees Ray, torch and the rest through a ``.pth`` line naming this environment's
site-packages (copying torch would take gigabytes), so what it adds is the wheel alone.
A ``.pth`` line only puts that folder on ``sys.path``: the ``.pth`` files inside it (an
editable install of this checkout, for one) are not run, so the import below can only
come from the wheel. About 10 s.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Not part of a clean clone, and never packaged: left out of the copy that is built.
LEFT_OUT_AT_ROOT = {".git", ".venv", ".venv-torch-oldest", "build", "dist", "runs", "data", "test-artifacts",
                    ".pytest_cache", ".import_linter_cache", ".whl"}

IMPORTS = """
import importlib, os, sys
import hetero_ray, hetero_ray.errors, hetero_ray.train, hetero_ray_dashboards
site = os.path.realpath(sys.argv[1])
for module in (hetero_ray, hetero_ray_dashboards):
    assert os.path.realpath(module.__file__).startswith(site), (module.__name__, module.__file__, site)
missing = [name for module in (hetero_ray, hetero_ray.errors) for name in module.__all__ if not hasattr(module, name)]
assert not missing, missing
print("public API:", ", ".join(hetero_ray.__all__))
"""


def _copy_ignoring(directory: str, names: list[str]) -> set[str]:
    left_out = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if os.path.samefile(directory, REPO_ROOT):
        left_out |= LEFT_OUT_AT_ROOT & set(names)
    return left_out


def _run(*command: str, cwd: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_into_an_environment_that_has_ray_and_torch(tmp_path):
    source = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT, source, ignore=_copy_ignoring)
    pip = (sys.executable, "-m", "pip")
    _run(*pip, "wheel", "--no-build-isolation", "--no-deps", "--no-index", "--quiet", "-w", str(tmp_path / "dist"),
         str(source), cwd=str(tmp_path))
    [wheel] = glob.glob(str(tmp_path / "dist" / "hetero_ray-*.whl"))

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=str(tmp_path))
    python = str(venv / "bin" / "python")
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=str(tmp_path)).strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "ray_and_torch.pth"), "w") as f:
        f.write("".join(f"{path}\n" for path in sorted(ours)))

    _run(*pip, "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel, cwd=str(tmp_path))
    assert "No broken requirements found" in _run(*pip, "--python", python, "check", cwd=str(tmp_path))
    usage = _run(str(venv / "bin" / "hetero-ray"), "--help", cwd=str(tmp_path))
    for command in ("train", "profile", "plan", "dashboard", "report"):
        assert command in usage
    assert "HeteroTrainer" in _run(python, "-c", IMPORTS, site, cwd=str(tmp_path))
    assert glob.glob(os.path.join(site, "hetero_ray_dashboards", "assets", "*.css")), "the app's stylesheet"
