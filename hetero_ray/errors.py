"""Errors a person can act on.

A :class:`UserError` means the input (flags, files, cluster state) is wrong; the CLI
prints its message and exits with :data:`USER_ERROR_EXIT_CODE`, before any run
directory exists.
"""

__all__ = [
    "USER_ERROR_EXIT_CODE", "TRAINING_FAILED_EXIT_CODE",
    "UserError", "ConfigError", "LoopFailsEveryTime", "TrainingFailed", "RunInterrupted",
]

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do about it."""


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the option and the accepted range."""


class LoopFailsEveryTime(UserError):
    """The user's loop raised an exception that a restart would meet again: every rank
    raised it at the same global step, or a restarted worker group met it again at the step
    an earlier group raised it. ``fit()`` raises it without retrying; the message carries the
    loop's traceback."""


class TrainingFailed(RuntimeError):
    """Training stopped with an error after the run directory was created."""


TRAINING_FAILED_EXIT_CODE = 1


class RunInterrupted(Exception):
    """A signal (Ctrl-C, SIGTERM) stopped the run after it started; its files hold what was
    recorded up to the stop, and summary.json says ``interrupted``.

    The CLI exits with ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), as a shell
    reports a process a signal ended, and prints the ``--resume`` command when
    ``resumable`` (a checkpoint was registered before the stop).
    """

    def __init__(self, message: str, signum: int, resumable: bool):
        super().__init__(message)
        self.signum = signum
        self.resumable = resumable

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
