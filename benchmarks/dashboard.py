"""Benchmark: the performance app on a long run, and what a live refresh sends.

    .venv/bin/python benchmarks/dashboard.py                 # 1,000,000 step rows (4 ranks × 250k steps)
    .venv/bin/python benchmarks/dashboard.py --rows 200000 --keep /tmp/big-run

1. Writes a synthetic run directory (Parquet through the STEPS schema of
   ``hetero_ray.runs.records``; plans, epochs, decisions, config, attempts) and times,
   with a cold cache, loading it and building every page exactly as a browser's first
   request does (``callbacks.update_page``): the issue's target is ≤ 3 s.
2. Feeds a real ``MetricsStore`` (in process, no Ray) and a live source reading it through
   ``updates_since``, and prints the bytes a page's refresh sends: the first load, an
   increment of N steps, and a refresh with nothing new.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from dash import no_update

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetero_ray.runs import run_files  # noqa: E402
from hetero_ray.runs.records import DECISIONS, EPOCHS, PLANS, SCHEMAS, STEPS, to_table  # noqa: E402
from hetero_ray.metrics.store import MetricsStore  # noqa: E402
from hetero_ray_dashboards import callbacks  # noqa: E402
from hetero_ray_dashboards.catalog import RunCatalog  # noqa: E402
from hetero_ray_dashboards.live_source import LiveRunSource  # noqa: E402
from hetero_ray_dashboards.pages import DEFAULT_PAGE, PAGES  # noqa: E402

TARGET_S = 3.0
SPEEDS = (1.0, 1.0, 0.5, 0.25)


def synthetic_steps(num_steps: int, num_ranks: int, first_step: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
    """Columns of ``num_steps × num_ranks`` step rows that look like a real run's."""
    rng = np.random.default_rng(seed)
    n = num_steps * num_ranks
    global_step = np.repeat(np.arange(first_step, first_step + num_steps), num_ranks)
    rank = np.tile(np.arange(num_ranks), num_steps)
    speed = np.array([SPEEDS[r % len(SPEEDS)] for r in range(num_ranks)])[rank]
    batch = np.tile(np.round(256 * np.array([SPEEDS[r % len(SPEEDS)] for r in range(num_ranks)])
                             / sum(SPEEDS[r % len(SPEEDS)] for r in range(num_ranks))).astype(np.int64), num_steps)
    forward = batch * 0.0002 / speed * rng.lognormal(0, 0.05, n)
    backward = 2 * forward
    data = rng.exponential(0.001, n)
    busy = data + forward + backward
    step_time = np.repeat(busy.reshape(num_steps, num_ranks).max(axis=1) + 0.004, num_ranks)
    optimizer = np.full(n, 0.001)
    steps_per_epoch = 5000
    return {
        "epoch": global_step // steps_per_epoch, "step": global_step % steps_per_epoch, "global_step": global_step,
        "rank": rank, "node_id": np.array([f"node-{r:02d}-{'a' * 48}" for r in range(num_ranks)])[rank],
        "attempt": np.zeros(n, dtype=np.int64), "local_batch_size": batch,
        "global_batch_size": np.full(n, int(batch[:num_ranks].sum())), "plan_version": global_step // 50_000,
        "data_time_s": data, "forward_time_s": forward, "backward_time_s": backward, "pad_time_s": np.zeros(n),
        "optimizer_time_s": optimizer, "busy_time_s": busy,
        "wait_time_s": np.maximum(0.0, step_time - busy - optimizer), "step_time_s": step_time,
        "loss": 2.3 * np.exp(-global_step / (num_steps + first_step + 1)) + rng.normal(0, 0.02, n),
        "lr": np.full(n, 0.1), "wall_time": 1.7e9 + np.cumsum(step_time) / num_ranks,
    }


