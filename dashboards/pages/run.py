"""Run: cluster samples/s over time, loss and eval metric, epoch progress and ETA."""

from __future__ import annotations

import time

from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "run", "/run", "Run"
GRAPHS = ("run-throughput", "run-loss", "run-eval")
CONTENT = ("run-kpis",)
INPUTS = ()


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [
        ui.block("run-kpis"),
        ui.graph("run-throughput"),
        ui.row([ui.graph("run-loss"), ui.graph("run-eval")]),
    ])


def build(source, catalog=None) -> dict:
    cluster = run_frames.cluster_plot(source)
    evals = run_frames.evals(source)
    return {
        "run-kpis": kpis(source),
        "run-throughput": figures.throughput_figure(cluster),
        "run-loss": figures.loss_figure(cluster, evals),
        "run-eval": figures.eval_metric_figure(evals),
    }


def kpis(source) -> list:
    steps = run_frames.steps(source)
    summary = source.summary() or {}
    progress = frames.epoch_progress(steps, source.epochs(), source.config() or summary)
    table = run_frames.cluster(source)
    status = source.status()
    config = source.config() or summary
    policy = config.get("policy") or "–"
    if progress.get("global_step") is None:
        return [ui.kpis([("run", source.name), ("policy", policy), ("status", status), ("steps", "0")])]
    total = progress.get("total_steps")
    epochs = progress.get("total_epochs")
    steady = summary.get("steady_samples_per_s") or frames.steady_samples_per_s(table)
    elapsed = float(table["elapsed_s"].iloc[-1]) if not table.empty else None
    if status == "running" and elapsed is not None:
        elapsed = max(elapsed, time.time() - run_frames.start_wall_time(source))
    bar_text = (f"step {progress['global_step']:,}" + (f" of {total:,}" if total else "")
                + f" · epoch {progress['epoch'] + 1}" + (f" of {epochs}" if epochs else ""))
    return [
        ui.progress_bar(progress.get("fraction"), bar_text),
        ui.kpis([
            ("run", source.name),
            ("policy", policy),
            ("status", status),
            ("samples/s now", ui.number(progress.get("samples_per_s"))),
            ("steady samples/s", ui.number(steady)),
            ("training time", ui.duration(elapsed)),
            ("ETA", ui.duration(progress.get("eta_s")) if status == "running" else "–"),
            ("plan changes", str(len(run_frames.changes(source)))),
        ]),
    ]
