"""What every Ray Train worker runs for a HeteroTrainer: the session around the user's loop.

:func:`run_user_loop` is the ``train_loop_per_worker`` handed to Ray Train. It restores
hetero_ray's part of the checkpoint (on a restart), starts the worker's session (a
collective), calls the user's function with the user's config, and closes the session
whatever happens, so the last step rows reach the store. A mistake torch reports deep inside
autograd, and an error the loop raises before this rank completed a step in the worker group
(unless a restart can cure it), come back as a :class:`UserError`: the run stops without
retries. Later errors a restart cannot cure are marked with their global step
(:func:`failed_at_step`) for the driver's :class:`~hetero_ray.runtime.failures.RunGuard`.
Why: docs/worker-runtime.md#the-ranks-session
"""

from __future__ import annotations

import inspect
import logging
import traceback
from typing import Any, Callable

import ray.train

from hetero_ray.errors import UserError
from hetero_ray.training.rank import session as worker_session
from hetero_ray.training.rank.allocator import keep_freed_memory
from hetero_ray.training.rank.loop_report import read_state

_NON_SCALAR_LOSS = "grad can be implicitly created only for scalar outputs"


def run_user_loop(user_loop: Callable, settings: dict, config: dict) -> None:
    _quiet_ray_train_reports()
    keep_freed_memory()  # no page faults through the same activations every step
    checkpoint = ray.train.get_checkpoint()
    restored = read_state(checkpoint) if checkpoint is not None else None
    session = worker_session.start(worker_session.WorkerSettings.from_dict(settings), restored)
    try:
        if takes_config(user_loop):
            user_loop(config)
        else:
            user_loop()
    except UserError:
        raise
    except RuntimeError as e:
        if _NON_SCALAR_LOSS in str(e):
            raise UserError(
                "the loss given to backward() is not a scalar: hetero_ray expects the mean over this "
                "rank's local batch (a 0-dim tensor; reduce with .mean(), or see hetero_ray.train."
                "token_weighted_loss for per-token losses)"
            ) from None
        _stop_if_it_will_happen_again(session, e)
        raise
    except Exception as e:  # noqa: BLE001 - classified, then raised again
        _stop_if_it_will_happen_again(session, e)
        raise
    finally:
        worker_session.stop()


class LoopFailedBeforeFirstStep(UserError):
    """The user's loop raised before this rank completed a step: a restart would meet it again."""


# Messages of errors torch raises when a peer of the process group is gone (gloo, NCCL).
_LOST_PEER_WORDS = ("gloo", "nccl", "connection", "connect", "peer", "socket", "timed out", "timeout")


def restart_can_cure(error: BaseException) -> bool:
    """Whether ``error`` may come from a peer or the cluster rather than the code: a rank
    whose peer died fails inside a collective, and Ray reports lost actors and nodes."""
    import ray.exceptions
    import torch.distributed

    if isinstance(error, (ray.exceptions.RayError, torch.distributed.DistError, ConnectionError, TimeoutError,
                          MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _LOST_PEER_WORDS)


def completed_a_step(session: worker_session.WorkerSession) -> bool:
    """Whether this rank trained a step in this worker group: its prepared model's gradient
    was all-reduced, or (a model not prepared) the loader moved past where the group
    started. Not the loader alone: a loop left by an exception still closes the loader's
    iteration, as a ``break`` does."""
    model, loader = session.parts.model, session.parts.loader
    if model is not None:
        return model.weight_state.backward_passes > 0
    return loader is not None and loader.position.global_step > session.restored_position.global_step


# The attribute that carries the global step a rank's loop failed at to the driver.
FAILED_AT_STEP_ATTR = "hetero_ray_failed_at_global_step"


def failed_at_step(error: BaseException):
    """The global step the user's loop raised ``error`` at (None: not marked, e.g. an
    error a restart can cure)."""
    return getattr(error, FAILED_AT_STEP_ATTR, None)


def _stop_if_it_will_happen_again(session: worker_session.WorkerSession, error: Exception) -> None:
    if restart_can_cure(error):
        return
    if completed_a_step(session):
        if session.parts.loader is not None:  # for RunGuard: the same error at the same step will happen again
            try:
                setattr(error, FAILED_AT_STEP_ATTR, session.parts.loader.position.global_step)
            except AttributeError:  # an exception that takes no attributes: retried as before
                pass
        return
    rank = session.identity.rank
    where = "traceback (most recent call last):\n" + "".join(traceback.format_tb(error.__traceback__))
    raise LoopFailedBeforeFirstStep(
        f"train_loop_per_worker raised {type(error).__name__}: {error} on rank {rank} before its first step "
        f"completed, and a restart would meet it again. Fix the loop "
        f"and run again. The loop's {where}".rstrip()) from error


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
