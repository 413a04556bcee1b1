"""The package's import graph: no module imports itself back through others, and the
installed code needs nothing of the checkout's benchmarks/, jobs/ or tests/.

`lint-imports` (pyproject.toml) checks the layers and the cycles between siblings; a
cycle through a package's ``__init__`` and one of its own modules is no sibling cycle, so
the module graph is checked here too."""

from __future__ import annotations

import os
import subprocess
import sys

import grimp

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("hetero_ray", "hetero_ray_dashboards")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected parts with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in graph.modules or imported.split(".")[0] not in PACKAGES:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            part = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == module:
                    break
            if len(part) > 1:
                cycles.append(sorted(part))

    for module in sorted(m for m in graph.modules if m.split(".")[0] in PACKAGES):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_back():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)  # a cache misses moved files
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_packages_init():
    graph = grimp.ImportGraph()
    for importer, imported in (("hetero_ray.train", "hetero_ray.train.huggingface"),
                               ("hetero_ray.train.huggingface", "hetero_ray.train"),
                               ("hetero_ray.train", "hetero_ray.errors")):
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["hetero_ray.train", "hetero_ray.train.huggingface"]]


# Imports every module of the installed package and the app while benchmarks/, jobs/ and
# tests/ cannot be imported (the checkout's root is on sys.path here, as in the job scripts).
_IMPORT_ALL = """
import importlib, pkgutil, sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("benchmarks", "jobs", "tests"):
            raise ImportError(f"the installed package imported {name}")
        return None

sys.meta_path.insert(0, Refuse())
imported = []
for top in ("hetero_ray", "hetero_ray_dashboards"):
    package = importlib.import_module(top)
    imported.append(top)
    for module in pkgutil.walk_packages(package.__path__, top + "."):
        if module.name.endswith(".__main__"):  # runs the command when imported
            continue
        importlib.import_module(module.name)
        imported.append(module.name)
print(" ".join(imported))
"""


def test_the_installed_package_imports_nothing_from_the_checkouts_scripts():
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = grimp.build_graph(*PACKAGES, cache_dir=None).modules
    assert set(done.stdout.split()) == {m for m in modules if not m.endswith(".__main__")}  # every one of them


def test_the_configuration_from_hetero_ray_train_walks_down_the_layers(capsys):
    """From the flags to the TorchTrainer, no call climbs back up the layers
    (scripts/config_walk.py traces it)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "scripts"))
    try:
        import config_walk
    finally:
        sys.path.remove(os.path.join(REPO_ROOT, "scripts"))
    code = config_walk.main(["--model", "mlp", "--num-workers", "2", "--worker-devices", "gpu,cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hetero_ray.trainer" in out and "hetero_ray.builtin.driver" in out, out
