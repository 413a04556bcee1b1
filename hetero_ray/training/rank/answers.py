"""An actor call's answer, wherever the actor lives.

The worker runtime talks to the run's actors (metrics store, planner) through their
handles: ``handle.method.remote(...)`` returns a Ray reference, and :func:`answer` waits
for it. A handle to an object in this process (the in-process runs of the promise
matrix, which test the worker side on real gloo groups without a Ray cluster) answers at
once: its ``remote`` returns the value itself.
"""

from __future__ import annotations

from typing import Any, Optional

import ray


def answer(reply: Any, timeout_s: Optional[float] = None) -> Any:
    """``ray.get(reply)`` for a Ray reference; any other value is the answer already."""
    if isinstance(reply, ray.ObjectRef):
        return ray.get(reply, timeout=timeout_s)
    return reply
