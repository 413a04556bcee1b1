"""Mixed precision for a training step: autocast, and a gradient scaler for fp16.

The pattern every loop follows (the built-in job's included); ``prepare_model``'s gradient
weighting and batch norm hold under it unchanged (why: docs/worker-runtime.md#precision)::

    precision = Precision.named("bf16", device)      # or fp16, fp32
    scaler = precision.make_scaler()                 # fp16 only; None otherwise
    with precision.autocast():
        loss = loss_fn(model(x), y)                  # the mean over the LOCAL batch, as always
    if scaler is None:
        loss.backward(); optimizer.step()
    else:
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
    # checkpoint scaler.state_dict() beside the optimiser's; load it on resume
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16
    device_type: str  # "cuda" | "cpu"

    @classmethod
    def named(cls, name: str, device: torch.device) -> "Precision":
        if name not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
        return cls(name, device.type)

    def autocast(self):
        """The forward pass (and the loss) in the lower precision; fp32: nothing changes."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.name])

    def make_scaler(self) -> Optional[torch.amp.GradScaler]:
        """fp16's loss scaling (its range underflows small gradients); bf16 has fp32's range."""
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16" else None
