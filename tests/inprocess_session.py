"""A hetero_ray worker session inside a plain process of a real gloo group, without Ray:
the worker-side API (``hetero_ray.train``) runs exactly as in a run, with the run's
actors answered in-process.

- :class:`ScriptedPlanner` answers ``plan_for`` like the planner actor, from a script of
  plans by global step (what the planner decides is tested elsewhere; here, what the
  ranks do with any sequence of plans);
- :class:`RecordingStore` keeps what the metrics store would: step rows, sample ids;
- :class:`LocalRayTrain` stands in for Ray Train's worker API (``report``,
  ``get_checkpoint``, ``get_context``): each checkpoint a rank passes is copied into
  ``storage/<checkpoint name>/rank<r>/``, as Ray Train uploads it, so a test sees every
  rank's upload, whichever one Ray Train would keep.

:func:`run_in_session` makes the session (as ``training.session.start`` does, minus Ray)
and runs the user's loop in it; :func:`run_cases_on_ranks` runs a list of cases, each
through its own sessions, on the ranks of one gloo group (spawning costs more than a case).
"""

from __future__ import annotations

import gc
import os
import shutil
from typing import Any, Callable, Optional

import torch

from hetero_ray.planning.plan import Plan
from hetero_ray.training.rank import session as session_module
from hetero_ray.training.rank.identity import WorkerIdentity
from hetero_ray.training.rank.recorder import StepRecorder
from hetero_ray.training.rank.rejoin import Groups
from hetero_ray.training.rank.session import WorkerSession, WorkerSettings


class Handle:
    """An in-process object behind an actor handle's interface: ``handle.method.remote(...)``
    calls the method at once and returns its value (see hetero_ray/training/rank/answers.py)."""

    def __init__(self, target: Any):
        self._target = target

    def __getattr__(self, name: str):
        method = getattr(self._target, name)

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                return method(*args, **kwargs)

        return _Method


class ScriptedPlanner:
    """``plans``: {first global step: local batch sizes, or (sizes, probe sizes)}; each
    entry is a new plan version. ``memory_caps``: every rank's cap, or None.
    ``check_after_steps``: {first global step: the plan's Plan.check_after_steps}."""

    def __init__(self, plans: dict[int, Any], memory_caps: Optional[list[int]] = None,
                 check_after_steps: Optional[dict[int, int]] = None):
        self._entries = sorted(plans.items())
        self._memory_caps = memory_caps
        self._check_after_steps = check_after_steps or {}
        self.asked_at: list[int] = []  # the global steps plans were asked for

    def plan_for(self, num_workers, global_step, ranks=None, wait_for_capabilities=False, micro_batches=False):
        self.asked_at.append(global_step)
        version, (first, entry) = max((i, e) for i, e in enumerate(self._entries) if e[0] <= global_step)
        sizes, probes = entry if isinstance(entry[0], (tuple, list)) else (entry, ())
        reply = Plan(version, tuple(sizes), f"script {version}", tuple(probes),
                     self._check_after_steps.get(first, 0)).to_dict()
        if self._memory_caps is not None:
            reply["memory_caps"] = list(self._memory_caps)
        return reply

    def checkpoint_state(self) -> dict:
        return {}

    def __getattr__(self, name: str):  # resume_from, begin_attempt, add_steps: nothing to keep
        return lambda *args, **kwargs: None


class RecordingStore:
    def __init__(self):
        self.steps: list[dict] = []
        self.sample_ids: list[dict] = []
        self.plans: list[dict] = []

    def add(self, steps=(), sample_ids=()):
        self.steps.extend(steps)
        self.sample_ids.extend(sample_ids)

    def add_plan(self, row: dict) -> None:
        self.plans.append(row)

    def __getattr__(self, name: str):  # add_report, register_worker: not needed here
        return lambda *args, **kwargs: None


class _Context:
    def __init__(self, rank: int, num_workers: int):
        self._rank, self._num_workers = rank, num_workers

    def get_world_rank(self) -> int:
        return self._rank

    def get_world_size(self) -> int:
        return self._num_workers

    def get_local_rank(self) -> int:
        return self._rank


