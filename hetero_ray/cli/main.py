"""``hetero-ray``: the command line entry point (also ``python -m hetero_ray``).

    hetero-ray train --model simple_cnn --num-workers 4 --emulate-speeds 1,1,0.5,0.25
    hetero-ray profile --model simple_cnn --json nodes.json
    hetero-ray plan --profile nodes.json --global-batch-size 512 --workers gpu,cpu*3
    hetero-ray dashboard --runs-dir runs
    hetero-ray report runs/my-run

Each subcommand is a module ``hetero_ray.cli.<name>`` with ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int``. Heavy imports (torch, ray) happen inside ``run``, so ``--help``
and bad flags answer at once.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

from hetero_ray.cli.args import ErrorExitParser
from hetero_ray.runtime.auth import prepare_auth_env
from hetero_ray.errors import (
    TRAINING_FAILED_EXIT_CODE, USER_ERROR_EXIT_CODE, RunInterrupted, TrainingFailed, UserError,
)

SUBCOMMANDS = ("train", "profile", "plan", "dashboard", "report")


def build_parser() -> ErrorExitParser:
    parser = ErrorExitParser(prog="hetero-ray", description=(
        "Data-parallel PyTorch training on heterogeneous Ray clusters: each rank gets the "
        "share of the global batch that matches its speed."))
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ErrorExitParser)
    commands.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"hetero_ray.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"hetero_ray.cli.{name}":
                continue  # not part of this build
            raise
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # as given: an interrupted `train` prints it back with --resume
    prepare_auth_env(getattr(args, "address", None))  # before Ray is imported: it reads this once
    try:
        return args.handler(args)
    except UserError as e:
        print(f"hetero-ray {args.command}: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except TrainingFailed as e:
        print(f"hetero-ray {args.command}: {e}", file=sys.stderr)
        return TRAINING_FAILED_EXIT_CODE
    except RunInterrupted as e:  # stopped by a signal: 128 + its number, as a shell says
        print(f"hetero-ray {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"hetero-ray {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
