"""The driver: from a validated configuration to a finished run directory.

Order matters for "bad input leaves nothing behind": every check (values, files, the
cluster's capacity, the checkpoint a --resume continues from) runs before the run
directory is created. A --resume first locks the run directory
(:mod:`hetero_ray.runtime.run_lock`): a run still going there refuses it before anything
else is read or written; a new run takes the lock as it creates the folder. After that,
the metrics store and the planner start as named actors, Ray Train runs the workers, and the store's files are merged and summarised even
when training fails: :mod:`hetero_ray.runtime.lifecycle`, the part ``HeteroTrainer.fit()``
shares.

Failures a retry cannot fix stop the run at once (:mod:`hetero_ray.runtime.failures`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray

from hetero_ray.builtin import preflight
from hetero_ray.config import TrainConfig
from hetero_ray.constants import (
    CHECKPOINTS_TO_KEEP, CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_ELASTIC_START_TIMEOUT_S,
    DEFAULT_PLACEMENT_TIMEOUT_S, PLACEMENT_TIMEOUT_S_ENV_VAR, RAY_TRAIN_SUBDIR, env_float,
)
from hetero_ray.errors import RunInterrupted, UserError
from hetero_ray.metrics import run_files
from hetero_ray.runtime import actors, checkpoints, cluster, node_checks, run_lock
from hetero_ray.runtime.failures import RunGuard, is_disk_full
from hetero_ray.runtime.interrupts import SIGNAL_NAMES
from hetero_ray.runtime.lifecycle import ProfilingSpec, RunSpec, run_lifecycle


@dataclass
class RunResult:
    run_dir: str
    summary: dict[str, Any]


def run_training(config: TrainConfig, *, emit: Callable[[str], None] = print) -> RunResult:
    """Runs one training job end to end; see the module docstring for the order of things.

    Raises:
        UserError: bad input or a cluster that cannot run the job (nothing was written);
            also bad input a worker met after the start (e.g. a checkpoint corrupted since
            the checks), which stops the run without retries.
        TrainingFailed: the job failed after it started (the run directory holds what was
            recorded up to the failure).
    """
    with contextlib.ExitStack() as held:  # the run directory's lock, until the run's files are final
        locked = config.resume and os.path.isdir(preflight.run_dir_of(config))
        if locked:
            held.enter_context(run_lock.acquire(preflight.run_dir_of(config), _LOCKED_ADVICE))
        return _run_training(config, held, locked, emit)


# What a driver refused by the run directory's lock can do (run_lock.acquire names the holder).
_LOCKED_ADVICE = ("Wait for that run to end, or stop it (Ctrl-C where it runs, or kill -INT with its pid on its "
                  "host), then continue it with --resume; or start a new run under another --experiment-name")


def _run_training(config: TrainConfig, held: contextlib.ExitStack, locked: bool,
                  emit: Callable[[str], None]) -> RunResult:
    run_dir = preflight.check(config)
    emulate_devices = _emulated_devices(config)  # the profiles it names are read here, before anything starts
    connection = cluster.connect(
        config.address,
        local_num_cpus=max(os.cpu_count() or 1, int(config.num_workers * config.cpus_per_worker + 0.999)),
        timeout_s=env_float(CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S),
    )
    device_mode = _device_mode(config)
    use_gpu = device_mode == "gpu"  # Ray reserves GPUs only when every worker has one
    cluster.check_capacity(config.min_workers or config.num_workers, config.cpus_per_worker,
                           1.0 if use_gpu else 0.0, config.cluster.label_selectors())
    node_checks.check_nodes(run_dir, config.cluster.label_selectors(), _dataset_ref(config), emit)
    backend = config.backend if config.backend != "auto" else ("nccl" if use_gpu else "gloo")
    if backend == "nccl" and not use_gpu:
        raise UserError("--backend nccl needs every worker on a GPU; use --backend gloo (or auto) with CPU "
                        "or mixed workers")

    actors.check_name_free(config.experiment_name, "--experiment-name")  # a live run of this name: refuse
    if config.download:  # once, here: workers downloading into one folder would collide
        from hetero_ray.builtin.data import download_dataset

        download_dataset(config.dataset, config.data_dir)
    _create_run_dir(run_dir, config, held, locked)
    emit(f"[hetero_ray] run directory: {run_dir}")
    if config.resume:
        emit(f"[hetero_ray] resuming from {_describe_checkpoint(run_dir)}")
    emit(f"[hetero_ray] Ray: {'local cluster started' if connection.started_local else connection.address}"
         + (f", dashboard {connection.dashboard_url}" if connection.dashboard_url else ""))

    total_steps = _total_steps(config)
    make_trainer = functools.partial(_make_trainer, config, run_dir, device_mode, backend, total_steps,
                                     emulate_devices=emulate_devices)
    finished = run_lifecycle(_run_spec(config, run_dir, device_mode, total_steps), make_trainer, emit=emit)
    return RunResult(run_dir, finished.summary)


def _interrupted(run_dir: str, signum: int, summary: dict[str, Any]) -> RunInterrupted:
    """What a person reads after stopping a run: how far it got, where, whether --resume can continue."""
    name = SIGNAL_NAMES[signum] + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    recorded = (f"interrupted by {name} at global step {summary['global_steps']}: summary.json says "
                f"\"interrupted\", and the steps trained so far are in {run_dir}")
    if checkpoints.latest_checkpoint_dir(run_dir) is None:
        return RunInterrupted(f"{recorded}. No checkpoint was saved before the stop, so there is nothing to "
                              "--resume: start again under another --experiment-name", signum, resumable=False)
    return RunInterrupted(f"{recorded}. --resume continues from {_describe_checkpoint(run_dir)}", signum,
                          resumable=True)


def _create_run_dir(run_dir: str, config: TrainConfig, held: contextlib.ExitStack, locked: bool) -> None:
    """The run directory and its config.json; a full disk here leaves nothing behind.

    Unless ``locked`` (a --resume took the lock first), the lock is taken here, as the
    folder is created, and ``held`` keeps it.
    """
    created = not os.path.isdir(run_dir)
    lock = None
    try:
        os.makedirs(run_dir, exist_ok=config.resume)
        if not locked:
            lock = run_lock.acquire(run_dir, _LOCKED_ADVICE)
        run_files.write_json(os.path.join(run_dir, run_files.CONFIG_FILE), config.to_dict())
    except FileExistsError:  # another driver created it since the checks: say which, if it runs
        run_lock.acquire(run_dir, _LOCKED_ADVICE).release()
        raise UserError(f"run directory {run_dir} already exists; pass --resume to continue that run, or choose "
                        "another --experiment-name (nothing was overwritten)") from None
    except OSError as e:
        if lock is not None:
            lock.release()
        if created:
            _remove_quietly(os.path.join(run_dir, run_lock.LOCK_FILE))
            _remove_empty_dir(run_dir)
        what = "disk full" if is_disk_full(e) else (e.strerror or str(e))
        raise UserError(f"cannot write {os.path.join(run_dir, run_files.CONFIG_FILE)} ({what}); free space "
                        "or choose another --output-dir (nothing was written)") from None
    if lock is not None:
        held.enter_context(lock)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _remove_empty_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _make_trainer(config: TrainConfig, run_dir: str, device_mode: str, backend: str,
                  total_steps: int, first_plan_wait_s: float, emulate_devices=None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from hetero_ray.builtin.loop import train_loop_per_worker
    from hetero_ray.training.entry import call_for
    from hetero_ray.training.session import WorkerSettings

    # Waiting for room must end: Ray Train gives up starting a group after this long. An
    # elastic run would rather continue at once with the workers it can have than wait for
    # the full size, so losing a node costs seconds, not a minute.
    start_timeout_s = env_float(PLACEMENT_TIMEOUT_S_ENV_VAR,
                                DEFAULT_ELASTIC_START_TIMEOUT_S if config.cluster.elastic
                                else DEFAULT_PLACEMENT_TIMEOUT_S)
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(start_timeout_s)
    use_gpu = device_mode == "gpu"
    resources = {"CPU": config.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = 1
    num_workers = (config.min_workers, config.num_workers) if config.cluster.elastic else config.num_workers
    # The built-in job is a user of the public API: the same session wraps it as wraps a
    # HeteroTrainer user's loop.
    settings = WorkerSettings(
        experiment_name=config.experiment_name, global_batch_size=config.batch_size, seed=config.seed,
        rebalance_interval=config.rebalance_interval, device_mode=device_mode,
        record_sample_ids=config.record_sample_ids, profile_interval=config.profile_interval,
        emulate_speeds=config.emulate_speeds, speed_changes=config.emulate_speed_changes, end_global_step=total_steps,
        emulate_devices=emulate_devices, first_plan_wait_s=first_plan_wait_s,
        allow_non_finite_loss=config.allow_non_finite_loss, **_warmup_settings(config, device_mode),
    )
    return TorchTrainer(
        call_for(train_loop_per_worker, settings.to_dict()),
        train_loop_config={"train": config.to_dict()},
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources, label_selector=config.cluster.label_selectors()),
        run_config=RunConfig(
            name=RAY_TRAIN_SUBDIR,
            storage_path=run_dir,
            failure_config=FailureConfig(max_failures=config.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_TO_KEEP),
            # Ray Train logs every report at INFO; the progress line says what matters.
            logging_config=ray.LoggingConfig(log_level="WARNING"),
            callbacks=[RunGuard(config.experiment_name)],
        ),
    )


def _emulated_devices(config: TrainConfig):
    """Each rank's device curve (as dicts for the workers), None without --emulate-devices."""
    if config.emulate_devices is None:
        return None
    from hetero_ray.training.curve_emulation import device_curves

    return [c.to_dict() for c in device_curves("--emulate-devices", config.emulate_devices)]


