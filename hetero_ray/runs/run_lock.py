"""One driver per run directory.

Two drivers on one run directory (a ``--resume`` of a run that is still going, a second
``fit()`` under the same name and storage in another process) would each start a metrics
store on the same files, rewrite ``config.json`` and restore from checkpoints the other
rotates away. The name check of :mod:`hetero_ray.runtime.actors` cannot see a run on
another Ray cluster (every run without ``--address`` starts its own local one), so the
run directory itself is locked.

The lock is ``flock`` on a file in the run directory, held open for the driver's
lifetime: the kernel drops it when the process ends however it ends (a crash, SIGKILL),
so a crashed driver never leaves a run stuck, and no stale-lock rule is needed. Linux
NFS clients carry ``flock`` as a byte-range lock to the server, so it holds across the
nodes of a shared filesystem too. The file records who holds it (pid, host, start
time, command), for the message a refused driver shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from typing import Optional

from hetero_ray.errors import UserError

LOCK_FILE = ".hetero_ray.lock"  # in the run directory; it stays after the run (removing it would race)


class RunDirLock:
    """The run directory's lock, held from :func:`acquire` until :meth:`release`."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: Optional[int] = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(run_dir: str, what_to_do: str) -> RunDirLock:
    """Locks ``run_dir`` (which exists) for this process.

    Args:
        what_to_do: the end of the refusal's message: how this caller continues or
            starts afresh (``--resume`` / ``--name``, or ``fit()`` / ``RunConfig(name=...)``).

    Raises:
        UserError: another live process holds it; the message names it (pid, host) and
            says what to do. Nothing else was written.
    """
    path = os.path.join(run_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise UserError(f"{run_dir} is in use by another hetero_ray driver ({describe_holder(holder)}): two drivers "
                        "on one run directory overwrite each other's tables and checkpoints, so this one stops "
                        f"here (nothing was written). {what_to_do}") from None
    except BaseException:
        os.close(fd)
        raise
    _write_holder(fd)
    return RunDirLock(path, fd)


def describe_holder(holder: Optional[dict]) -> str:
    """``pid 4242 on host gpu-1, since 09:12:03 UTC: hetero-ray train …``, from what the lock file says."""
    if not holder:
        return "a process that has not said who it is yet"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"])) if holder.get("started") else "?"
    text = f"pid {holder.get('pid')} on host {holder.get('host')}, since {since}"
    return text + (f": {holder['command']}" if holder.get("command") else "")


def _write_holder(fd: int) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)


def _read_holder(fd: int) -> Optional[dict]:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None