def step_table(columns: dict[str, np.ndarray]) -> pa.Table:
    schema = SCHEMAS[STEPS]
    n = len(columns["global_step"])
    arrays = [pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def write_run(run_dir: str, num_rows: int, num_ranks: int = 4) -> None:
    num_steps = num_rows // num_ranks
    os.makedirs(run_dir, exist_ok=True)
    columns = synthetic_steps(num_steps, num_ranks)
    run_files.write_table(run_files.table_path(run_dir, STEPS), step_table(columns))
    wall = columns["wall_time"]
    plans = [{"plan_version": v, "first_global_step": v * 50_000, "epoch": 0, "step": 0, "attempt": 0,
              "num_workers": num_ranks, "global_batch_size": 256, "local_batch_sizes": [96, 96, 48, 16][:num_ranks],
              "reason": "synthetic", "wall_time": float(wall[min(len(wall) - 1, v * 50_000 * num_ranks)])}
             for v in range(num_steps // 50_000 + 1)]
    epochs = [{"epoch": e, "global_step": (e + 1) * 5000 - 1, "attempt": 0, "train_loss": 2.0 / (e + 1),
               "eval_loss": 2.1 / (e + 1), "eval_metric": 1 - 0.9 / (e + 1), "eval_metric_name": "accuracy",
               "samples": 5000 * 256, "epoch_time_s": 60.0, "samples_per_s": 20000.0,
               "wall_time": float(wall[min(len(wall) - 1, ((e + 1) * 5000 - 1) * num_ranks)])}
              for e in range(num_steps // 5000)]
    decisions = [{"global_step": g, "policy": "optimal", "adopted": g % 50_000 == 0, "reason": "synthetic",
                  "plan_version": g // 50_000, "local_batch_sizes": [96, 96, 48, 16][:num_ranks],
                  "predicted_step_time_s": 0.1, "current_predicted_step_time_s": 0.11, "predicted_gain": 0.1,
                  "achieved_step_time_s": 0.105, "wall_time": float(wall[g * num_ranks])}
                 for g in range(500, num_steps, 500)]
    for name, rows in ((PLANS, plans), (EPOCHS, epochs), (DECISIONS, decisions)):
        run_files.write_table(run_files.table_path(run_dir, name), to_table(name, rows))
    run_files.write_json(os.path.join(run_dir, run_files.CONFIG_FILE), {
        "name": os.path.basename(run_dir), "policy": "optimal", "num_workers": num_ranks,
        "global_batch_size": 256, "epochs": num_steps // 5000, "num_samples": 5000 * 256, "dataset": "synthetic_image"})
    run_files.write_json(os.path.join(run_dir, run_files.ATTEMPTS_FILE),
                         [{"attempt": 0, "start_global_step": 0, "num_workers": num_ranks, "wall_time": 1.7e9}])
    run_files.write_json(os.path.join(run_dir, run_files.SUMMARY_FILE),  # a finished run
                         {"experiment_name": os.path.basename(run_dir), "status": "finished"})


def page_args(page, key: str) -> tuple:
    if page.NAME == "ranks":
        return ([0, 1, 2, 3],)
    if page.NAME == "compare":
        return ([key],)
    return ()


def bench_offline(runs_dir: str, name: str) -> float:
    catalog = RunCatalog(runs_dir)  # a fresh cache: nothing read yet
    key = "offline:" + name
    started = time.perf_counter()
    source = catalog.source(key)
    for table in (STEPS, PLANS, EPOCHS, DECISIONS):
        getattr(source, table)()
    load_s = time.perf_counter() - started
    print(f"  load (Parquet → DataFrames, cold)      {load_s:6.2f} s  ({len(source.steps()):,} step rows)")
    first_page_s = None
    # The Run page first: it is what "/" opens, and it computes the frames others share.
    for page in sorted(PAGES, key=lambda p: p is not DEFAULT_PAGE):
        t = time.perf_counter()
        outputs = callbacks.update_page(page, catalog, key, page_args(page, key), None)
        elapsed = time.perf_counter() - t
        first_page_s = first_page_s if first_page_s is not None else elapsed
        print(f"  page {page.TITLE:<12} built and serialised {elapsed:6.2f} s  {callbacks.payload_bytes(outputs):>9,} bytes")
    total = time.perf_counter() - started
    print(f"  load + every page                      {total:6.2f} s")
    return load_s + max(first_page_s or 0, 0)


class InProcessBridge:
    """The bridge's interface over a MetricsStore in this process (no Ray: the payload the
    browser gets does not depend on how the server got the rows)."""

    def __init__(self, store: MetricsStore):
        self.store = store

    def updates(self, experiment, cursors, limit=50_000):
        return self.store.updates_since(cursors, limit)

    def call(self, experiment, method, **kwargs):
        return getattr(self.store, method)(**kwargs)


def bench_live(start_steps: int, increment_steps: int, num_ranks: int = 4) -> None:
    directory = tempfile.mkdtemp(prefix="bench-live-")
    try:
        store = MetricsStore(directory, "live-bench", parquet_flush_interval_s=3600)
        store.begin_attempt(0, num_ranks)

        def feed(first: int, count: int) -> None:
            columns = synthetic_steps(count, num_ranks, first_step=first, seed=first)
            rows = step_table(columns).to_pylist()
            store.add(steps=rows)

        feed(0, start_steps)
        catalog = RunCatalog(directory)
        source = LiveRunSource("live:live-bench", "live-bench", InProcessBridge(store),
                               config={"epochs": 1, "num_samples": 10**9, "batch_size": 256, "dataset": "synthetic_image"})
        catalog._sources[source.key] = source
        print(f"  live run with {start_steps:,} steps × {num_ranks} ranks; refresh after {increment_steps} more steps:")
        pages = [page for page in PAGES if page.NAME != "compare"]
        loaded = []
        for page in pages:  # what each page sends when opened, then with nothing new
            extra = page_args(page, source.key)
            source._last_refresh = 0.0  # no refresh throttling between these calls
            first = callbacks.update_page(page, catalog, source.key, extra, None)
            idle = callbacks.update_page(page, catalog, source.key, extra, first[-2])
            state = first[-2] if idle[-2] is no_update else idle[-2]  # the browser keeps what it has
            loaded.append((page, extra, callbacks.payload_bytes(first), callbacks.payload_bytes(idle), state))
        feed(start_steps, increment_steps)
        for page, extra, full, idle, state in loaded:
            source._last_refresh = 0.0
            increment = callbacks.payload_bytes(callbacks.update_page(page, catalog, source.key, extra, state))
            print(f"    {page.TITLE:<12} full load {full:>9,} B   +{increment_steps} steps {increment:>7,} B   "
                  f"nothing new {idle:>5,} B")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="step rows of the long run (default %(default)s)")
    parser.add_argument("--increment", type=int, default=20, help="steps in one live refresh (default %(default)s)")
    parser.add_argument("--keep", help="write the long run here and keep it (default: a temporary folder)")
    args = parser.parse_args()

    runs_dir = os.path.dirname(os.path.abspath(args.keep)) if args.keep else tempfile.mkdtemp(prefix="bench-dash-")
    name = os.path.basename(os.path.abspath(args.keep)) if args.keep else "long-run"
    try:
        started = time.perf_counter()
        write_run(os.path.join(runs_dir, name), args.rows)
        print(f"synthetic run: {args.rows:,} step rows written in {time.perf_counter() - started:.1f} s "
              f"({os.path.getsize(run_files.table_path(os.path.join(runs_dir, name), STEPS)) / 1e6:.0f} MB of Parquet)")
        print("offline, cold cache (what opening the run in the app costs):")
        first_view = bench_offline(runs_dir, name)
        verdict = "OK" if first_view <= TARGET_S else "SLOWER THAN TARGET"
        print(f"  → first view (load + {DEFAULT_PAGE.TITLE} page): {first_view:.2f} s, target ≤ {TARGET_S:.0f} s: {verdict}")
        print("live refresh payloads (JSON bytes of the callback response):")
        bench_live(1_000, args.increment)
        bench_live(50_000, args.increment)
    finally:
        if not args.keep:
            shutil.rmtree(runs_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
