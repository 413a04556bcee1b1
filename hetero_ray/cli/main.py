"""``hetero-ray``: the command line entry point (also ``python -m hetero_ray``).

    hetero-ray train --model simple_cnn --num-workers 4 --emulate-speeds 1,1,0.5,0.25 --policy proportional

Heavy imports (torch, ray) happen inside the subcommands, so ``--help`` and bad flags
answer at once.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from hetero_ray.cli import train
from hetero_ray.cli.args import ErrorExitParser
from hetero_ray.errors import TRAINING_FAILED_EXIT_CODE, USER_ERROR_EXIT_CODE, TrainingFailed, UserError


def build_parser() -> ErrorExitParser:
    parser = ErrorExitParser(prog="hetero-ray", description=(
        "Data-parallel PyTorch training on heterogeneous Ray clusters: each rank gets the "
        "share of the global batch that matches its speed."))
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ErrorExitParser)
    commands.required = True
    train_parser = commands.add_parser("train", help="train a model (starts a local Ray unless --address or RAY_ADDRESS)")
    train.add_arguments(train_parser)
    train_parser.set_defaults(handler=train.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UserError as e:
        print(f"hetero-ray {args.command}: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except TrainingFailed as e:
        print(f"hetero-ray {args.command}: {e}", file=sys.stderr)
        return TRAINING_FAILED_EXIT_CODE
    except KeyboardInterrupt:
        print(f"hetero-ray {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
