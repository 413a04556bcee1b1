"""The run's tables beside Ray Train's files on URI storage (``s3://``, ``gs://``, ``file://``).

The metrics store writes the tables to a local folder while the run goes (Parquet parts
need a filesystem); Ray Train writes its checkpoints straight to the URI. Copied there only
at the end, a driver that crashed left the URI with checkpoints and no tables, and a later
``fit()`` on another machine resumed from the checkpoint with empty tables and overwrote the
URI's at its end: every step before the crash was gone. So the tables go ahead of each
checkpoint (:func:`upload_tables`, from the store once the checkpoint's rows are in and
before the checkpoint is reported: copied after, a crash in between left a registered
checkpoint past the steps the URI's tables held), and a resume on a machine without them
first takes them back (:func:`download_tables`).
"""

from __future__ import annotations

import os

# Ray Train's own entries in the run's folder (checkpoint_<…> folders, its
# checkpoint_manager_snapshot.json) and hidden files (Ray's storage marker, one machine's
# driver lock, which means nothing on another) are not tables.
RAY_TRAIN_PREFIX = "checkpoint_"
UPLOADING_SUFFIX = ".uploading"  # a file on its way to the URI (see _copy_whole)


def _is_table(name: str) -> bool:
    return not (name.startswith(RAY_TRAIN_PREFIX) or name.startswith(".") or name.endswith(UPLOADING_SUFFIX))


def upload_tables(run_dir: str, remote_run_uri: str) -> None:
    """Copies the run's tables (everything in ``run_dir`` but hidden files) to ``remote_run_uri``."""
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(remote_run_uri)
    filesystem.create_dir(path, recursive=True)
    local = set()
    for name in sorted(os.listdir(run_dir)):
        if _is_table(name):
            files = _relative_files(os.path.join(run_dir, name), name)
            for relative in sorted(files):
                _copy_whole(os.path.join(run_dir, relative), filesystem, f"{path}/{relative}")
            local.update(files)
    # Then what the local folder no longer has: parts merged into their table since the
    # last copy would otherwise be read a second time beside it (and what a crashed copy
    # left half-written under its temporary name). Copied first, pruned after: a copy cut
    # short by a crash never leaves the URI with fewer rows than before.
    for entry in filesystem.get_file_info(pyarrow.fs.FileSelector(path, recursive=True)):
        relative = entry.path[len(path):].lstrip("/")
        if entry.type == pyarrow.fs.FileType.File and relative not in local and (
                _is_table(relative.split("/")[0]) or relative.endswith(UPLOADING_SUFFIX)):
            filesystem.delete_file(entry.path)


def _copy_whole(local_file: str, filesystem, remote_path: str) -> None:
    """Copies one file so that ``remote_path`` is always whole: written under a temporary
    name, then moved over it. A table overwritten in place and cut off by a crash lost every
    row merged into it (the parts it replaced were already pruned)."""
    import pyarrow.fs

    temporary = remote_path + UPLOADING_SUFFIX
    filesystem.create_dir(remote_path.rsplit("/", 1)[0], recursive=True)
    pyarrow.fs.copy_files(local_file, temporary, destination_filesystem=filesystem)
    filesystem.move(temporary, remote_path)


def _relative_files(path: str, name: str) -> set[str]:
    if not os.path.isdir(path):
        return {name}
    return {os.path.relpath(os.path.join(folder, f), os.path.dirname(path))
            for folder, _, files in os.walk(path) for f in files}


def download_tables(remote_run_uri: str, run_dir: str) -> list[str]:
    """Copies the tables at ``remote_run_uri`` (not Ray Train's checkpoints) into ``run_dir``;
    returns the names copied (none when the URI holds no tables yet)."""
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(remote_run_uri)
    entries = filesystem.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    copied = []
    os.makedirs(run_dir, exist_ok=True)
    for entry in entries:
        if _is_table(entry.base_name):
            pyarrow.fs.copy_files(entry.path, os.path.join(run_dir, entry.base_name), source_filesystem=filesystem)
            copied.append(entry.base_name)
    return sorted(copied)


def holds_file(remote_run_uri: str, name: str) -> bool:
    """Whether the run's folder at ``remote_run_uri`` holds ``name`` (a table's file, or Ray
    Train's snapshot)."""
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(remote_run_uri)
    return filesystem.get_file_info(f"{path}/{name}").type != pyarrow.fs.FileType.NotFound
