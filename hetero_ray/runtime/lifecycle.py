"""One run from its actors to its finished files: the part that ``hetero-ray train``
(:mod:`hetero_ray.builtin.driver`) and ``HeteroTrainer.fit()`` share.

The caller has done every check and created the run directory; :func:`run_lifecycle`
then starts the metrics store and the planner, profiles the nodes (if asked), runs Ray
Train with a progress line, and — however training ended: finished, failed, stopped by
Ctrl-C or SIGTERM — writes the run's files (:func:`hetero_ray.runtime.finishing.finish_run`),
kills the actors, copies the files to URI storage, and puts the signal handlers back.
Only then does it raise the failure or the interruption.

What differs between the two callers comes in as values (:class:`RunSpec`), and as the
callable that builds the ``TorchTrainer`` once the first plan's wait is known.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import ray

from hetero_ray.constants import (
    DEFAULT_PROGRESS_INTERVAL_S, METRICS_STORE_ROLE, PLANNER_ROLE, PROGRESS_INTERVAL_S_ENV_VAR, actor_name, env_float,
)
from hetero_ray.errors import RunInterrupted
from hetero_ray.profiling.profile_config import ProfileConfig
from hetero_ray.runs import storage
from hetero_ray.runtime import actors
from hetero_ray.runtime.finishing import Outcome, finish_run
from hetero_ray.runtime.interrupts import SIGNAL_NAMES, StopSignals
from hetero_ray.runtime.node_profiling import NodeProfiling
from hetero_ray.runtime.progress import ProgressPrinter


@dataclass(frozen=True)
class ProfilingSpec:
    """How to profile the nodes for the first plan (see :class:`NodeProfiling`)."""

    config: ProfileConfig  # its model: a ProfileModel, the user's or a built-in model's recipe
    uses_gpus: bool  # the nodes with GPUs are then profiled before the workers' start, the others after the first plan


@dataclass(frozen=True)
class RunSpec:
    """One run, as the lifecycle needs it; the caller's checks are behind it."""

    experiment_name: str
    run_dir: str  # exists, with config.json in it
    planner_settings: dict[str, Any]  # the Planner's arguments (hetero_ray.planning.planner.Planner)
    summary_base: dict[str, Any]  # summary.json's fields that describe the job, not its outcome
    interruption: Callable[[int, dict[str, Any]], RunInterrupted]  # (signal, summary) → what to raise
    profiling: Optional[ProfilingSpec] = None
    total_steps: Optional[int] = None  # for the progress line's "of N"; None when unknown
    # Reads the trained model's state from the last checkpoint's directory, saved as the
    # run's model file (the built-in job); None: a user's loop keeps its own checkpoints.
    final_model: Optional[Callable[[str], Any]] = None
    remote_run_uri: Optional[str] = None  # URI storage: the tables are copied there (each checkpoint, the end)
    data_feeds: Optional[dict[str, Any]] = None  # Ray Data datasets that follow the plan, by name (runtime/ray_data.py)


class Finished(NamedTuple):
    result: Any  # Ray Train's Result
    summary: dict[str, Any]


