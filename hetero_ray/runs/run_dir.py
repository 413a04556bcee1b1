"""Creating a run directory and its ``config.json``: whole, locked, or not there at all.

A full disk or a read-only folder met here leaves nothing behind: the folder, if this call
created it, is removed again, so a second try starts as the first did. Every check that
can refuse a run comes before this (nothing is written before the last of them).
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from hetero_ray.errors import UserError
from hetero_ray.runs import run_files, run_lock
from hetero_ray.runs.writer import is_disk_full

if TYPE_CHECKING:  # the front end's words for the run's settings
    from hetero_ray.runtime.job import Wording


def make(run_dir: str, held: contextlib.ExitStack, locked: bool, words: Wording) -> bool:
    """Creates ``run_dir``; unless ``locked`` (it existed, and its lock was taken first),
    takes its lock as it creates it, and ``held`` keeps the lock. Returns whether this
    call created the folder (:func:`write_settings` removes it again on failure)."""
    created = not os.path.isdir(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=locked)
    except FileExistsError:  # another driver created it since the checks: say which, if it runs
        run_lock.acquire(run_dir, words.locked_advice).release()
        raise UserError(f"run directory {run_dir} appeared since the checks, made by another driver; choose "
                        f"another {words.name_setting} (nothing was overwritten)") from None
    except OSError as e:
        raise _cannot_write(run_dir, e, words) from None
    if not locked:
        held.enter_context(run_lock.acquire(run_dir, words.locked_advice))
    return created


def write_settings(run_dir: str, settings: dict, created: bool, words: Wording) -> None:
    """Writes ``config.json`` (whole, or not at all); a failure removes the folder again
    if :func:`make` created it."""
    try:
        run_files.write_json(os.path.join(run_dir, run_files.CONFIG_FILE), settings)
    except OSError as e:
        if created:
            _remove_quietly(os.path.join(run_dir, run_lock.LOCK_FILE))
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)
        raise _cannot_write(run_dir, e, words) from None


def _cannot_write(run_dir: str, error: OSError, words: Wording) -> UserError:
    what = "disk full" if is_disk_full(error) else (error.strerror or str(error))
    return UserError(f"cannot write {os.path.join(run_dir, run_files.CONFIG_FILE)} ({what}); free space or choose "
                     f"another {words.storage_setting} (nothing was written)")


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
