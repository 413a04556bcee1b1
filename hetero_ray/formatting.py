"""Numbers and durations as people read them, the same in the terminal and in the app."""

from __future__ import annotations

import math
from typing import Any, Optional


def format_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A right-aligned text table with a rule under the headers (None prints empty)."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_shares(sizes) -> str:
    """A plan's shares as one reads them: ``[36, 36, 17, 7]`` → ``36/36/17/7``."""
    return "/".join(str(int(b)) for b in sizes)


def format_list(items, limit: int = 8) -> str:
    """The first ``limit`` items, then how many more: ``0, 1, 2, … (+5)`` (ranks in a reason)."""
    items = list(items)
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (f" … (+{len(items) - limit})" if len(items) > limit else "")


def format_duration(seconds: Optional[float], compact: bool = True) -> str:
    """``75`` → ``1m15s`` (compact, for progress lines) or ``1 min 15 s``; ``–`` when unknown."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    seconds = int(max(0, seconds))
    s, m, h = ("s", "m", "h") if compact else (" s", " min", " h")
    gap = "" if compact else " "
    if seconds < 60:
        return f"{seconds}{s}"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}{m}{gap}{seconds:02d}{s}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}{h}{gap}{minutes:02d}{m}"
