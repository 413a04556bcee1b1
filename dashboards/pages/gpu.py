"""GPU: utilisation, memory, temperature and power per device (empty on CPU clusters)."""

from __future__ import annotations

from hetero_ray.reporting import figures, frames, run_frames
from hetero_ray_dashboards import layout as ui

NAME, PATH, TITLE = "gpu", "/gpu", "GPU"
GRAPHS = ("gpu-metrics",)
CONTENT = ()
INPUTS = ()


def layout(catalog=None):
    return ui.page_frame(NAME, TITLE, [ui.graph("gpu-metrics")])


def build(source, catalog=None) -> dict:
    gpu = source.derived("gpu", lambda: frames.downsample(frames.gpu_frame(run_frames.steps(source)), by="rank",
                                                          drop_partial=source.active()))
    return {"gpu-metrics": figures.gpu_figure(gpu)}
