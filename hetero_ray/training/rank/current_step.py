"""The step a rank is running, for the code that runs inside it without being handed it.

The loader begins a step when it hands out the step's batch and ends it when the step is
recorded (:mod:`hetero_ray.training.data.loader`). In between, two kinds of code add to it:
the prepared model's hooks, which autograd and the all-reduce thread call with no way to
pass them the step (:mod:`hetero_ray.training.gradients.model_prep`), and the built-in loop, which
knows the step's loss and learning rate for its row. Both find the step here, in the one
:class:`CurrentStep` the worker's session owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hetero_ray.training.timing.steps import StepTimeline


@dataclass(frozen=True)
class StepNotes:
    """What the loop knows of its step for the steps table; a user's loop reports its
    own metrics instead, and leaves both None."""

    loss: Optional[float] = None  # None where the rank held no sample of the step
    lr: Optional[float] = None


class CurrentStep:
    def __init__(self):
        self._timeline: Optional[StepTimeline] = None
        self._notes = StepNotes()

    @property
    def timeline(self) -> Optional[StepTimeline]:
        """The timeline of the step in progress; None between steps (a backward pass
        outside a training step, such as a warm-up or an evaluation, is not timed)."""
        return self._timeline

    def begin(self, timeline: StepTimeline) -> None:
        self._timeline, self._notes = timeline, StepNotes()

    def note(self, notes: StepNotes) -> None:
        self._notes = notes

    def end(self) -> StepNotes:
        """The step is over: the hooks stop marking it; returns what the loop noted."""
        notes, self._timeline, self._notes = self._notes, None, StepNotes()
        return notes
