"""Starting a run's actor waits until it is up, says so when that takes a while, and a
start that never comes ends with a clear error and the name free again (real actors)."""

from __future__ import annotations

import time

import pytest
import ray

from hetero_ray.constants import RAY_NAMESPACE, actor_name
from hetero_ray.errors import TrainingFailed
from hetero_ray.runtime import actors

pytestmark = pytest.mark.ray


class _SlowToStart:
    def __init__(self, start_s: float):
        time.sleep(start_s)

    def ping(self) -> str:
        return "up"


def test_a_slow_start_is_waited_for_and_said(ray_session, monkeypatch, capsys):
    monkeypatch.setattr(actors, "_ACTOR_START_NOTE_S", 0.2)
    handle = actors.start_actor(_SlowToStart, "slow-start", "probe", 2.0)
    try:
        assert ray.get(handle.ping.remote(), timeout=5) == "up"  # no wait left for the first call
        assert "waiting for the run's actor slow-start/probe to start" in capsys.readouterr().out
    finally:
        actors.kill_actor(handle)


def test_a_start_that_never_comes_fails_clearly_and_frees_the_name(ray_session, monkeypatch):
    monkeypatch.setattr(actors, "_ACTOR_START_NOTE_S", 0.2)
    monkeypatch.setattr(actors, "ACTOR_START_TIMEOUT_S", 1.0)
    with pytest.raises(TrainingFailed, match=r"slow-never/probe did not start within 1 s; `ray status`"):
        actors.start_actor(_SlowToStart, "slow-never", "probe", 600.0)
    with pytest.raises(ValueError):  # no actor holds the name
        ray.get_actor(actor_name("slow-never", "probe"), namespace=RAY_NAMESPACE)