def _warmup_settings(config: TrainConfig, device_mode: str) -> dict:
    """Under emulated speeds (with profiling on), each rank times the built-in model's step
    before step 0: the first plan is measured under the emulation (training/warmup.py); so
    do the CPU ranks where there are GPUs (their nodes are profiled after the first plan:
    runtime/node_profiling.py). Emulated devices need it whatever --profile says: the ranks
    time the model to agree on the curves' common factor (training/curve_emulation.py)."""
    if not (((config.emulate_speeds or device_mode != "cpu") and config.profile) or config.emulate_devices):
        return {}
    from hetero_ray.builtin.recipe import builtin_recipe

    return {"warmup_model": builtin_recipe(config.model, config.dataset),
            "warmup_batch_sizes": config.probe_batch_sizes()}


def _run_spec(config: TrainConfig, run_dir: str, device_mode: str, total_steps: int) -> RunSpec:
    profiling = None
    if config.profile:
        from hetero_ray.builtin.recipe import builtin_recipe

        profiling = ProfilingSpec(builtin_recipe(config.model, config.dataset), config.probe_batch_sizes(),
                                  config.cpus_per_worker, config.profile_timeout_s, uses_gpus=device_mode != "cpu")
    return RunSpec(
        experiment_name=config.experiment_name,
        run_dir=run_dir,
        planner_settings=dict(global_batch_size=config.batch_size, policy=config.policy,
                              rebalance_interval=config.rebalance_interval, batch_split=config.batch_split,
                              plan_changes=config.plan_changes, policy_config=config.plan.policy_config()),
        summary_base={
            "experiment_name": config.experiment_name,
            "model": config.model,
            "dataset": config.dataset,
            "policy": config.policy,
            "num_workers": config.num_workers,
            "global_batch_size": config.batch_size,
            "emulate_speeds": config.emulate_speeds,
        },
        interruption=functools.partial(_interrupted, run_dir),
        profiling=profiling,
        total_steps=total_steps,
        final_model=_trained_model,
    )


