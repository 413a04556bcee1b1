"""Run directories on disk: which folders under a runs folder are runs, a run's status, and
its files, read only where their real path lies inside it.

The files of a run directory are untrusted (anyone who can write there can plant a
symlink): a file is read only if its real path lies inside that run directory; one that
leads out of it is ignored, and :func:`escaping_links` names it (the app shows it as the run's notice).
Only JSON is read here; nothing read is ever executed or unpickled.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Optional

from hetero_ray.runs import run_files

RUNNING_IF_WRITTEN_WITHIN_S = 30.0  # an unfinished run dir written to this recently is "running"
_RUN_MARKERS = (run_files.CONFIG_FILE, run_files.SUMMARY_FILE, "steps.parquet", run_files.PARTS_DIR)


def looks_like_run(path: str) -> bool:
    """Whether ``path`` holds any of the files a run writes first."""
    return any(os.path.exists(os.path.join(path, marker)) for marker in _RUN_MARKERS)


def inside(run_dir: str, path: str) -> Optional[str]:
    """The real path of ``path`` when it lies inside ``run_dir``, else None."""
    root = os.path.realpath(run_dir)
    real = os.path.realpath(path)
    return real if os.path.commonpath([root, real]) == root else None


def read_run_json(run_dir: str, filename: str, default: Any = None) -> Any:
    """A JSON file of the run, or ``default`` when it is absent or leads out of the run."""
    real = inside(run_dir, os.path.join(run_dir, filename))
    return default if real is None else run_files.read_json(real, default)


def attempt_starts(run_dir: str) -> dict[int, int]:
    """:func:`hetero_ray.runs.run_files.attempt_starts`, through :func:`read_run_json`."""
    attempts = read_run_json(run_dir, run_files.ATTEMPTS_FILE, []) or []
    return {int(a["attempt"]): int(a["start_global_step"]) for a in attempts}


def escaping_links(run_dir: str) -> list[str]:
    """Entries of the run (its files, its parts folders and their files) that are symlinks
    leading out of it, relative to ``run_dir``: what the app ignored."""
    found = []

    def scan(directory: str, depth: int) -> None:
        for entry in _entries(directory):
            if entry.is_symlink():
                if inside(run_dir, entry.path) is None:
                    found.append(os.path.relpath(entry.path, run_dir).replace(os.sep, "/"))
            elif entry.is_dir() and ((depth == 0 and entry.name == run_files.PARTS_DIR) or depth == 1):
                scan(entry.path, depth + 1)  # parts/, then parts/<table>/

    scan(run_dir, 0)
    return found


def _entries(directory: str) -> list[os.DirEntry]:
    """A folder's entries by name; none where it cannot be listed (gone, or not readable)."""
    try:
        return sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return []


_NOT_RUN_FOLDERS = {run_files.PARTS_DIR, "ray_train", "__pycache__"}  # inside a run, or no run at all


def find_runs(runs_dir: str, max_depth: int) -> list[tuple[str, str]]:
    """``(name, real path)`` of each run directory under ``runs_dir``, ``max_depth`` levels
    deep at most (``runs/<name>`` is 1), its name relative to ``runs_dir`` with ``/``;
    hidden folders and symlinks leading out of ``runs_dir`` are skipped."""
    root = os.path.realpath(runs_dir)
    found: list[tuple[str, str]] = []

    def scan(directory: str, depth: int) -> None:
        for child in _entries(directory):
            if child.name.startswith(".") or child.name in _NOT_RUN_FOLDERS or not child.is_dir():
                continue
            real = os.path.realpath(child.path)
            if os.path.commonpath([root, real]) != root:
                continue  # a symlink out of the runs folder
            if looks_like_run(real):
                found.append((os.path.relpath(child.path, root).replace(os.sep, "/"), real))
            elif depth < max_depth:
                scan(child.path, depth + 1)

    if os.path.isdir(root):
        scan(root, 1)
    return found


def file_signature(run_dir: str, path: str) -> Optional[tuple[int, int]]:
    """(mtime in ns, size) of a file of the run; None when absent or leading out of the run."""
    real = inside(run_dir, path)
    if real is None:
        return None
    try:
        st = os.stat(real)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def newest_mtime(run_dir: str) -> float:
    """Newest modification time of the run's files (parts included)."""
    paths = [run_dir, *glob.glob(os.path.join(run_dir, "*")),
             *glob.glob(os.path.join(run_dir, run_files.PARTS_DIR, "*"))]
    signatures = [file_signature(run_dir, path) for path in paths]
    return max((sig[0] / 1e9 for sig in signatures if sig is not None), default=0.0)


def offline_status(run_dir: str, now: Optional[float] = None) -> str:
    """The summary's status; without one, running while its files are being written, else unfinished."""
    summary = read_run_json(run_dir, run_files.SUMMARY_FILE)
    if isinstance(summary, dict) and summary.get("status"):
        return str(summary["status"])
    now = time.time() if now is None else now
    return "running" if now - newest_mtime(run_dir) <= RUNNING_IF_WRITTEN_WITHIN_S else "unfinished"
