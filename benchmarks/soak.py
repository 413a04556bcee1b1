"""Soak: a long run whose metrics store must stay bounded in memory and complete on disk.

    python jobs/soak.py                                   # 5,000 steps of mlp on 2 workers
    python jobs/soak.py --steps 3000 --max-recent-steps 1000 --json soak.json

One ``mlp`` run of ``--steps`` global steps over a small synthetic dataset (many epochs,
so epoch ends, evaluations and checkpoints recur all along). Every ``--interval`` seconds
the metrics-store actor reports its own resident memory and what it holds
(:meth:`MetricsStore.memory`). The store's in-memory window is set low
(``HETERO_RAY_STORE_MAX_RECENT_STEPS``, rows of all ranks) so that it fills early and
the rest of the run shows whether memory stays flat once it is full.

Figures: RSS at the start, middle and end; growth between the 40 % and 100 % marks and
the largest excursion above the 40 % value (the window is full by then); rows held
against the bound; and the Parquet audit: rows == steps × ranks, every global step
present, no (global_step, rank) twice.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from hetero_ray.constants import STORE_MAX_RECENT_STEPS_ENV_VAR

DEFAULT_STEPS = 5000
DEFAULT_NUM_WORKERS = 2
# Small enough that the window fills within the first tenth of a 5,000-step run
# (2 ranks send 2 rows a step), large enough to serve a dashboard's last ~1,000 steps.
DEFAULT_MAX_RECENT_STEPS = 2000
DEFAULT_INTERVAL_S = 3.0  # a sample every few seconds: ~40 over a 2-minute run
DEFAULT_NUM_SAMPLES = 2048  # 64 steps an epoch at batch 32: ~80 epochs (evaluation + checkpoint each)
BATCH_SIZE = 32
MARK_FROM, MARK_TO = 0.4, 1.0  # growth is judged between these fractions of the run


@dataclass
class MemorySample:
    elapsed_s: float
    cursor: int  # step rows received so far (all ranks)
    rss_bytes: int
    steps_held: int
    pending_rows: int


@dataclass
class SoakResult:
    steps: int
    num_workers: int
    max_recent_steps: int
    wall_time_s: float
    run_dir: str
    samples: list[MemorySample] = field(default_factory=list)
    parquet_rows: int = 0
    parquet_global_steps: int = 0
    duplicated_rows: int = 0
    status: str = ""

    @property
    def expected_rows(self) -> int:
        return self.steps * self.num_workers

    def at(self, fraction: float) -> Optional[MemorySample]:
        """The sample taken closest to ``fraction`` of the rows the run sends."""
        if not self.samples:
            return None
        target = fraction * self.expected_rows
        return min(self.samples, key=lambda s: abs(s.cursor - target))

    def figures(self) -> dict:
        start, middle, end = self.at(0.0), self.at(0.5), self.at(1.0)
        mark_from, mark_to = self.at(MARK_FROM), self.at(MARK_TO)
        later = [s for s in self.samples if mark_from and s.cursor >= mark_from.cursor]
        mib = 1024 ** 2
        return {
            "steps": self.steps, "num_workers": self.num_workers, "wall_time_s": round(self.wall_time_s, 1),
            "samples_taken": len(self.samples),
            "rss_start_mib": start and round(start.rss_bytes / mib, 1),
            "rss_middle_mib": middle and round(middle.rss_bytes / mib, 1),
            "rss_end_mib": end and round(end.rss_bytes / mib, 1),
            "rss_max_mib": round(max(s.rss_bytes for s in self.samples) / mib, 1) if self.samples else None,
            "growth_40_to_100_mib": (round((mark_to.rss_bytes - mark_from.rss_bytes) / mib, 1)
                                     if mark_from and mark_to else None),
            "max_excursion_after_40_mib": (round((max(s.rss_bytes for s in later) - mark_from.rss_bytes) / mib, 1)
                                           if later else None),
            "rows_held_max": max((s.steps_held for s in self.samples), default=None),
            "rows_bound": self.max_recent_steps,
            "pending_rows_max": max((s.pending_rows for s in self.samples), default=None),
            "parquet_rows": self.parquet_rows, "expected_rows": self.expected_rows,
            "parquet_global_steps": self.parquet_global_steps, "duplicated_rows": self.duplicated_rows,
            "status": self.status, "run_dir": self.run_dir,
        }


class StoreMemorySampler:
    """Asks the run's metrics-store actor for :meth:`MetricsStore.memory` every interval."""

    def __init__(self, experiment_name: str, interval_s: float):
        self._experiment_name = experiment_name
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-memory")
        self.samples: list[MemorySample] = []

    def __enter__(self):
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import ray

        from hetero_ray.constants import METRICS_STORE_ROLE
        from hetero_ray.runtime.actors import get_actor

        store = None
        while not self._stop.wait(self._interval_s):
            if not ray.is_initialized():
                continue  # the driver connects first; ray.get_actor here would start a Ray of its own
            try:
                store = store or get_actor(self._experiment_name, METRICS_STORE_ROLE)
                memory = ray.get(store.memory.remote(), timeout=self._interval_s)
            except Exception:  # noqa: BLE001 - not started yet, or already gone at the end
                continue
            self.samples.append(MemorySample(time.monotonic() - self._started, memory["cursor"],
                                             memory["rss_bytes"], memory["steps_held"], memory["pending_rows"]))


