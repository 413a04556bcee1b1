"""``hetero-ray train``: flags → :class:`TrainConfig` → :func:`run_training` → summary.

The flags are :class:`TrainConfig`'s settings: each part of the configuration is a group
of ``--help``, each field declares its flag (:func:`hetero_ray.flags.setting`). The same
flags serve ``jobs/train.py`` (the ``ray job submit`` entrypoint).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Sequence

from hetero_ray import flags
from hetero_ray.builtin.config import TrainConfig, part_title, parts
from hetero_ray.errors import RunInterrupted

HELP = "train a model (starts a local Ray unless --address or RAY_ADDRESS is given)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for name, part in parts().items():
        flags.add_flags(parser.add_argument_group(part_title(name)), part)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The configuration the flags give; raises ConfigError on bad values."""
    settings = {}
    for part in parts().values():
        settings.update(flags.settings_from_args(args, part))
    return TrainConfig(**settings)


def run(args: argparse.Namespace) -> int:
    from hetero_ray.builtin.driver import run_training
    from hetero_ray.reporting.summary_text import print_run_summary

    config = config_from_args(args)
    try:
        result = run_training(config)
    except RunInterrupted as e:
        if not e.resumable:
            raise
        command = resume_command(getattr(args, "argv", None) or ["train"])
        raise RunInterrupted(f"{e}. Continue it with:\n  {command}", e.signum, e.resumable) from None
    print_run_summary(result.summary)
    return 0


def resume_command(argv: Sequence[str]) -> str:
    """The command line that continues this run: the program as started, the same flags
    (a resume must repeat the run's settings) and --resume.

    Args:
        argv: the arguments as given to ``hetero-ray``, ``train`` first.
    """
    given = [a for a in argv[1:] if a != "--resume"]
    return shlex.join([*_train_program(), *given, "--resume"])


def _train_program() -> list[str]:
    """How this process's ``train`` was started, as a person would type it again."""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if os.path.basename(script) == "__main__.py":
        return ["python", "-m", "hetero_ray", "train"]
    if script.endswith(".py") and os.path.basename(os.path.dirname(os.path.abspath(script))) == "jobs":
        return ["python", script]  # jobs/train.py, the `ray job submit` entrypoint: no subcommand
    return ["hetero-ray", "train"]
