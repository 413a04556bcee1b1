"""The built-in job's driver: from a validated configuration to a finished run directory,
through :class:`~hetero_ray.trainer.HeteroTrainer` like any user's loop.

Order matters for "bad input leaves nothing behind": the checks a configuration allows
without Ray (values, files, the checkpoint a --resume continues from) run first, so bad
input fails fast; then this process joins or starts Ray, the device each worker takes is
decided, and ``HeteroTrainer.fit()`` does the rest: the cluster's capacity, the nodes'
checks, the run directory (locked: one driver per run directory, see
:mod:`hetero_ray.runs.run_lock`), the run's actors, training and its files. A --resume
is checked again inside ``fit()``, under the run directory's lock, where nothing can change
it any more; a run still going there refuses the resume before anything is read.

What ``fit()`` needs of the built-in job beyond a trainer's arguments — its checks, its
dataset, its settings for config.json, its length, its final model and the CLI's words —
it gets as values (:class:`~hetero_ray.runtime.job.JobFacts`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hetero_ray.builtin import preflight
from hetero_ray.builtin.config import TrainConfig
from hetero_ray.constants import CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S, env_float
from hetero_ray.errors import UserError
from hetero_ray.runs import run_files, run_lock
from hetero_ray.runtime import cluster, node_checks
from hetero_ray.runtime.job import JobFacts, Wording

# What a person types after a message about this run: the CLI's flags.
CLI_WORDS = Wording(
    name_setting="--name",
    storage_setting="--storage-path",
    continue_how="--resume",
    start_afresh="start again under another --name",
    locked_advice=("Wait for that run to end, or stop it (Ctrl-C where it runs, or kill -INT with its pid on its "
                   "host), then continue it with --resume; or start a new run under another --name"),
)


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
        RunInterrupted: Ctrl-C or SIGTERM stopped it (the message says how to continue).
    """
    run_dir = preflight.run_dir_of(config)
    if config.resume and os.path.isdir(run_dir):  # a run still going there: refuse before reading it
        with run_lock.acquire(run_dir, CLI_WORDS.locked_advice):  # and a torn snapshot is rebuilt under it
            preflight.check(config)
    else:
        preflight.check(config)
    if config.download:  # once, here: workers downloading into one folder would collide
        from hetero_ray.builtin.data import download_dataset

        download_dataset(config.dataset, config.data_dir)
    cluster.connect(config.address,
                    local_num_cpus=max(os.cpu_count() or 1, int(config.num_workers * config.cpus_per_worker + 0.999)),
                    timeout_s=env_float(CONNECT_TIMEOUT_S_ENV_VAR, DEFAULT_CONNECT_TIMEOUT_S))
    builtin_trainer(config, _device_mode(config), emit).fit()
    return RunResult(run_dir, run_files.read_json(os.path.join(run_dir, run_files.SUMMARY_FILE), {}))


def builtin_trainer(config: TrainConfig, device_mode: str, emit: Callable[[str], None] = print):
    """The built-in job as a :class:`~hetero_ray.trainer.HeteroTrainer`: its loop, the
    configuration's parts as Ray Train's and hetero_ray's settings, and its facts."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from hetero_ray.builtin.loop import train_loop_per_worker
    from hetero_ray.builtin.recipe import builtin_recipe
    from hetero_ray.hetero_config import HeteroConfig
    from hetero_ray.trainer import HeteroTrainer

    use_gpu = device_mode == "gpu"  # Ray reserves GPUs only when every worker has one
    backend = config.backend if config.backend != "auto" else ("nccl" if use_gpu else "gloo")
    if backend == "nccl" and not use_gpu:
        raise UserError("--backend nccl needs every worker on a GPU; use --backend gloo (or auto) with CPU "
                        "or mixed workers")
    mixed = device_mode == "mixed"
    resources = {"CPU": config.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    hetero = HeteroConfig(
        global_batch_size=config.global_batch_size, policy=config.policy, batch_split=config.batch_split,
        rebalance_interval=config.rebalance_interval, rebalance_threshold=config.rebalance_threshold,
        rebalance_cooldown=config.rebalance_cooldown, emulate_speeds=config.emulate_speeds,
        emulate_speed_changes=config.emulate_speed_changes, plan_changes=config.plan_changes, seed=config.seed,
        record_sample_ids=config.record_sample_ids, profile_interval=config.profile_interval,
        profile=config.profile, profile_model=builtin_recipe(config.model, config.dataset),
        profile_batch_sizes=config.probe_batch_sizes(), profile_timeout_s=config.profile_timeout_s,
        worker_devices=config.worker_devices if mixed else None,
        allow_non_finite_loss=config.allow_non_finite_loss, emulate_devices=config.emulate_devices,
        emulate_devices_factor=config.emulate_devices_factor,
    )
    return HeteroTrainer(
        train_loop_per_worker,
        train_loop_config={"train": config.to_dict()},
        scaling_config=ScalingConfig(
            num_workers=(config.min_workers, config.num_workers) if config.cluster.elastic else config.num_workers,
            use_gpu=use_gpu, resources_per_worker=resources,
            label_selector=None if mixed else config.cluster.label_selectors()),
        run_config=RunConfig(name=config.name, storage_path=os.path.abspath(config.storage_path),
                             failure_config=FailureConfig(max_failures=config.max_failures)),
        hetero_config=hetero,
        torch_config=TorchConfig(backend=backend),
        emit=emit,
        _job=JobFacts(
            words=CLI_WORDS,
            check_run_dir=functools.partial(preflight.check_run_dir, config),
            dataset=_dataset_ref(config),
            settings=config.to_dict(),
            summary_names={"model": config.model, "dataset": config.dataset},
            total_steps=_total_steps(config),
            final_model=_trained_model,
        ),
    )


def _dataset_ref(config: TrainConfig) -> Optional[node_checks.DatasetRef]:
    """The file dataset the run reads, for the nodes' check; None for a synthetic one."""
    from hetero_ray.builtin.config import FILE_DATASETS
    from hetero_ray.builtin.data import load_dataset

    if config.dataset not in FILE_DATASETS:
        return None
    data_dir = os.path.abspath(config.data_dir)
    return node_checks.DatasetRef(config.dataset, data_dir, functools.partial(
        load_dataset, config.dataset, data_dir=data_dir, verify_checksums=config.verify_checksums))


def _trained_model(checkpoint_dir: str) -> dict:
    """The model's state in a built-in checkpoint: the run's final model."""
    from hetero_ray.builtin.checkpointing import load_state

    return load_state(checkpoint_dir).model


def _device_mode(config: TrainConfig) -> str:
    """gpu (every worker gets a GPU from Ray), cpu, or mixed (see training/rank/devices.py)."""
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
    from hetero_ray.builtin.config import FILE_DATASETS
    from hetero_ray.builtin.optim import run_steps

    num_samples = config.num_samples
    if config.dataset in FILE_DATASETS:  # the files decide; loading them here takes ~1 s
        from hetero_ray.builtin.data import load_dataset

        num_samples = len(load_dataset(config.dataset, data_dir=config.data_dir, seed=config.seed,
                                       verify_checksums=config.verify_checksums).train)
    return run_steps(config, num_samples)
