"""Run: cluster samples/s over time, loss and eval metric, epoch progress and ETA."""

from __future__ import annotations

import time

from dashboards import figures, frames
from dashboards import layout as ui
from dashboards.pages import common

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
    cluster = common.cluster_plot(source)
    evals = common.evals(source)
    return {
        "run-kpis": kpis(source),
        "run-throughput": figures.throughput_figure(cluster),
        "run-loss": figures.loss_figure(cluster, evals),
        "run-eval": figures.eval_metric_figure(evals),
    }


def kpis(source) -> list:
    steps = common.steps(source)
    summary = source.summary() or {}
    progress = frames.epoch_progress(steps, source.epochs(), source.config() or summary)
    table = common.cluster(source)
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
        elapsed = max(elapsed, time.time() - common.start_wall_time(source))
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
            ("plan changes", str(len(common.changes(source)))),
        ]),
    ]