class LocalRayTrain:
    """Ray Train's worker API for an in-process session (see the module docstring)."""

    def __init__(self, rank: int, num_workers: int, storage: str, restored: Optional[str] = None):
        self.rank, self.storage, self.restored = rank, storage, restored
        self.context = _Context(rank, num_workers)
        self.reports: list[dict] = []

    def report(self, metrics: dict, checkpoint=None, checkpoint_dir_name: Optional[str] = None) -> None:
        upload = None
        if checkpoint is not None:
            upload = os.path.join(self.storage, checkpoint_dir_name, f"rank{self.rank}")
            shutil.copytree(checkpoint.path, upload)
        self.reports.append({"metrics": dict(metrics), "checkpoint": upload, "name": checkpoint_dir_name})

    def get_checkpoint(self):
        import ray.train

        return None if self.restored is None else ray.train.Checkpoint.from_directory(self.restored)

    def get_context(self):
        return self.context


def train_linear(data) -> list[int]:
    """A user's loop in small: a linear model trained by SGD on ``data`` (a dataset or a
    DataLoader over one) through the worker-side API; returns each step's batch length."""
    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 2))
    loader = hetero_ray.train.prepare_data_loader(data)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for (x,) in loader:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(len(x))
    return seen


def run_in_session(loop: Callable[[dict], Any], config: dict, *, rank: int, num_workers: int, global_batch_size: int,
                   planner: ScriptedPlanner, storage: str, seed: int = 0, restored_checkpoint: Optional[str] = None,
                   data_feeds: Optional[dict] = None, rebalance_interval: int = 1):
    """Runs ``loop(config)`` as ``train_loop_per_worker`` on this rank of the gloo group;
    returns (what it returned, the store, the Ray Train stand-in). ``data_feeds``: the
    feeds of ``get_dataset_shard`` by dataset name (actor handles); ``rebalance_interval``:
    1 asks for a plan at every step, so a script's plan starts where it says."""
    from hetero_ray.training.rank.loop_report import read_state

    settings = WorkerSettings(experiment_name="in-process", global_batch_size=global_batch_size, seed=seed,
                              rebalance_interval=rebalance_interval, device_mode="cpu", record_sample_ids=True,
                              data_feeds=list(data_feeds or ()))
    identity = WorkerIdentity(
        rank=rank, num_workers=num_workers, local_rank=rank, device=torch.device("cpu"), node_id=f"node-{rank}",
        attempt=0, rank_node_ids=tuple(f"node-{r}" for r in range(num_workers)),
        rank_device_kinds=("cpu",) * num_workers, rank_cpu_cores=(1,) * num_workers,
        rank_cpus=({"threads": 1, "quota_cores": None},) * num_workers)
    store = RecordingStore()
    ray_train = LocalRayTrain(rank, num_workers, storage, restored_checkpoint)
    restored = read_state(ray_train.get_checkpoint()) if restored_checkpoint else None
    session = WorkerSession(settings=settings, identity=identity, store=Handle(store), planner=Handle(planner),
                            recorder=StepRecorder(Handle(store), 0.0, extra_sinks=[Handle(planner)]),
                            restored=restored, groups=Groups(num_workers), ray_train=ray_train,
                            data_feeds=dict(data_feeds or {}))
    session_module._CURRENT = session
    try:
        result = loop(config)
    finally:
        session_module.stop()
    return result, store, ray_train


def run_cases_on_ranks(run_case: Callable[[dict, int, str], dict], cases: list[dict], name_of: Callable[[dict], str],
                       num_workers: int, out_dir: str) -> list[dict]:
    """Every case on ``num_workers`` ranks of one real gloo group (``tests.helpers.on_gloo_ranks``),
    in order; returns each rank's ``{case name: run_case(case, rank, case folder)}``. A case
    that raises on a rank stops the run there (the group's collectives are out of step after
    it), named in the error."""
    from tests.helpers import on_gloo_ranks

    return on_gloo_ranks(_run_cases, num_workers, run_case, cases, name_of, out_dir)


def _run_cases(rank: int, num_workers: int, run_case, cases, name_of, out_dir: str) -> dict:
    results = {}
    for case in cases:
        name = name_of(case)
        try:
            results[name] = run_case(case, rank, os.path.join(out_dir, name))
        except Exception as error:
            raise RuntimeError(f"case {name!r} failed on rank {rank}") from error
        gc.collect()  # a case's optimisers and scalers must not be found by the next one's copy
    return results
