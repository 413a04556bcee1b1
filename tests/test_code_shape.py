"""The code stays readable in one sitting: no module of the package or the app over 600
lines, no function over 80 (STYLE.md: small files with one job, functions cut into named
steps). A module or function past its limit is named with its length."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("hetero_ray", "dashboards")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[pathlib.Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_packages_have_modules_to_check():
    assert len(_modules()) > 100


def test_no_module_is_over_its_limit():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_no_function_is_over_its_limit():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = length
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (cut them into named steps): {long}"


def test_no_test_module_imports_another():
    """What tests share lives in helper modules (tests/helpers.py and the like): importing a
    test module runs its module-level set-up and ties two files' tests together."""
    tests = ROOT / "tests"
    found = {}
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            imported = [n for n in names if n.split(".")[:2][-1].startswith("test_") and n.startswith("tests.")]
            if imported:
                found.setdefault(path.name, []).extend(imported)
    assert not found, f"test modules that import another: {found}"