def _dataset_ref(config: TrainConfig) -> Optional[node_checks.DatasetRef]:
    """The file dataset the run reads, for the nodes' check; None for a synthetic one."""
    from hetero_ray.builtin.data import load_dataset
    from hetero_ray.config import FILE_DATASETS

    if config.dataset not in FILE_DATASETS:
        return None
    data_dir = os.path.abspath(config.data_dir)
    return node_checks.DatasetRef(config.dataset, data_dir, functools.partial(
        load_dataset, config.dataset, data_dir=data_dir, verify_checksums=config.verify_checksums))


def _trained_model(checkpoint_dir: str) -> dict:
    """The model's state in a built-in checkpoint: the run's final model."""
    from hetero_ray.builtin.checkpointing import load_state

    return load_state(checkpoint_dir).model


def _describe_checkpoint(run_dir: str) -> str:
    directory = checkpoints.latest_checkpoint_dir(run_dir)
    position = run_files.read_json(os.path.join(directory, "position.json"), {}).get("position", {})
    return (f"the checkpoint at global step {position.get('global_step')} "
            f"(epoch {position.get('epoch')}, step {position.get('step')}): {directory}")


def _device_mode(config: TrainConfig) -> str:
    """gpu (every worker gets a GPU from Ray), cpu, or mixed (see training/devices.py)."""
    if config.worker_devices is not None:
        if config.cluster.mixed_devices:
            return "mixed"
        if config.worker_devices[0] == "cpu":
            return "cpu"
    has_gpus = cluster.cluster_has_gpus()
    if config.use_gpu == "yes" and not has_gpus:
        raise UserError("--use-gpu yes, but the cluster has no GPUs; use --use-gpu no or auto")
    return "gpu" if (has_gpus if config.use_gpu == "auto" else config.use_gpu == "yes") else "cpu"


def _total_steps(config: TrainConfig) -> int:
    from hetero_ray.builtin.optim import total_steps
    from hetero_ray.config import FILE_DATASETS
    from hetero_ray.sampler import GlobalSampler

    num_samples = config.num_samples
    if config.dataset in FILE_DATASETS:  # the files decide; loading them here takes ~1 s
        from hetero_ray.builtin.data import load_dataset

        num_samples = len(load_dataset(config.dataset, data_dir=config.data_dir, seed=config.seed,
                                       verify_checksums=config.verify_checksums).train)
    sampler = GlobalSampler(num_samples, config.batch_size, config.seed, config.drop_last)
    return total_steps(config.epochs, sampler.steps_per_epoch, config.max_steps)
