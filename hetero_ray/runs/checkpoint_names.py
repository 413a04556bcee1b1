"""How a run's checkpoint folders are named (a user's loop's, through
:mod:`hetero_ray.training.rank.loop_report`, and the built-in job's alike), and the file in a
built-in checkpoint that says where it resumes, readable without torch."""

from __future__ import annotations

import re
from typing import Optional

POSITION_FILE = "position.json"  # readable without torch, e.g. to pick the latest checkpoint
STATE_DIR = "hetero_ray"  # a checkpoint keeps hetero_ray's files in this folder
STATE_FILE = "state.json"  # in STATE_DIR: where the run resumes (its "position") and the ranks' state
BALANCER_STATE_FILE = "balancer_state.json"  # in STATE_DIR (at the top level in older built-in runs)

# Checkpoint folders are named after the position they resume at: ``checkpoint_<global
# step>``, plus ``_<n>`` for the n-th further checkpoint at the same step (a report with
# no step trained since the last, e.g. right after a resume).
_CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)(?:_(\d+))?")


def checkpoint_dir_name(global_step: int, count: int) -> str:
    """The folder of the ``count``-th checkpoint (0, 1, …) taken at ``global_step``."""
    name = f"checkpoint_{global_step:09d}"
    return name if count == 0 else f"{name}_{count}"


def checkpoint_order(name: str) -> Optional[tuple[int, int]]:
    """(global step, count) of a checkpoint folder's name, which order the folders; None
    for a name that is not one."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2) or 0))


def next_checkpoint_count(global_step: int, taken_here: int, restored_name: Optional[str]) -> int:
    """Which count the next checkpoint at ``global_step`` takes: after the ``taken_here``
    this worker group took, and after the checkpoint it resumed from (``restored_name``).

    Counting only this group's checkpoints would give a report made right after a resume
    the very name of the checkpoint it resumed from — Ray Train's registered latest, the
    only resumable one — and Ray would copy into it: a crash during that copy tears it.
    Older checkpoints never clash: their steps are smaller, or at the same step their
    counts are smaller than the restored one's.
    """
    order = checkpoint_order(restored_name or "")
    if order is not None and order[0] == global_step:
        return max(taken_here, order[1] + 1)
    return taken_here
