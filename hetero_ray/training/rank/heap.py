"""What is alive at an epoch's start leaves Python's later collections (``gc.freeze``).

What the loop built before its first step is alive to the end, and a full collection that
walks it stalls one rank at a step of its own while the others wait. Every rank calls
:func:`freeze_heap` at the same step (an epoch's start, before the DataLoader's workers are
first forked): it collects what the last epoch made and freezes it, and every
:data:`FULL_WALK_EVERY`-th call unfreezes first, so that frozen cycles that died since are
freed. :func:`live_instances` finds the instances of a few classes without listing the
whole heap each time, by remembering (weakly) those it froze. Why, and what it saves:
docs/worker-runtime.md#the-heap
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
