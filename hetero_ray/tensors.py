"""The tensors of a batch, whatever its structure."""

from __future__ import annotations

from typing import Any, Callable

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor in nested tuples, lists (named tuples too) and dicts
    of a batch; other values are kept. Moves batches to a device, pins them, lists them."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (list, tuple)):
        mapped = [map_tensors(b, fn) for b in batch]
        return type(batch)(*mapped) if hasattr(batch, "_fields") else type(batch)(mapped)
    if isinstance(batch, dict):
        return type(batch)({k: map_tensors(v, fn) for k, v in batch.items()})
    return batch
