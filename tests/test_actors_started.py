"""The driver starts a run's actors without waiting for them; Ray Train's controller waits
(runtime/actors.py ``ActorsStarted``) before its first worker group, and one whose
constructor failed ends the run at once, naming the actor and its error (real actors on
the shared local Ray)."""

from __future__ import annotations

import pytest

from hetero_ray.errors import TrainingFailed, UserError
from hetero_ray.runtime import actors

pytestmark = pytest.mark.ray


class Up:
    def ping(self) -> str:
        return "up"


class Broken:
    def __init__(self):
        raise OSError("the run directory is gone")


def test_the_controller_waits_for_the_runs_actors_and_stops_at_one_that_did_not_start(ray_session):
    up = actors.start_actor(Up, "started-check", "up", wait=False)
    broken = actors.start_actor(Broken, "started-check", "broken", wait=False)
    try:
        with pytest.raises(UserError, match="already running"):  # refused at once, not waited for
            actors.start_actor(Up, "started-check", "up", wait=False)
        actors.ActorsStarted({"started-check/up": up}).after_controller_start(None)
        assert ray_session.get(up.ping.remote(), timeout=5) == "up"
        with pytest.raises(TrainingFailed, match=r"the run's actor started-check/broken could not start: "
                                                 r"(?s:.*)the run directory is gone"):
            actors.ActorsStarted({"started-check/up": up, "started-check/broken": broken}).after_controller_start(None)
    finally:
        for handle in (up, broken):
            actors.kill_actor(handle)
