"""The Ray Data tests' rows, made from their id by a ``map_batches`` and augmented by a
second one. A module of its own that imports numpy alone: a Ray Data task imports the
module of the function it runs, and a worker's first reading took 10 s with torch and
hetero_ray to import (beside the loop in tests/ray_data_jobs.py), 2.2 s with numpy."""

from __future__ import annotations

import numpy as np


def features(batch: dict) -> dict:
    ids = batch["id"].astype(np.float64)
    x = np.stack([np.sin(ids * 0.37), np.cos(ids * 0.11), np.sin(ids * 0.05 + 1.0), (ids % 7) / 7.0], axis=1)
    return {"id": batch["id"], "x": x, "y": (x @ np.array([0.5, -1.0, 0.25, 2.0]))[:, None]}


def augment(batch: dict) -> dict:
    return {**batch, "x": batch["x"] * 1.5 + 0.1}  # a transform the pipeline runs on the cluster
