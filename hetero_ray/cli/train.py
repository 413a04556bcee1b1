"""``hetero-ray train``: flags → :class:`TrainConfig` → :func:`run_training` → summary.

The same flags serve ``jobs/train.py`` (the ``ray job submit`` entrypoint).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Optional, Sequence

from hetero_ray.cli.args import (
    float_list, int_list, label_selectors, plan_change, speed_change, str_list, worker_range,
)
from hetero_ray.config import (
    BACKENDS, DATASETS, LR_SCHEDULES, MODELS, OPTIMIZERS, POLICIES, USE_GPU_CHOICES, TrainConfig,
)
from hetero_ray.errors import ConfigError, RunInterrupted

HELP = "train a model (starts a local Ray unless --address or RAY_ADDRESS is given)"

_DEFAULTS = TrainConfig(experiment_name="defaults")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = _DEFAULTS
    what = parser.add_argument_group("what to train")
    what.add_argument("--model", default=d.model, help=f"one of {', '.join(MODELS)} (default %(default)s)")
    what.add_argument("--dataset", default=d.dataset, help=f"one of {', '.join(DATASETS)} (default %(default)s)")
    what.add_argument("--data-dir", help="folder with the CIFAR python-pickle batches (cifar10/cifar100)")
    what.add_argument("--download", action="store_true", help="download CIFAR into --data-dir (needs internet)")
    what.add_argument("--no-verify-checksums", dest="verify_checksums", action="store_false",
                      help="accept CIFAR files whose md5 is not the published one (a copy or subset you made and "
                           "trust); they are still unpickled with only the format's types allowed")
    what.add_argument("--num-samples", type=int, default=d.num_samples, help="synthetic datasets: training samples (default %(default)s)")
    what.add_argument("--eval-samples", type=int, default=d.eval_samples, help="synthetic datasets: held-out samples (default %(default)s)")

    opt = parser.add_argument_group("optimisation (depends on the global batch only)")
    opt.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch size B (default %(default)s)")
    opt.add_argument("--epochs", type=int, default=d.epochs, help="(default %(default)s)")
    opt.add_argument("--max-steps", type=int, help="stop after this many global steps")
    opt.add_argument("--lr", type=float, default=d.lr, help="learning rate (default %(default)s)")
    opt.add_argument("--optimizer", default=d.optimizer, help=f"one of {', '.join(OPTIMIZERS)} (default %(default)s)")
    opt.add_argument("--lr-schedule", default=d.lr_schedule, help=f"one of {', '.join(LR_SCHEDULES)} (default %(default)s)")
    opt.add_argument("--drop-last", action="store_true", help="drop each epoch's last short window")
    opt.add_argument("--seed", type=int, default=d.seed, help="(default %(default)s)")

    where = parser.add_argument_group("cluster")
    where.add_argument("--address", help="Ray cluster to join (HOST:PORT, auto, ray://…); default RAY_ADDRESS or a local Ray")
    where.add_argument("--num-workers", type=worker_range, default=(d.num_workers, None), metavar="N|MIN-MAX",
                       help=f"training workers (ranks); MIN-MAX trains elastically: nodes may leave and join "
                            f"(default {d.num_workers})")
    where.add_argument("--cpus-per-worker", type=float, default=d.cpus_per_worker, help="(default %(default)s)")
    where.add_argument("--use-gpu", default=d.use_gpu, help=f"one of {', '.join(USE_GPU_CHOICES)} (default %(default)s)")
    where.add_argument("--worker-devices", type=str_list, metavar="gpu|cpu,…",
                       help="device kind per worker, e.g. gpu,gpu,cpu: mixed GPU and CPU workers in one job, "
                            "on nodes labelled hetero-ray.io/device (see cluster_configs/)")
    where.add_argument("--worker-labels", type=label_selectors, metavar="K=V[,K=V];…",
                       help="per-worker node label selectors, ';' between workers (e.g. gpu=h100;gpu=h100;cpu-only=1)")
    where.add_argument("--backend", default=d.backend, help=f"one of {', '.join(BACKENDS)} (default %(default)s: nccl when all ranks have GPUs)")

    plan = parser.add_argument_group("the plan (each rank's share of the global batch)")
    plan.add_argument("--policy", default=d.policy, help=f"one of {', '.join(POLICIES)} (default %(default)s)")
    plan.add_argument("--batch-split", type=int_list, help="explicit initial shares, e.g. 40,24 (sum = --batch-size)")
    plan.add_argument("--rebalance-interval", type=int, default=d.rebalance_interval, help="steps between plan checks (default %(default)s)")
    plan.add_argument("--rebalance-threshold", type=float, default=d.rebalance_threshold,
                      help="adopt a new plan only if it predicts a step this much faster (default %(default)s)")
    plan.add_argument("--rebalance-cooldown", type=int, default=d.rebalance_cooldown,
                      help="steps after a plan change before the next may be adopted (default %(default)s)")
    plan.add_argument("--emulate-speeds", type=float_list, help="per-rank fraction of real speed, e.g. 1,1,0.5,0.25")
    plan.add_argument("--plan-change", type=plan_change, action="append", default=None,
                      metavar="STEP:B0,B1,...", help="scripted plan change at a global step (tests, demos; repeatable)")
    plan.add_argument("--emulate-speed-change", type=speed_change, action="append", default=None,
                      metavar="STEP:RANK:SPEED", help="from global STEP on, RANK runs at SPEED (repeatable)")

    prof = parser.add_argument_group("profiling")
    prof.add_argument("--no-profile", action="store_true", help="skip profiling the nodes before training")
    prof.add_argument("--profile-batch-sizes", type=int_list, help="probe batch sizes (default around B/n)")
    prof.add_argument("--profile-interval", type=int, default=d.profile_interval,
                      help="in-training GPU/CPU readings every N steps; 0 turns them off (default %(default)s)")
    prof.add_argument("--profile-timeout", type=float, default=d.profile_timeout_s,
                      help="seconds for profiling the whole cluster (default %(default)s)")

    ft = parser.add_argument_group("fault tolerance")
    ft.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps between checkpoints (and every epoch end) (default %(default)s)")
    ft.add_argument("--max-failures", type=int, default=d.max_failures, help="worker-group restarts allowed (default %(default)s)")
    ft.add_argument("--resume", action="store_true", help="continue the run of the same --experiment-name")

    out = parser.add_argument_group("output")
    out.add_argument("--experiment-name", help="run name (default run-YYYYmmdd-HHMMSS)")
    out.add_argument("--output-dir", default=d.output_dir, help="runs go to OUTPUT_DIR/EXPERIMENT_NAME (default %(default)s)")
    out.add_argument("--record-sample-ids", action="store_true", help="write sample_ids.parquet (exactly-once audit)")


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, Optional[list[dict]]]:
    """The configuration and the emulated speed changes; raises ConfigError on bad values."""
    fields = dict(
        model=args.model, dataset=args.dataset, data_dir=args.data_dir, download=args.download,
        verify_checksums=args.verify_checksums,
        num_samples=args.num_samples, eval_samples=args.eval_samples, batch_size=args.batch_size,
        epochs=args.epochs, max_steps=args.max_steps, lr=args.lr, optimizer=args.optimizer,
        lr_schedule=args.lr_schedule, drop_last=args.drop_last, seed=args.seed, address=args.address,
        num_workers=args.num_workers[0], min_workers=args.num_workers[1],
        cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu, worker_devices=args.worker_devices,
        backend=args.backend, worker_label_selectors=args.worker_labels, policy=args.policy, batch_split=args.batch_split,
        rebalance_interval=args.rebalance_interval, rebalance_threshold=args.rebalance_threshold,
        rebalance_cooldown=args.rebalance_cooldown, emulate_speeds=args.emulate_speeds,
        plan_changes=args.plan_change,
        profile=not args.no_profile, profile_batch_sizes=args.profile_batch_sizes,
        profile_interval=args.profile_interval, profile_timeout_s=args.profile_timeout,
        checkpoint_every=args.checkpoint_every, max_failures=args.max_failures, resume=args.resume,
        output_dir=args.output_dir, record_sample_ids=args.record_sample_ids,
    )
    if args.experiment_name:
        fields["experiment_name"] = args.experiment_name
    config = TrainConfig(**fields)
    changes = args.emulate_speed_change
    for change in changes or ():
        if change["rank"] >= config.num_workers:
            raise ConfigError(f"--emulate-speed-change rank {change['rank']} does not exist with "
                              f"--num-workers {config.num_workers}")
    return config, changes


def run(args: argparse.Namespace) -> int:
    from hetero_ray.cli.report_text import print_run_summary
    from hetero_ray.runtime.driver import run_training

    config, speed_changes = config_from_args(args)
    try:
        result = run_training(config, speed_changes=speed_changes)
    except RunInterrupted as e:
        if not e.resumable:
            raise
        command = resume_command(getattr(args, "argv", None) or ["train"])
        raise RunInterrupted(f"{e}. Continue it with:\n  {command}", e.signum, e.resumable) from None
    print_run_summary(result.summary)
    return 0


def resume_command(argv: Sequence[str]) -> str:
    """The command line that continues this run: the program as started, the same flags
    (a resume must repeat the run's settings) and --resume.

    Args:
        argv: the arguments as given to ``hetero-ray``, ``train`` first.
    """
    flags = [a for a in argv[1:] if a != "--resume"]
    return shlex.join([*_train_program(), *flags, "--resume"])


def _train_program() -> list[str]:
    """How this process's ``train`` was started, as a person would type it again."""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) == "__main__.py":
        return ["python", "-m", "hetero_ray", "train"]
    if script.endswith(".py") and os.path.basename(os.path.dirname(os.path.abspath(script))) == "jobs":
        return ["python", script]  # jobs/train.py, the `ray job submit` entrypoint: no subcommand
    return ["hetero-ray", "train"]
