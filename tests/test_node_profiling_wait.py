"""The CPU-only nodes of a GPU cluster are profiled once the first plan is made, even when
the run ends before the next question (runtime/node_profiling.py: wait_for_first_plan)."""

from __future__ import annotations

import threading

from hetero_ray.runtime.node_profiling import wait_for_first_plan


class Answers:
    """The planner's answers to "is the first plan made?", in order (the last one repeats);
    ``then`` runs after each question (the run ending between two questions)."""

    def __init__(self, *answers: bool, then=lambda: None):
        self.answers, self.then, self.asked = list(answers), then, 0

    def __call__(self) -> bool:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        self.then()
        return answer


def test_a_plan_made_while_waiting_is_seen():
    finishing = threading.Event()
    answers = Answers(False, False, True)
    assert wait_for_first_plan(answers, finishing, poll_s=0.0)
    assert answers.asked == 3


def test_a_run_that_ends_right_after_its_first_plan_still_gets_its_profiles():
    finishing = threading.Event()
    # Asked once before the plan; the plan is made and the run ends before the next question.
    answers = Answers(False, True, then=finishing.set)
    assert wait_for_first_plan(answers, finishing, poll_s=60.0)
    assert answers.asked == 2


def test_a_run_that_ends_before_its_first_plan_profiles_nothing():
    finishing = threading.Event()
    answers = Answers(False, then=finishing.set)
    assert not wait_for_first_plan(answers, finishing, poll_s=60.0)
    assert answers.asked == 2


def test_an_ended_run_with_a_plan_is_asked_once():
    finishing = threading.Event()
    finishing.set()
    answers = Answers(True)
    assert wait_for_first_plan(answers, finishing, poll_s=60.0)
    assert answers.asked == 1
