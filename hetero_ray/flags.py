"""How settings are written on the command line: a configuration field declared with
:func:`setting` carries its flag, help and parser, and :func:`add_flags` /
:func:`settings_from_args` turn a configuration class into argparse flags and back, so the
CLI is generated from the configuration instead of being written out beside it.

The parsers (``"40,24"`` → ``[40, 24]``) read text and reject only what the notation
cannot mean; ranges are the configurations' to check (:mod:`hetero_ray.validate`). This
module sits below both the configurations and the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hetero_ray.validate import flag_of

FLAG = "hetero_ray.flag"  # the key of a field's metadata that holds its Flag


@dataclass(frozen=True)
class Flag:
    """How one setting is written on the command line.

    Attributes:
        help: what the flag does (for a switch that is on by default, what its ``--no-…``
            does); ``(default …)`` is added from the field's default.
        type: parses the flag's text (default: kept as text).
        metavar: how the value is shown in ``--help``.
        repeat: the flag may be given several times; the setting is the list of values.
        sets: the fields one parsed value fills, in order (default: its own field alone).
        aliases: older spellings of the flag, still accepted with a deprecation message
            (:class:`DeprecatedFlag`) and hidden from ``--help``.
    """

    help: str
    type: Optional[Callable[[str], Any]] = None
    metavar: Optional[str] = None
    repeat: bool = False
    sets: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()


def setting(default=dataclasses.MISSING, help: str = "", *, default_factory=dataclasses.MISSING,
            **flag) -> Any:
    """A configuration field that is also a flag (see :class:`Flag` for ``flag``'s keys)."""
    return field(default=default, default_factory=default_factory, metadata={FLAG: Flag(help, **flag)})


def flag_name(f: dataclasses.Field) -> str:
    """What the user types for field ``f``: ``--field-name``; ``--no-field-name`` for a switch
    that is on by default (one name per setting: the flag is the field's)."""
    dashed = flag_of(f.name)
    if f.metadata.get(FLAG) is not None and f.default is True:
        return "--no-" + dashed[2:]
    return dashed


def add_flags(parser, config_class) -> None:
    """One flag per field of the dataclass ``config_class`` that declares one (:func:`setting`).

    Args:
        parser: an ``argparse`` parser or argument group.
    """
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for f in fields.values():
        flag = f.metadata.get(FLAG)
        if flag is None:
            continue  # set through another field's flag (see Flag.sets)
        options: dict[str, Any] = {"dest": f.name, "help": flag.help}
        if f.default is dataclasses.MISSING:
            options["default"] = argparse.SUPPRESS  # the configuration makes it (a default_factory)
        elif flag.sets:
            options["default"] = tuple(fields[name].default for name in flag.sets)
        else:
            options["default"] = f.default
        if isinstance(f.default, bool):
            options["action"] = "store_false" if f.default else "store_true"
        else:
            if flag.type is not None:
                options["type"] = flag.type
            if flag.metavar is not None:
                options["metavar"] = flag.metavar
            if flag.repeat:
                options["action"] = "append"
            shown = _shown(options["default"], several_fields=bool(flag.sets))
            if shown:
                options["help"] = f"{flag.help} (default {shown})"
        parser.add_argument(flag_name(f), **options)
        for alias in flag.aliases:
            add_deprecated_alias(parser, alias, flag_name(f), dest=f.name, type=flag.type, repeat=flag.repeat)


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag: sets the same value as the new one (appends, for a
    repeatable flag) and says on stderr which flag to use instead. Hidden from ``--help``;
    ``docs/cli.md`` lists it under its command."""

    def __init__(self, option_strings, dest, use: str, repeat: bool = False, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.use = use
        self.repeat = repeat

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated and will be removed; use {self.use} "
              f"(same value)", file=sys.stderr)
        if self.repeat:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser, alias: str, use: str, *, dest: str, type: Optional[Callable[[str], Any]] = None,
                         repeat: bool = False) -> None:
    """Accepts ``alias`` as an old spelling of the flag ``use`` (see :class:`DeprecatedFlag`)."""
    parser.add_argument(alias, dest=dest, action=DeprecatedFlag, use=use, repeat=repeat, type=type,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def settings_from_args(args: argparse.Namespace, config_class) -> dict[str, Any]:
    """The fields of ``config_class`` that :func:`add_flags` added, as parsed into ``args``."""
    settings = {}
    for f in dataclasses.fields(config_class):
        flag = f.metadata.get(FLAG)
        if flag is None or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if flag.sets:
            settings.update(zip(flag.sets, value))
        else:
            settings[f.name] = value
    return settings


def _shown(default, several_fields: bool = False) -> str:
    """A default as ``--help`` shows it; empty for none (unset, or a switch)."""
    if default is None or default is argparse.SUPPRESS:
        return ""
    if several_fields:  # one value per field the flag sets (Flag.sets): MIN-MAX
        return "-".join(str(v) for v in default if v is not None)
    if isinstance(default, (list, tuple)):  # a list setting (a frozen default is a tuple)
        return ",".join(map(str, default))
    return str(default)


# --- parsers: the text of one flag → its value


def int_list(text: str) -> list[int]:
    """``"40,24"`` → ``[40, 24]``."""
    try:
        return [int(v) for v in _items(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 40,24; got {text!r}") from None


def float_list(text: str) -> list[float]:
    """``"1,0.5"`` → ``[1.0, 0.5]``."""
    try:
        return [float(v) for v in _items(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,0.5; got {text!r}") from None


def worker_range(text: str) -> tuple[Optional[int], int]:
    """``"4"`` → ``(None, 4)``; ``"2-4"`` → ``(2, 4)``: the least workers (elastic), and the most."""
    low, sep, high = text.partition("-")
    try:
        if not sep:
            return None, int(text)
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX (e.g. 4 or 2-4); got {text!r}") from None


def str_list(text: str) -> list[str]:
    """``"gpu,gpu,cpu"`` → ``["gpu", "gpu", "cpu"]``."""
    try:
        return _items(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated values like gpu,gpu,cpu; got {text!r}") from None


def speed_change(text: str) -> dict:
    """``"STEP:RANK:SPEED"`` → ``{"global_step": STEP, "rank": RANK, "speed": SPEED}``."""
    try:
        step, rank, speed = text.split(":")
        change = {"global_step": int(step), "rank": int(rank), "speed": float(speed)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP:RANK:SPEED like 200:1:0.5; got {text!r}") from None
    if change["global_step"] < 0 or change["rank"] < 0 or not 0 < change["speed"] <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: STEP and RANK must be ≥ 0 and SPEED in (0, 1]")
    return change


def plan_change(text: str) -> dict:
    """``"STEP:B0,B1,…"`` → ``{"global_step": STEP, "local_batch_sizes": [B0, B1, …]}``."""
    step, _, sizes = text.partition(":")
    try:
        change = {"global_step": int(step), "local_batch_sizes": [int(v) for v in _items(sizes)]}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP:B0,B1,... like 100:40,24; got {text!r}") from None
    if change["global_step"] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: STEP must be ≥ 0")
    return change


def label_selectors(text: str) -> list[dict]:
    """``"gpu=h100;cpu-only=1,zone=a"`` → one selector per worker, ``;`` between workers."""
    selectors = []
    for worker in text.split(";"):
        selector = {}
        for item in filter(None, (i.strip() for i in worker.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise argparse.ArgumentTypeError(
                    f"expected KEY=VALUE pairs per worker, workers separated by ';' (e.g. gpu=h100;cpu-only=1); "
                    f"got {text!r}")
            selector[key.strip()] = value.strip()
        selectors.append(selector)
    return selectors


def _items(text: str) -> list[str]:
    items = [v.strip() for v in text.split(",")]
    if not items or any(v == "" for v in items):
        raise ValueError(text)
    return items