def run_soak(steps: int = DEFAULT_STEPS, num_workers: int = DEFAULT_NUM_WORKERS,
             max_recent_steps: int = DEFAULT_MAX_RECENT_STEPS, interval_s: float = DEFAULT_INTERVAL_S,
             output_dir: Optional[str] = None, experiment_name: Optional[str] = None,
             num_samples: int = DEFAULT_NUM_SAMPLES, emit: Callable[[str], None] = print) -> SoakResult:
    """Trains ``steps`` global steps of mlp and samples the store's memory; see the module doc."""
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.builtin.driver import run_training
    from hetero_ray.runs import run_files

    experiment_name = experiment_name or time.strftime("soak-%Y%m%d-%H%M%S")
    output_dir = output_dir or tempfile.mkdtemp(prefix="hetero_ray_soak_")
    steps_per_epoch = num_samples // BATCH_SIZE
    config = TrainConfig(
        model="mlp", dataset="synthetic_image", num_samples=num_samples, eval_samples=256, global_batch_size=BATCH_SIZE,
        epochs=-(-steps // steps_per_epoch), max_steps=steps, num_workers=num_workers, policy="static",
        profile=False, checkpoint_every=10 * steps_per_epoch, max_failures=0, storage_path=output_dir,
        name=experiment_name,
    )
    # The driver reads the bound when it starts the store actor (runtime/actors.py).
    previous = os.environ.get(STORE_MAX_RECENT_STEPS_ENV_VAR)
    os.environ[STORE_MAX_RECENT_STEPS_ENV_VAR] = str(max_recent_steps)
    started = time.monotonic()
    try:
        with StoreMemorySampler(experiment_name, interval_s) as sampler:
            result = run_training(config, emit=emit)
    finally:
        if previous is None:
            os.environ.pop(STORE_MAX_RECENT_STEPS_ENV_VAR, None)
        else:
            os.environ[STORE_MAX_RECENT_STEPS_ENV_VAR] = previous
    soak = SoakResult(steps, num_workers, max_recent_steps, time.monotonic() - started, result.run_dir,
                      samples=sampler.samples, status=result.summary["status"])
    table = run_files.read_table(result.run_dir, "steps")
    soak.parquet_rows = len(table)
    soak.parquet_global_steps = int(table["global_step"].nunique())
    soak.duplicated_rows = int(table.duplicated(["global_step", "rank"]).sum())
    return soak


def format_report(result: SoakResult) -> str:
    from hetero_ray.formatting import format_table

    f = result.figures()
    rows = [[f"{s.elapsed_s:.0f}", f"{s.cursor:,}", f"{s.rss_bytes / 1024**2:.1f}", f"{s.steps_held:,}",
             f"{s.pending_rows:,}"] for s in result.samples]
    lines = [f"== soak: {f['steps']:,} steps of mlp on {f['num_workers']} workers, {f['wall_time_s']} s ==",
             format_table(["t s", "rows received", "store RSS MiB", "rows held", "rows pending"], rows), "",
             f"store RSS: start {f['rss_start_mib']} MiB, middle {f['rss_middle_mib']} MiB, "
             f"end {f['rss_end_mib']} MiB, max {f['rss_max_mib']} MiB",
             f"growth from 40 % to 100 % of the run: {f['growth_40_to_100_mib']} MiB "
             f"(largest excursion above the 40 % value: {f['max_excursion_after_40_mib']} MiB)",
             f"rows held in memory: at most {f['rows_held_max']:,} (bound {f['rows_bound']:,}); "
             f"pending for Parquet at most {f['pending_rows_max']:,}",
             f"steps.parquet: {f['parquet_rows']:,} rows (expected {f['expected_rows']:,} = steps × ranks), "
             f"{f['parquet_global_steps']:,} global steps, {f['duplicated_rows']} duplicated (global_step, rank)",
             f"run: {f['status']}, {f['run_dir']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="global steps (default %(default)s)")
    parser.add_argument("--num-workers", type=int, default=DEFAULT_NUM_WORKERS, help="(default %(default)s)")
    parser.add_argument("--max-recent-steps", type=int, default=DEFAULT_MAX_RECENT_STEPS,
                        help="the store's in-memory window, rows of all ranks (default %(default)s)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                        help="seconds between memory samples (default %(default)s)")
    parser.add_argument("--num-samples", type=int, default=DEFAULT_NUM_SAMPLES,
                        help=f"training samples: {BATCH_SIZE} a step, an epoch (evaluation, checkpoint) per "
                             "pass (default %(default)s)")
    parser.add_argument("--output-dir", help="where the run goes (default: a temporary folder)")
    parser.add_argument("--json", help="also write the figures and samples to this file")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--num-workers", args.num_workers),
                        ("--max-recent-steps", args.max_recent_steps), ("--num-samples", args.num_samples)):
        if value < 1:
            parser.error(f"{flag} must be a positive integer, got {value}")
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    if args.num_samples < BATCH_SIZE:
        parser.error(f"--num-samples must be at least the batch of {BATCH_SIZE}, got {args.num_samples}")
    result = run_soak(args.steps, args.num_workers, args.max_recent_steps, args.interval, args.output_dir,
                      num_samples=args.num_samples)
    print(format_report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"figures": result.figures(), "samples": [asdict(s) for s in result.samples]}, f, indent=2)
        print(f"figures: {os.path.abspath(args.json)}")
    complete = (result.parquet_rows == result.expected_rows and result.duplicated_rows == 0
                and result.parquet_global_steps == result.steps)
    return 0 if complete and result.status == "finished" else 1
