"""Errors a person can act on.

A :class:`UserError` means the input (flags, files, cluster state) is wrong; the CLI
prints its message and exits with :data:`USER_ERROR_EXIT_CODE`, before any run
directory exists.
"""

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """Bad input: the message says what is wrong and what to do about it."""


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the option and the accepted range."""


class TrainingFailed(RuntimeError):
    """Training stopped with an error after the run directory was created."""


TRAINING_FAILED_EXIT_CODE = 1
