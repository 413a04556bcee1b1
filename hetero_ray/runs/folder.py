"""One run's folder as a driver opens it: resolved and locked, checked, then created whole.

The order keeps a refused run's promise that nothing is written before the last check:
:meth:`RunFolder.open` locks an existing folder before anything in it is read;
:meth:`RunFolder.check` rebuilds a resume's torn snapshot and refuses a name that holds a
run with nothing to continue; the caller's checks of the cluster come next; only then
:meth:`RunFolder.create` makes the folder (locking a new one), takes back a URI run's
tables and writes ``config.json``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from hetero_ray.errors import UserError
from hetero_ray.runs import checkpoints, run_dir, run_files, run_lock, storage

if TYPE_CHECKING:  # the front end's words for the run's settings
    from hetero_ray.runtime.job import Wording


@dataclass
class RunFolder:
    storage: storage.RunStorage
    words: Wording
    held: Optional[contextlib.ExitStack]  # keeps the lock until the driver is done with the run
    locked: bool  # the folder existed, and its lock was taken before anything was read
    # Whether fit() continues a run of this name, asked once (under the lock): with URI storage
    # the answer reads the URI, and a crashed driver's controller may still write its snapshot.
    resuming: bool = False

    @classmethod
    def open(cls, storage_path: Optional[str], name: str, output_dir: Optional[str], words: Wording,
             held: contextlib.ExitStack) -> RunFolder:
        run = storage.resolve(storage_path, name, output_dir)
        locked = os.path.isdir(run.run_dir)
        if locked:
            held.enter_context(run_lock.acquire(run.run_dir, words.locked_advice))
        return cls(run, words, held, locked, run.continues_a_run())

    @property
    def path(self) -> str:
        return self.storage.run_dir

    def check(self, emit: Callable[[str], None], own_check: Optional[Callable[[], None]] = None) -> None:
        """A resume's torn snapshot rebuilt (said); then ``own_check`` (a front end's
        refusals), or else: a folder that holds a run with no checkpoint is refused."""
        if self.resuming and self.storage.remote_run_uri is None:
            note = checkpoints.repair_torn_snapshot(self.path, self.words.start_afresh)
            if note:
                emit(note)
        if own_check is not None:
            own_check()
        elif not self.resuming and os.path.exists(os.path.join(self.path, run_files.CONFIG_FILE)):
            raise UserError(f"{self.path} already holds a run without a checkpoint to continue from; choose "
                            f"another {self.words.name_setting} (nothing was overwritten)")

    def create(self, settings: dict, emit: Callable[[str], None]) -> None:
        """The folder made (locked, if new), a URI run's tables taken back on a resume, and
        ``config.json`` written; a failure leaves nothing this call made."""
        created = run_dir.make(self.path, self.held, self.locked, self.words)
        if self.resuming and storage.take_back_tables(self.storage):
            emit(f"[hetero_ray] the run's tables were taken back from {self.storage.remote_run_uri}")
        run_dir.write_settings(self.path, settings, created, self.words)
        emit(f"[hetero_ray] run {self.storage.name}: files in {self.path}"
             + (f", copied to {self.storage.remote_run_uri} at each checkpoint" if self.storage.remote_run_uri else ""))
        if self.resuming:
            emit(f"[hetero_ray] resuming from {self.latest_checkpoint()}")

    def latest_checkpoint(self) -> str:
        """The checkpoint a resume continues from, for a person."""
        return checkpoints.describe_latest(self.path)