def run_lifecycle(spec: RunSpec, make_trainer: Callable[[float, list], Any], *,
                  emit: Callable[[str], None] = print) -> Finished:
    """Runs training and finishes the run's files however it ended.

    Args:
        make_trainer: builds the ``TorchTrainer`` from how long rank 0's first plan request
            waits for the profiles (0 without profiling) and the Ray Train callbacks the
            run adds (the check that its actors started); called inside the guarded part,
            so an error there is recorded like a training failure.

    Raises:
        UserError, TrainingFailed: training failed (:func:`finish_run` says which).
        RunInterrupted: Ctrl-C or SIGTERM stopped training (``spec.interruption`` phrases it).
    """
    node_id = ray.get_runtime_context().get_node_id()
    profiling = _node_profiling(spec, emit)  # its course says where the first plan comes from
    # Neither is waited for here: each is a process importing torch (a second or two), and
    # their starts overlap that of Ray Train's controller, which waits for them
    # (actors.ActorsStarted) before its workers call them.
    store = actors.start_metrics_store(spec.experiment_name, spec.run_dir, node_id, spec.remote_run_uri, wait=False)
    planner = None
    feeds: list = []
    try:
        feeds = [actors.start_data_feed(spec.experiment_name, name, dataset, node_id)
                 for name, dataset in (spec.data_feeds or {}).items()]
        planner = actors.start_planner(spec.experiment_name, spec.run_dir, node_id, wait=False,
                                       launch_id=uuid.uuid4().hex,
                                       first_plan=profiling.first_plan if profiling else None,
                                       **spec.planner_settings)
    except BaseException:
        for actor in (planner, store, *feeds):  # the run's name must not stay taken
            if actor is not None:
                actors.kill_actor(actor)
        raise
    started_check = actors.ActorsStarted({actor_name(spec.experiment_name, METRICS_STORE_ROLE): store,
                                          actor_name(spec.experiment_name, PLANNER_ROLE): planner})
    started = time.time()
    error: Optional[BaseException] = None
    result = None
    stopped_by: Optional[int] = None  # the signal that stopped training by hand
    # Ctrl-C and SIGTERM from here on (runtime/interrupts.py), profiling included: with
    # GPUs their nodes are profiled before the first step, which can take a minute, and a
    # stop there must leave a summary and no actors like a stop in training.
    signals = StopSignals().install()
    try:
        if profiling is not None:
            profiling.start(store, planner)
        trainer = make_trainer(profiling.first_plan_wait_s if profiling else 0.0, [started_check])
        with ProgressPrinter(store, spec.total_steps,
                             env_float(PROGRESS_INTERVAL_S_ENV_VAR, DEFAULT_PROGRESS_INTERVAL_S), emit):
            result = trainer.fit()
    except Exception as e:  # noqa: BLE001 - recorded, files finalised, re-raised below
        error = e
    except (KeyboardInterrupt, SystemExit):  # a stop signal, raised by Ray Train's handler or ours
        if result is None:  # a stop after fit() returned finds training finished
            stopped_by = signals.stopped_by()
    finally:
        # Each step below runs even if one before it raised: the actors are stopped and
        # the handlers put back however finishing went.
        try:
            signals.finishing()
            wall_time_s = time.time() - started
            nodes = _profiled_nodes(profiling, wait=stopped_by is None, emit=emit)
            outcome = Outcome(result, wall_time_s, error, SIGNAL_NAMES[stopped_by] if stopped_by else None, nodes)
            summary, failure = finish_run(spec.run_dir, store, planner, outcome, spec.summary_base,
                                          final_model=spec.final_model, emit=emit)
        finally:
            try:
                for feed in feeds:
                    actors.stop_data_feed(feed)
                for actor in (planner, store):
                    actors.kill_actor(actor)
                _copy_to_remote(spec, emit)
            finally:
                signals.restore()
    if failure is not None:
        raise failure from error
    if stopped_by is not None:
        raise spec.interruption(stopped_by, summary)
    return Finished(result, summary)


def _profiled_nodes(profiling: Optional[NodeProfiling], wait: bool, emit: Callable[[str], None]):
    """The profiles for the summary's verdicts; a profiling that failed leaves them out."""
    if profiling is None:
        return None
    try:
        return profiling.nodes(wait=wait)
    except Exception as e:  # noqa: BLE001 - the summary is still written, without the profiles
        emit(f"[hetero_ray] warning: the node profiles could not be read ({e})")
        return None


def _node_profiling(spec: RunSpec, emit: Callable[[str], None]) -> Optional[NodeProfiling]:
    recipe = spec.profiling
    if recipe is None:
        return None
    return NodeProfiling(spec.run_dir, spec.experiment_name, recipe.config, recipe.uses_gpus, emit=emit)


def _copy_to_remote(spec: RunSpec, emit: Callable[[str], None]) -> None:
    """A copy that fails leaves the run as it ended: its files are complete locally."""
    if spec.remote_run_uri is None:
        return
    try:
        storage.upload(spec.run_dir, spec.remote_run_uri)
    except OSError as e:
        emit(f"[hetero_ray] warning: the run's tables could not be copied to {spec.remote_run_uri} ({e}); "
             f"they are in {spec.run_dir}")
