"""Argument types shared by the subcommands: parse strings, leave range checks to the configs."""

from __future__ import annotations

import argparse
from typing import Optional


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


def worker_range(text: str) -> tuple[int, Optional[int]]:
    """``"4"`` → ``(4, None)``; ``"2-4"`` → ``(4, 2)``: the most workers, and the least (elastic)."""
    low, sep, high = text.partition("-")
    try:
        if not sep:
            return int(text), None
        return int(high), int(low)
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


class ErrorExitParser(argparse.ArgumentParser):
    """argparse exits with code 2 on bad flags already; this adds the hint to --help."""

    def error(self, message: str):
        self.print_usage()
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")
