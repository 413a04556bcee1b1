"""What every Ray Train worker runs for a HeteroTrainer: the session around the user's loop.

:func:`run_user_loop` is the ``train_loop_per_worker`` handed to Ray Train. It restores
hetero_ray's part of the checkpoint (on a restart), starts the worker's session (a
collective: attempt id, where every rank runs), calls the user's function with the
user's config, and closes the session whatever happens, so the last step rows reach the
store. A user mistake that torch reports deep inside autograd comes back as a
:class:`UserError` that says what to change; the run then stops without retries.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import ray.train

from hetero_ray.errors import UserError
from hetero_ray.training import session as worker_session
from hetero_ray.training.allocator import keep_freed_memory
from hetero_ray.training.reporting import read_state

_NON_SCALAR_LOSS = "grad can be implicitly created only for scalar outputs"


def run_user_loop(user_loop: Callable, settings: dict, config: dict) -> None:
    _quiet_ray_train_reports()
    keep_freed_memory()  # no page faults through the same activations every step
    checkpoint = ray.train.get_checkpoint()
    restored = read_state(checkpoint) if checkpoint is not None else None
    worker_session.start(worker_session.WorkerSettings.from_dict(settings), restored)
    try:
        if takes_config(user_loop):
            user_loop(config)
        else:
            user_loop()
    except RuntimeError as e:
        if _NON_SCALAR_LOSS in str(e):
            raise UserError(
                "the loss given to backward() is not a scalar: hetero_ray expects the mean over this "
                "rank's local batch (a 0-dim tensor; reduce with .mean(), or see hetero_ray.train."
                "token_weighted_loss for per-token losses)"
            ) from None
        raise
    finally:
        worker_session.stop()


def takes_config(user_loop: Callable) -> bool:
    """Whether the loop takes the config argument (Ray Train accepts both shapes).

    Raises:
        UserError: it takes more than one required argument.
    """
    try:
        parameters = inspect.signature(user_loop).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: Ray Train's rule, one argument
        return True
    required = [p for p in parameters if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) > 1:
        raise UserError(f"train_loop_per_worker takes at most one argument (the config dict); "
                        f"{getattr(user_loop, '__name__', user_loop)!s} requires {len(required)}")
    return bool(required) or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def _quiet_ray_train_reports() -> None:
    # Ray Train logs every report at INFO through a logger named after its file, which the
    # run's LoggingConfig does not reach; the driver's progress line says what matters.
    from ray.train.v2._internal.execution import context as train_context_module

    logging.getLogger(train_context_module.__file__).setLevel(logging.WARNING)


def call_for(user_loop: Callable, settings: dict) -> Callable[[Any], None]:
    """The one-argument function Ray Train runs on every worker (Ray Train passes the
    config only to a function with one required argument)."""
    import functools

    return functools.partial(run_user_loop, user_loop, settings)
