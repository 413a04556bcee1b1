"""Run keys and the runs folder: which directories are runs, and where a key may lead.

A run is named by a *key*: ``offline:<path under --runs-dir>`` for a run directory, or
``live:<experiment>`` for a running experiment found through its metrics-store actor.
Keys arrive from the browser (the run list, the URL), so they are untrusted: an offline
key resolves only to a directory under ``runs_dir`` that looks like a run (no ``..``, no
absolute paths, no symlink out of the folder), and a live key only names an actor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetero_ray.runs.readers import find_runs, looks_like_run, newest_mtime, offline_status

OFFLINE = "offline:"
LIVE = "live:"
MAX_KEY_LENGTH = 512
MAX_SCAN_DEPTH = 2  # runs/<name> and runs/<group>/<name>


class RunNotFound(LookupError):
    """The key names no run that may be opened; the message says what to do."""


def resolve_run_dir(runs_dir: str, name: str) -> str:
    """The run directory ``name`` (relative to ``runs_dir``), refusing anything outside it.

    Raises:
        RunNotFound: for absolute paths, ``..`` components, symlinks leading out of
            ``runs_dir``, control characters, and directories that are not runs.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_KEY_LENGTH:
        raise RunNotFound("no run selected")
    if any(ord(c) < 32 for c in name) or "\\" in name or name.startswith(("/", "~")) or os.path.isabs(name):
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    root = os.path.realpath(runs_dir)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root or path == root:
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    if not os.path.isdir(path) or not looks_like_run(path):
        raise RunNotFound(f"no run directory {name!r} under {runs_dir}")
    return path


@dataclass(frozen=True)
class RunEntry:
    key: str
    name: str
    label: str
    live: bool
    status: str  # running | finished | failed | unknown
    mtime: float


def list_offline_runs(runs_dir: str) -> list[RunEntry]:
    """Run directories under ``runs_dir`` (two levels deep at most), newest first."""
    entries = []
    for name, real in find_runs(runs_dir, MAX_SCAN_DEPTH):
        status = offline_status(real)
        entries.append(RunEntry(OFFLINE + name, name, f"{name} ({status})", False, status, newest_mtime(real)))
    return sorted(entries, key=lambda e: e.mtime, reverse=True)
