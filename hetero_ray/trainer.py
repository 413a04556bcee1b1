"""``HeteroTrainer``: Ray Train's ``TorchTrainer`` with shares of the global batch that
follow each device's speed.

    trainer = HeteroTrainer(train_loop_per_worker, train_loop_config={"lr": 0.1},
                            scaling_config=ScalingConfig(num_workers=4),
                            run_config=RunConfig(name="my-run", storage_path="/shared/runs"),
                            hetero_config=HeteroConfig(global_batch_size=256))
    result = trainer.fit()          # a ray.train.Result

``fit()`` checks everything it can before anything is written, then runs
:mod:`hetero_ray.runtime.lifecycle`; ``hetero-ray train`` calls it too
(:mod:`hetero_ray.builtin.driver`). What ``fit()`` does, in order: docs/api.md#heterotrainer
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import ray
from ray.train import CheckpointConfig, DataConfig, FailureConfig, Result, RunConfig, ScalingConfig

from hetero_ray.config import _EXPERIMENT_NAME, default_experiment_name
from hetero_ray.constants import (
    CHECKPOINTS_TO_KEEP, CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_ELASTIC_START_TIMEOUT_S,
    DEFAULT_PLACEMENT_TIMEOUT_S, PLACEMENT_TIMEOUT_S_ENV_VAR, TRAIN_DATASET, env_float,
)
from hetero_ray.errors import ConfigError, RunInterrupted
from hetero_ray.hetero_config import HeteroConfig
from hetero_ray.planning.policies import policy_class, policy_names
from hetero_ray.profile_defaults import probe_batch_sizes_around
from hetero_ray.profiling.profile_config import ProfileConfig
from hetero_ray.runs import storage
from hetero_ray.runs.folder import RunFolder
from hetero_ray.runtime import actors, cluster, node_checks
from hetero_ray.runtime.cluster_view import ClusterViewRefresh
from hetero_ray.runtime.failures import RunGuard
from hetero_ray.runtime.interrupts import SIGNAL_NAMES
from hetero_ray.runtime.job import API_JOB, JobFacts
from hetero_ray.runtime.lifecycle import ProfilingSpec, RunSpec, run_lifecycle
from hetero_ray.runtime.ray_data import RunDatasets
from hetero_ray.training.rank.entry import call_for, takes_config
from hetero_ray.training.rank.session import WorkerSettings

if TYPE_CHECKING:
    from ray.train.torch import TorchConfig


class HeteroTrainer:
    """Data-parallel training of the user's loop on a heterogeneous Ray cluster.

    Args:
        train_loop_per_worker: the user's loop, run on every worker; takes the config dict
            or nothing. Inside it, use :mod:`hetero_ray.train`.
        train_loop_config: passed to the loop as is.
        scaling_config: the workers (``num_workers`` or ``(min, max)``, ``use_gpu``,
            ``resources_per_worker``), as for ``TorchTrainer``.
        run_config: the run's name (the experiment's name everywhere: Ray Train, actors,
            files), its storage, failure and checkpoint settings, callbacks.
        hetero_config: the global batch and how it is shared out.
        datasets: Ray Data datasets by name, as for ``TorchTrainer``; the loop reads them
            with ``hetero_ray.train.get_dataset_shard(name)``. ``"train"`` follows the plan:
            each rank reads its share of every global batch, every row once per epoch.
            Every other one is split by Ray Train for evaluation, every row once.
        dataset_config: a ``ray.train.DataConfig`` (which datasets Ray Train splits, its
            execution options), as for ``TorchTrainer``.
        torch_config: the process group's settings (``ray.train.torch.TorchConfig``), as
            for ``TorchTrainer``; ``backend="nccl"`` needs ``ScalingConfig(use_gpu=True)``.
        emit: where the driver's progress lines and warnings go, one ``[hetero_ray] …`` line
            per call (the run's folder, the cluster, profiling, waits, the end); called in
            the driver only. Default ``print``; ``logging.getLogger(...).info`` logs them,
            ``lambda line: None`` silences them.

    Raises:
        UserError (ConfigError): a bad argument, said before anything starts.
    """

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[dict] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 hetero_config: Optional[HeteroConfig] = None, torch_config: Optional[TorchConfig] = None,
                 datasets: Optional[dict] = None, dataset_config: Optional[DataConfig] = None,
                 emit: Callable[[str], None] = print, _job: JobFacts = API_JOB):
        if not callable(train_loop_per_worker):
            raise ConfigError(f"train_loop_per_worker must be a function, got {type(train_loop_per_worker).__name__}")
        takes_config(train_loop_per_worker)  # raises for a loop with more than one argument
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(f"train_loop_config must be a dict, got {type(train_loop_config).__name__}")
        if not isinstance(hetero_config, HeteroConfig):
            raise ConfigError("HeteroTrainer needs hetero_config=HeteroConfig(global_batch_size=...): the global "
                              "batch is what the workers' shares add up to")
        scaling_config = scaling_config or ScalingConfig(num_workers=1)
        run_config = run_config or RunConfig()
        if not isinstance(scaling_config, ScalingConfig) or not isinstance(run_config, RunConfig):
            raise ConfigError("scaling_config and run_config must be ray.train.ScalingConfig and ray.train.RunConfig")
        _check_torch_config(torch_config, scaling_config)
        self._datasets = RunDatasets(datasets, dataset_config)
        self._min_workers, self._max_workers = _worker_range(scaling_config.num_workers)
        hetero_config.check_workers(self._max_workers)
        self._emulate_devices = None  # each rank's curve, read from the profiles now: bad input fails here
        if hetero_config.emulate_devices is not None:
            from hetero_ray.runtime.device_curves import device_curves

            self._emulate_devices = [c.to_dict() for c in device_curves("HeteroConfig.emulate_devices",
                                                                        hetero_config.emulate_devices)]
        _check_worker_devices(hetero_config, scaling_config)
        self._feed_trial = _feed_trial_mode(hetero_config, self._datasets)
        name = run_config.name or default_experiment_name()
        if not _EXPERIMENT_NAME.match(name):
            raise ConfigError(f"RunConfig(name={name!r}) must be 1-100 characters of letters, digits, '.', '_' "
                              "or '-', starting with a letter or digit (it names the run's folder and actors)")
        self._loop = train_loop_per_worker
        self._loop_config = train_loop_config or {}
        self._scaling = scaling_config
        self._run_config = run_config
        self._hetero = hetero_config
        self._torch_config = torch_config
        self._name = name
        self._emit = emit
        self._job = _job

    def fit(self) -> Result:
        """Trains; returns Ray Train's ``Result`` (metrics, checkpoint, path).

        Raises:
            UserError: bad input met before or during training (nothing retried).
            TrainingFailed: training failed; the run's files say how far it got.
            RunInterrupted: Ctrl-C or SIGTERM stopped training; summary.json says
                ``interrupted``, and ``fit()`` under the same name continues from the
                last checkpoint the loop reported (the message says when there is none).
        """
        # One driver per run directory (runs/run_lock.py): an existing one is locked
        # before anything in it is read; a new one as it is created.
        with contextlib.ExitStack() as held:
            folder = RunFolder.open(self._run_config.storage_path, self._name, self._hetero.output_dir,
                                    self._job.words, held)
            return self._fit(folder)

    def _fit(self, folder: RunFolder) -> Result:
        """Checks, then trains; the folder's lock is held until fit() returns."""
        hetero, job, run = self._hetero, self._job, folder.storage
        folder.check(self._emit, job.check_run_dir)
        cpus_per_worker = float((self._scaling.resources_per_worker or {}).get("CPU", 1))
        connection = cluster.connect(None, local_num_cpus=max(os.cpu_count() or 1, int(self._max_workers * cpus_per_worker + 0.999)),
                                     timeout_s=env_float(CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S),
                                     join_local_cluster=True)
        use_gpu = bool(self._scaling.use_gpu)
        selectors = self._label_selectors()
        cluster.check_capacity(self._min_workers, cpus_per_worker, 1.0 if use_gpu else 0.0, selectors)
        if run.remote_run_uri is None:  # checkpoints go to a path every worker node writes
            node_checks.check_nodes(run.run_dir, selectors, job.dataset, emit=self._emit)
        actors.check_name_free(self._name, job.words.name_setting)  # a live run of this name: refuse
        folder.create(job.settings if job.settings is not None else {
            "hetero_config": hetero.to_dict(), "name": self._name, "storage_path": run.storage_path}, self._emit)
        self._emit(f"[hetero_ray] Ray: {'local cluster started' if connection.started_local else connection.address}"
                   + (f", dashboard {connection.dashboard_url}" if connection.dashboard_url else ""))
        note = cluster.dashboard_note(connection)
        if note:
            self._emit(note)

        device_mode = "mixed" if hetero.worker_devices is not None else ("gpu" if use_gpu else "cpu")
        uses_gpus = use_gpu or "gpu" in (hetero.worker_devices or ())
        make_trainer = functools.partial(self._torch_trainer, run, device_mode)
        finished = run_lifecycle(self._run_spec(folder, uses_gpus, cpus_per_worker), make_trainer, emit=self._emit)
        self._emit(f"[hetero_ray] finished: {finished.summary['global_steps']} global steps; files in {run.run_dir}")
        return finished.result

    def _label_selectors(self) -> Optional[list[dict]]:
        """Where each worker may run: its device's node label, or the ScalingConfig's own selectors."""
        return self._hetero.label_selectors() or getattr(self._scaling, "label_selector", None) or None

    def _torch_trainer(self, run: storage.RunStorage, device_mode: str, first_plan_wait_s: float,
                       run_callbacks: Sequence = ()):
        from hetero_ray.runtime.torch_trainer import LeanTorchTrainer

        hetero = self._hetero
        # Waiting for room must end: Ray Train gives up starting a group after this long. An
        # elastic run would rather continue at once with the workers it can have than wait for
        # the full size, so losing a node costs seconds, not a minute.
        elastic = self._min_workers < self._max_workers
        os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(env_float(
            PLACEMENT_TIMEOUT_S_ENV_VAR, DEFAULT_ELASTIC_START_TIMEOUT_S if elastic else DEFAULT_PLACEMENT_TIMEOUT_S))
        settings = WorkerSettings(
            experiment_name=self._name, global_batch_size=hetero.global_batch_size, seed=hetero.seed,
            rebalance_interval=hetero.rebalance_interval, device_mode=device_mode,
            record_sample_ids=hetero.record_sample_ids, profile_interval=hetero.profile_interval,
            emulate_speeds=list(hetero.emulate_speeds) if hetero.emulate_speeds else None,
            speed_changes=[dict(c) for c in hetero.emulate_speed_changes] if hetero.emulate_speed_changes else None,
            emulate_devices=self._emulate_devices, emulate_devices_factor=hetero.emulate_devices_factor,
            # Under emulated speeds each rank times the user's model before step 0 (training/timing/warmup.py),
            # and so do the CPU ranks where there are GPUs (runtime/node_profiling.py); emulated
            # devices always do (training/timing/curve_emulation.py: the curves' common factor).
            warmup_model=hetero.profile_model if ((hetero.emulate_speeds or device_mode != "cpu")
                                                  and hetero.profiles_nodes) or hetero.emulate_devices else None,
            warmup_batch_sizes=self._probe_batch_sizes(), first_plan_wait_s=first_plan_wait_s,
            allow_non_finite_loss=hetero.allow_non_finite_loss, tables_to_uri=run.remote_run_uri is not None,
            end_global_step=self._job.total_steps,
            data_feeds=list(self._datasets.feeds), evaluation_datasets=list(self._datasets.evaluation),
        )
        user = self._run_config
        run_config = RunConfig(
            name=self._name,
            storage_path=run.storage_path,
            failure_config=user.failure_config or FailureConfig(),
            checkpoint_config=user.checkpoint_config or CheckpointConfig(num_to_keep=CHECKPOINTS_TO_KEEP),
            callbacks=[*(user.callbacks or []), RunGuard(self._name), *run_callbacks,
                       *([ClusterViewRefresh()] if elastic else [])],
            logging_config=user.logging_config or ray.LoggingConfig(log_level="WARNING"),
            worker_runtime_env=user.worker_runtime_env,
        )
        scaling = self._scaling
        if hetero.worker_devices is not None:
            scaling = dataclasses.replace(scaling, label_selector=hetero.label_selectors())
        return LeanTorchTrainer(call_for(self._loop, settings.to_dict()), train_loop_config=self._loop_config,
                            torch_config=self._torch_config, scaling_config=scaling, run_config=run_config,
                            datasets=self._datasets.evaluation or None, dataset_config=self._datasets.data_config())

    def _probe_batch_sizes(self) -> list[int]:
        hetero = self._hetero
        return list(hetero.profile_batch_sizes or probe_batch_sizes_around(hetero.global_batch_size, self._max_workers))

    def _run_spec(self, folder: RunFolder, use_gpu: bool, cpus_per_worker: float) -> RunSpec:
        hetero, job, run = self._hetero, self._job, folder.storage
        profiling = None
        if hetero.profiles_nodes:
            profiling = ProfilingSpec(ProfileConfig(model=hetero.profile_model, batch_sizes=self._probe_batch_sizes(),
                                                    cpus_per_worker=cpus_per_worker,
                                                    timeout_s=hetero.profile_timeout_s), uses_gpus=use_gpu)
        return RunSpec(
            experiment_name=self._name,
            run_dir=run.run_dir,
            planner_settings=dict(global_batch_size=hetero.global_batch_size, policy=policy_class(hetero.policy),
                                  rebalance_interval=hetero.rebalance_interval, batch_split=hetero.batch_split,
                                  plan_changes=hetero.plan_changes, policy_config=hetero.policy_config(),
                                  feed_trial=self._feed_trial, feed_trial_steps=hetero.feed_trial_steps),
            summary_base={
                "experiment_name": self._name,
                "model": hetero.profile_model.name if hetero.profile_model is not None else None,
                "dataset": None,
                **job.summary_names,
                "policy": hetero.policy,
                "num_workers": self._max_workers,
                "global_batch_size": hetero.global_batch_size,
                "emulate_speeds": list(hetero.emulate_speeds) if hetero.emulate_speeds else None,
            },
            interruption=functools.partial(self._interrupted, folder),
            profiling=profiling,
            total_steps=job.total_steps,
            final_model=job.final_model,
            remote_run_uri=run.remote_run_uri,
            data_feeds=self._datasets.feeds,
        )

    def _interrupted(self, folder: RunFolder, signum: int, summary: dict[str, Any]) -> RunInterrupted:
        """What a stop raises: how far the run got, and how to continue it from the last
        checkpoint reported before the stop (the message says when there is none)."""
        words, run = self._job.words, folder.storage
        name = SIGNAL_NAMES[signum] + (" (Ctrl-C)" if signum == signal.SIGINT else "")
        recorded = (f"interrupted by {name} at global step {summary['global_steps']}: summary.json says "
                    f"\"interrupted\", and the steps trained so far are in {run.run_dir}")
        if not run.has_ray_snapshot():  # what fit() continues from (see fit)
            return RunInterrupted(f"{recorded}. No checkpoint was reported before the stop, so there is nothing to "
                                  f"continue: {words.start_afresh}", signum, resumable=False)
        return RunInterrupted(f"{recorded}. {words.continues(self._name)} continues from "
                              f"{folder.latest_checkpoint()}", signum, resumable=True)


def _check_torch_config(torch_config: Optional[TorchConfig], scaling_config: ScalingConfig) -> None:
    if torch_config is None:
        return
    from ray.train.torch import TorchConfig

    if not isinstance(torch_config, TorchConfig):
        raise ConfigError(f"torch_config must be a ray.train.torch.TorchConfig, got {type(torch_config).__name__}; "
                          "pass torch_config=TorchConfig(backend=...) or leave it out")
    # Ray gives GPUs only when every worker asks for one; workers on CPUs (or a mix of
    # GPUs and CPUs) can only join a gloo group.
    if torch_config.backend == "nccl" and not scaling_config.use_gpu:
        raise ConfigError("TorchConfig(backend='nccl') needs every worker on a GPU (ScalingConfig(use_gpu=True)); "
                          "use TorchConfig(backend='gloo') with CPU or mixed GPU/CPU workers")


def _check_worker_devices(hetero_config: HeteroConfig, scaling_config: ScalingConfig) -> None:
    if hetero_config.worker_devices is None:
        return
    # One TorchTrainer gives every worker the same resources: a GPU for each or for none.
    # Mixed workers ask for none, and each takes the device its node's label names.
    if scaling_config.use_gpu:
        raise ConfigError("HeteroConfig.worker_devices places GPU and CPU workers itself: leave "
                          "ScalingConfig(use_gpu=False) (Ray reserves GPUs only when every worker asks for one)")
    if getattr(scaling_config, "label_selector", None):
        raise ConfigError("HeteroConfig.worker_devices and ScalingConfig(label_selector=...) both place workers; "
                          "give one of them")
    if isinstance(scaling_config.num_workers, (tuple, list)):
        raise ConfigError("HeteroConfig.worker_devices names one device per worker, so ScalingConfig.num_workers "
                          "must be a number, not a (min, max) range")


def _feed_trial_mode(hetero_config: HeteroConfig, datasets: RunDatasets) -> str:
    """The planner's ``feed_trial``: "auto" where it applies, "on" when asked for, else "off"."""
    asked = hetero_config.feed_trial
    reads_ray_data = TRAIN_DATASET in datasets.feeds
    adaptive = policy_class(hetero_config.policy).adapts
    if asked is True:
        if not reads_ray_data:
            raise ConfigError("HeteroConfig(feed_trial=True) measures ranks feeding a Ray Data pipeline, but "
                              "datasets= has no 'train' dataset; pass datasets={'train': ...} or leave feed_trial "
                              "unset")
        if not adaptive:
            raise ConfigError(f"HeteroConfig(feed_trial=True) changes the plan, which policy={hetero_config.policy!r} "
                              f"never does; use policy={_adaptive_policies()}, or leave feed_trial unset")
        return "on"
    return "auto" if asked is None and reads_ray_data and adaptive else "off"


def _adaptive_policies() -> str:
    return " or ".join(repr(name) for name in policy_names() if policy_class(name).adapts)


def _worker_range(num_workers) -> tuple[int, int]:
    if isinstance(num_workers, (tuple, list)) and len(num_workers) == 2:
        low, high = num_workers
    else:
        low = high = num_workers
    for value in (low, high):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"ScalingConfig(num_workers={num_workers!r}) must be a positive integer or (min, max)")
    if low > high:
        raise ConfigError(f"ScalingConfig(num_workers={num_workers!r}): the minimum exceeds the maximum")
    return low, high
