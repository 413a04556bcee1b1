"""What a user reads speaks of the product, not of how it was written: the README, the
changelog, docs/, tests/, the Makefile, benchmarks/, examples/ and the rest of the
repository's own files (the package, the app, jobs/, scripts/, cluster_configs/, the
Dockerfile) name no absolute checkout path (Ray's own
paths such as /tmp/ray, and /home/ray of Ray's image, aside), no file outside the
repository, and none of the phrases of the machine it was written on. Fails naming
file:line."""

from __future__ import annotations

import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("README.md", "CHANGELOG.md", "docs", "tests", "Makefile", "benchmarks", "examples",
           "hetero_ray", "dashboards", "jobs", "scripts", "cluster_configs", "Dockerfile")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache"}

# Built from pieces so that this file does not match itself.
LEFTOVERS = {
    "an absolute checkout path": re.compile(
        r"(?<![\w.~-])(?:/" + "work/" + r"|/" + "home/" + r"(?!ray/)[\w.-]+/|/" + "Users/" + r"[\w.-]+/)"),
    "a file outside the repository": re.compile(
        r"\b" + "TESTING" + r"\.md\b|\.\./" + "shared/" + r"(?!kuberay)|(?<![\w-])\." + "gpu/" + "setup" + r"\.sh\b"),
    "a command the CLI does not have": re.compile(r"\bhetero-ray\s+" + "bench" + r"\b"),
    "how it was written": re.compile(
        r"\b" + "this" + r"\s+" + "work" + r"\b|\b" + "lo" + "an" + r"(?:s|ed)?\b|\b" + "development" + r"\s+VM\b",
        re.IGNORECASE),
}


def scanned_files(root: str = REPO_ROOT) -> list[str]:
    files = []
    for name in SCANNED:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            files.append(path)
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            files += [os.path.join(folder, n) for n in sorted(names)]
    return files


def leftovers(path: str, root: str = REPO_ROOT) -> list[str]:
    """``file:line: what (the text)`` for each leftover in a text file; nothing for a binary one."""
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in LEFTOVERS.items():
            for match in pattern.finditer(line):
                found.append(f"{os.path.relpath(path, root)}:{number}: {what} ({match.group(0)!r})")
    return found


def test_the_scan_reaches_every_place():
    names = {os.path.relpath(p, REPO_ROOT) for p in scanned_files()}
    assert {"README.md", "Makefile", "docs/benchmarks.md", "docs/clusters.md", "benchmarks/gpu_check.py",
            "examples/own_model.py", "tests/test_dashboard_browser.py"} <= names


def test_nothing_left_over():
    found = [line for path in scanned_files() for line in leftovers(path)]
    assert not found, "say what the product does, not where or how it was written:\n" + "\n".join(found)


@pytest.mark.parametrize("text", [
    "see /" + "wo" + "rk/main/README.md", "cd /" + "home/" + "alice/src/hetero_ray",
    "/" + "Users/" + "bob/hetero_ray", "recipe: " + "TESTING" + ".md", "bring it from ../" + "shared/" + "gpu/",
    "no GPU was available to " + "this" + " work", "a short " + "lo" + "an" + " of a GPU machine",
    "during it: the " + "development" + " VM", "run ." + "gpu/" + "setup.sh first", "hetero-ray " + "bench --json x",
])
def test_a_leftover_is_found(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n" + text + "\n")
    assert [line.split(":")[:2] for line in leftovers(str(page), str(tmp_path))] == [["page.md", "3"]]


@pytest.mark.parametrize("text", [
    "Ray's logs are under /tmp/ray/session_latest", "the image's working directory /" + "home/ray/hetero_ray",
    "the checkpoint " + "this" + " worker group resumes from", "--storage-path /shared/runs",
    "the CRDs in ../" + "shared/" + "kuberay/ beside the clone", "~/work/data", "jobs/bench_balance.py",
    "make bench", "hetero-ray benchmarks", "the nvidia.gpu/setup.shx label",
])
def test_what_is_no_leftover(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text + "\n")
    assert leftovers(str(page), str(tmp_path)) == []
