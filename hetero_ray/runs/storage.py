"""Where a HeteroTrainer run keeps its files: Ray Train's and hetero_ray's.

Ray Train writes checkpoints to ``RunConfig.storage_path / RunConfig.name``: a local or
shared-filesystem path, or any URI ``pyarrow.fs`` understands (``s3://``, ``gs://``,
``file://``). hetero_ray's tables (steps, plans, decisions, … as Parquet, summary.json)
are written while the run goes by a metrics store on the driver's node, so they need a
local folder:

- a plain path: the same folder as Ray Train's (``<storage>/<name>``), checkpoints beside
  the tables;
- a URI: a local folder ``<output_dir>/<name>`` during the run, copied to
  ``<storage>/<name>`` before every checkpoint is reported and at the end with ``pyarrow.fs``, and
  copied back by a resume on a machine that lacks them (:mod:`hetero_ray.runs.remote_copy`;
  every URI takes this path, so a ``file://`` URI tests what ``s3://`` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from hetero_ray.errors import UserError
from hetero_ray.runs import remote_copy
from hetero_ray.runs.checkpoints import RAY_CHECKPOINT_SNAPSHOT
from hetero_ray.runs.run_files import ATTEMPTS_FILE

RAY_DEFAULT_STORAGE = "~/ray_results"  # Ray Train's own default
DEFAULT_URI_OUTPUT_DIR = "~/hetero_ray/runs"


@dataclass(frozen=True)
class RunStorage:
    name: str
    storage_path: str  # what Ray Train is given
    run_dir: str  # local folder of hetero_ray's tables
    remote_run_uri: Optional[str] = None  # where the tables are copied with each checkpoint (URI storage)

    def continues_a_run(self) -> bool:
        """fit() continues a run of this name: Ray Train has its snapshot, or (URI storage)
        the URI holds the run's tables. They reach the URI only with a checkpoint, and a
        crashed driver's Ray Train controller can write its snapshot a moment after a new
        fit() looked: Ray then resumed while the tables, not taken back, were overwritten by
        the resumed run's."""
        return self.has_ray_snapshot() or (self.remote_run_uri is not None
                                           and remote_copy.holds_file(self.remote_run_uri, ATTEMPTS_FILE))

    def has_ray_snapshot(self) -> bool:
        """Ray Train restores a run with this name from its snapshot (a resume)."""
        if self.remote_run_uri is None:
            return os.path.exists(os.path.join(self.run_dir, RAY_CHECKPOINT_SNAPSHOT))
        return remote_copy.holds_file(self.remote_run_uri, RAY_CHECKPOINT_SNAPSHOT)


def upload(run_dir: str, remote_run_uri: str) -> None:
    """Copies the run's tables from ``run_dir`` next to Ray Train's files at ``remote_run_uri``."""
    remote_copy.upload_tables(run_dir, remote_run_uri)


def take_back_tables(run: RunStorage) -> list[str]:
    """A resume from URI storage on a machine without the run's tables (another driver's
    machine, or one whose local folder was lost): copies them from the URI first, so the
    run continues its tables instead of overwriting them. Returns what was copied."""
    if run.remote_run_uri is None or os.path.exists(os.path.join(run.run_dir, ATTEMPTS_FILE)):
        return []
    return remote_copy.download_tables(run.remote_run_uri, run.run_dir)


def resolve(storage_path: Optional[str], name: str, output_dir: Optional[str]) -> RunStorage:
    storage_path = storage_path or os.path.expanduser(RAY_DEFAULT_STORAGE)
    if "://" not in storage_path:
        storage_path = os.path.abspath(os.path.expanduser(storage_path))
        return RunStorage(name, storage_path, os.path.join(storage_path, name))
    import pyarrow.fs

    try:
        pyarrow.fs.FileSystem.from_uri(storage_path)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, OSError) as e:
        raise UserError(f"RunConfig(storage_path={storage_path!r}) is not a URI pyarrow.fs can open ({e}); "
                        "use a local or shared path, or a URI such as s3://bucket/prefix") from None
    local = os.path.abspath(os.path.expanduser(output_dir or DEFAULT_URI_OUTPUT_DIR))
    return RunStorage(name, storage_path, os.path.join(local, name), storage_path.rstrip("/") + "/" + name)
