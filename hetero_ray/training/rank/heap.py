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

Frozen objects are not listed by ``gc.get_objects()``. So that finding the instances of a
few classes (:func:`live_instances`: the optimisers, schedulers and scalers a rank left out
receives from rank 0) need not unfreeze and list the whole heap each time, the first
lookup after a full walk lists it whole and remembers, weakly, the instances it froze
again; each later freeze adds those of what it freezes, and a later lookup lists only
what is not frozen. A run that never looks (no rank left out) lists nothing. A freeze
this module did not make (a ``gc.freeze()`` elsewhere) is noticed by a marker object it
would have frozen too, and the lookup lists the whole heap.
"""

from __future__ import annotations

import gc
import itertools
import weakref
from typing import Optional

FULL_WALK_EVERY = 8  # epoch starts: the cycles frozen alive are freed at most this many epochs after dying

_calls = itertools.count()
_kinds: tuple[type, ...] = ()  # the classes whose frozen instances are remembered
# Weak references to every frozen instance of them, in the order the heap listed them;
# None: not known since the last full walk (the next lookup lists the heap whole).
_frozen_instances: Optional[list[weakref.ref]] = None
_marker: Optional[list] = None  # made after this module's last freeze: if it is frozen, someone else froze


def freeze_heap() -> None:
    """Collects the garbage, then takes every object alive now out of later collections
    (the whole heap is walked at the first call and every FULL_WALK_EVERY-th after it)."""
    global _frozen_instances, _marker
    if next(_calls) % FULL_WALK_EVERY == 0:
        gc.unfreeze()
        _frozen_instances = None
    gc.collect()
    if _frozen_instances is not None:  # known so far: add what is about to be frozen (not frozen yet)
        _frozen_instances.extend(_weak(_instances_of(_kinds, gc.get_objects())))
    gc.freeze()
    _marker = []


def live_instances(kinds: tuple[type, ...], collect_frozen: bool = False) -> list:
    """The live objects whose class is one of ``kinds`` or a subclass, after collecting what
    died since the last freeze (on every rank alike: no rank lists a dead object another
    rank has freed). ``collect_frozen`` also frees what died while frozen (a cycle: an
    optimiser a loop replaced after an epoch's start), by collecting the whole heap, a walk
    of ~0.1–0.3 s."""
    global _frozen_instances, _kinds, _marker
    gc.collect()
    if not collect_frozen and _frozen_instances is not None and _marker is not None and kinds == _kinds:
        unfrozen = gc.get_objects()
        if id(_marker) in set(map(id, unfrozen)):  # nothing was frozen since this module's freeze
            frozen = [o for o in (ref() for ref in _frozen_instances) if o is not None]
            return _unique(frozen + _instances_of(kinds, unfrozen))  # an unfreeze elsewhere lists both
    refreeze = _marker is not None  # a loop that never froze (Lightning's, the Trainer's) stays collectable
    gc.unfreeze()
    if collect_frozen:
        gc.collect()
    found = _instances_of(kinds, gc.get_objects())
    if refreeze:
        _kinds, _frozen_instances = kinds, _weak(found)
        gc.freeze()
        _marker = []
    return found


def _instances_of(kinds: tuple[type, ...], objects: list) -> list:
    # type(), not isinstance: it reads __class__, which some lazy module objects warn on.
    # Each distinct class is tested once; the walk over the objects stays in C.
    wanted = {kind for kind in set(map(type, objects)) if issubclass(kind, kinds)}
    return list(itertools.compress(objects, map(wanted.__contains__, map(type, objects))))


def _weak(objects: list) -> list[weakref.ref]:
    return [weakref.ref(o) for o in objects]


def _unique(objects: list) -> list:
    seen: set[int] = set()
    return [o for o in objects if not (id(o) in seen or seen.add(id(o)))]
