"""What is alive at an epoch's start leaves Python's later collections (``gc.freeze``).

What the user's loop built before its first step (the model, the optimiser, the dataset,
Ray's and torch's modules) is alive to the end; else Python's full collection, which runs
when enough objects have piled up, walks all of it: a quarter of a second in a Ray worker
holding torch, at a different step on each rank, which the others wait for at the next
collective. Every rank calls :func:`freeze_heap` at the same step (an epoch's start),
before the DataLoader's workers are first forked.

Most epoch starts collect only what the last epoch made (the frozen objects are not
walked), then freeze it. Every :data:`FULL_WALK_EVERY`-th call unfreezes first, so that
the cycles that were frozen alive and died since (an epoch's own objects) are freed:
frozen for good they never would be, and memory would grow with every epoch. Walking the
whole heap at every epoch's start instead cost 0.2–0.3 s each time on every rank (a
process holding torch, Ray and pandas: ~430,000 objects), a stall per epoch that short
epochs feel. The calls are counted, not timed or sized, so every rank walks at the same
epoch's start.
"""

from __future__ import annotations

import gc
import itertools

FULL_WALK_EVERY = 8  # epoch starts: the cycles frozen alive are freed at most this many epochs after dying

_calls = itertools.count()


def freeze_heap() -> None:
    """Collects the garbage, then takes every object alive now out of later collections
    (the whole heap is walked at the first call and every FULL_WALK_EVERY-th after it)."""
    if next(_calls) % FULL_WALK_EVERY == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
