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

from hetero_ray.builtin.config import resume_fixed_fields
from hetero_ray.errors import UserError
from hetero_ray.planning.plan import Plan
from hetero_ray.runs.checkpoint_names import POSITION_FILE
from hetero_ray.sampler import Position

STATE_FILE = "state.pt"
FORMAT_VERSION = 1


@dataclass
class TrainingState:
    model: dict
    optimizer: dict
    lr_scheduler: dict
    position: Position
    plan: Plan
    fingerprint: dict  # what must match to resume: run_fingerprint
    rng: dict
    extra: dict  # other components' state (e.g. the balancer's), by name


def run_fingerprint(config) -> dict:
    """The settings a checkpoint is only valid for: those a --resume must repeat
    (:func:`hetero_ray.builtin.config.resume_fixed_fields`)."""
    return {name: getattr(config, name) for name in resume_fixed_fields()}


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


def model_shapes(model: str, dataset: str) -> dict[str, tuple[int, ...]]:
    """Every parameter's and buffer's shape in a fresh ``model`` for ``dataset``.

    Built on the meta device: no memory, no arithmetic, milliseconds even for resnet50,
    so the driver can check a checkpoint before any worker starts.
    """
    from hetero_ray.builtin.data import spec_for
    from hetero_ray.builtin.models import build_model

    with torch.device("meta"):
        net = build_model(model, spec_for(model, dataset))
    return {name: tuple(tensor.shape) for name, tensor in net.state_dict().items()}


def load_state(directory: str, expected_fingerprint: Optional[dict] = None,
               expected_shapes: Optional[dict[str, tuple[int, ...]]] = None) -> TrainingState:
    """Reads a checkpoint; a corrupt or incompatible one is a :class:`UserError`.

    Args:
        expected_fingerprint: :func:`run_fingerprint` of the run that resumes.
        expected_shapes: :func:`model_shapes` of the model that will load the weights;
            a state_dict with other keys or shapes is rejected here rather than by
            ``load_state_dict`` inside a worker.
    """
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
            f"checkpoint {path} cannot be read ({type(e).__name__}: {_first_line(e)}); it is "
            "corrupt or was not written by hetero_ray, so the run cannot continue from it; start a "
            "new run with another --name"
        ) from e
    # A checkpoint of an older version records fewer settings; those it has must match.
    diffs = {
        k: (state.fingerprint[k], v)
        for k, v in (expected_fingerprint or {}).items()
        if k in state.fingerprint and state.fingerprint[k] != v
    }
    if diffs:
        described = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
        raise UserError(
            f"checkpoint {path} belongs to a different run ({described}); resume with the "
            "original settings or start a new run with another --name"
        )
    if expected_shapes is not None:
        problem = _shape_mismatch(state.model, expected_shapes)
        if problem:
            raise UserError(
                f"checkpoint {path} holds weights that do not fit --model "
                f"{state.fingerprint.get('model')} ({problem}); the file was replaced or written by "
                "another version of the model. Start a new run with another --name"
            )
    return state


def _shape_mismatch(saved: dict, expected: dict[str, tuple[int, ...]], shown: int = 3) -> Optional[str]:
    """What differs between a saved state_dict and the expected shapes, or None."""
    if not isinstance(saved, dict):
        return f"the model entry is a {type(saved).__name__}, not a state_dict"
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    wrong = [f"{k} saved {_shape_of(saved[k])} vs model {expected[k]}" for k in expected
             if k in saved and _shape_of(saved[k]) != expected[k]]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", wrong)):
        if keys:
            more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
            problems.append(f"{label}: {', '.join(keys[:shown])}{more}")
    return "; ".join(problems) or None


def _shape_of(value) -> object:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _first_line(error: BaseException, limit: int = 160) -> str:
    """The gist of an error: its first line, cut at a sentence when long (torch's are)."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else "no details"
    if len(line) > limit:
        sentence = line.find(". ", 20)
        line = line[: sentence + 1] if 0 < sentence < limit else line[: limit - 1] + "…"
    return line

