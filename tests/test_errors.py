"""hetero_ray.errors is the one place a user imports the errors ``fit()`` and the CLI raise
from: its ``__all__`` is what it defines, LoopFailsEveryTime is among them (a UserError),
and a failed run's error keeps that type on its way out of ``fit()``. No Ray is started."""

from __future__ import annotations

import hetero_ray.errors as errors
from hetero_ray.errors import LoopFailsEveryTime, UserError


def test_all_names_what_the_module_defines():
    namespace: dict = {}
    exec("from hetero_ray.errors import *", namespace)
    assert set(errors.__all__) == {n for n in namespace if not n.startswith("__")}
    assert {"UserError", "ConfigError", "LoopFailsEveryTime", "TrainingFailed", "RunInterrupted",
            "USER_ERROR_EXIT_CODE", "TRAINING_FAILED_EXIT_CODE"} == set(errors.__all__)
    assert all(getattr(errors, name).__module__ == "hetero_ray.errors"
               for name in errors.__all__ if isinstance(getattr(errors, name), type))


def test_loop_fails_every_time_is_a_user_error_and_its_old_home_still_imports():
    from hetero_ray.runtime.failures import LoopFailsEveryTime as from_runtime

    assert issubclass(LoopFailsEveryTime, UserError)
    assert from_runtime is LoopFailsEveryTime


def test_a_failed_run_keeps_the_type_fit_raises():
    from hetero_ray.runtime.failures import failure_for_user

    try:
        try:
            raise LoopFailsEveryTime("train_loop_per_worker raised ValueError: boom at global step 5 on every rank")
        except LoopFailsEveryTime as cause:
            raise RuntimeError("the controller stopped the run") from cause
    except RuntimeError as error:
        raised = failure_for_user(error, "runs/r1", 5)
    assert type(raised) is LoopFailsEveryTime
    assert "boom at global step 5" in str(raised) and "runs/r1" in str(raised)

    try:
        raise RuntimeError("wrapped") from UserError("a corrupt checkpoint")
    except RuntimeError as error:
        assert type(failure_for_user(error, "runs/r1", 5)) is UserError
