"""What a checkpoint holds, and how it is written and read.

A checkpoint is taken after a completed step and records the *next* position, so a
restart resumes at exactly that step with the same permutation (the sampler needs only
``(epoch, step)``) and, with the recorded plan, the same cut of the window. Everything is
saved as tensors and plain Python values so that it loads with ``weights_only=True``:
a checkpoint file never executes code.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Optional

import torch

from hetero_ray.errors import UserError
from hetero_ray.plan import Plan
from hetero_ray.sampler import Position

STATE_FILE = "state.pt"
POSITION_FILE = "position.json"  # readable without torch, e.g. to pick the latest checkpoint
FORMAT_VERSION = 1


@dataclass
class TrainingState:
    model: dict
    optimizer: dict
    lr_scheduler: dict
    position: Position
    plan: Plan
    fingerprint: dict  # what must match to resume: model, dataset, global batch, seed
    rng: dict
    extra: dict  # other components' state (e.g. the balancer's), by name


def run_fingerprint(config) -> dict:
    """The settings a checkpoint is only valid for."""
    return {
        "model": config.model,
        "dataset": config.dataset,
        "global_batch_size": config.batch_size,
        "seed": config.seed,
        "num_samples": config.num_samples,
    }


def capture_rng() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuple(rng["python"]))


def _as_tuple(value):
    # random.setstate needs tuples where serialisation may have produced lists.
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


def save_state(directory: str, state: TrainingState) -> None:
    payload = {
        "format_version": FORMAT_VERSION,
        "model": state.model,
        "optimizer": state.optimizer,
        "lr_scheduler": state.lr_scheduler,
        "position": state.position.to_dict(),
        "plan": state.plan.to_dict(),
        "fingerprint": state.fingerprint,
        "rng": state.rng,
        "extra": state.extra,
    }
    torch.save(payload, os.path.join(directory, STATE_FILE))
    with open(os.path.join(directory, POSITION_FILE), "w") as f:
        json.dump({"position": state.position.to_dict(), "plan": state.plan.to_dict()}, f)


def load_state(directory: str, expected_fingerprint: Optional[dict] = None) -> TrainingState:
    """Reads a checkpoint; a corrupt or incompatible one is a :class:`UserError`."""
    path = os.path.join(directory, STATE_FILE)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unknown checkpoint format {payload.get('format_version')!r}")
        state = TrainingState(
            model=payload["model"],
            optimizer=payload["optimizer"],
            lr_scheduler=payload["lr_scheduler"],
            position=Position.from_dict(payload["position"]),
            plan=Plan.from_dict(payload["plan"]),
            fingerprint=payload["fingerprint"],
            rng=payload["rng"],
            extra=payload.get("extra", {}),
        )
    except Exception as e:  # noqa: BLE001 - any failure here means an unusable file
        raise UserError(
            f"checkpoint {path} cannot be read ({type(e).__name__}: {e}); it is corrupt or "
            "was not written by hetero_ray. Delete that checkpoint folder to fall back to an "
            "earlier one, or start a new run with another --experiment-name"
        ) from e
    if expected_fingerprint is not None and state.fingerprint != expected_fingerprint:
        diffs = {
            k: (state.fingerprint.get(k), v)
            for k, v in expected_fingerprint.items()
            if state.fingerprint.get(k) != v
        }
        described = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
        raise UserError(
            f"checkpoint {path} belongs to a different run ({described}); resume with the "
            "original settings or start a new run with another --experiment-name"
        )
    return state
