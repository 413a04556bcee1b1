"""The driver's progress line while training runs: steps, samples/s, loss, per-rank shares."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import ray


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_progress(progress: dict, total_steps: int) -> Optional[str]:
    """One line from :meth:`MetricsStore.progress`; None before the first step."""
    if progress.get("global_step") is None:
        return None
    done = progress["global_step"] + 1
    parts = [f"step {done}/{total_steps} (epoch {progress['epoch']})"]
    rate = progress.get("samples_per_s")
    if rate:
        parts.append(f"{rate:,.0f} samples/s")
    parts.append(f"loss {progress['loss']:.4f}")
    ranks = progress.get("ranks", {})
    shares = "/".join(str(r["local_batch_size"]) for r in ranks.values())
    busy = "/".join(f"{r['busy_time_s'] * 1000:.0f}" for r in ranks.values())
    parts.append(f"plan v{progress['plan_version']} shares {shares}")
    parts.append(f"busy ms {busy}")
    global_batch_size = sum(r["local_batch_size"] for r in ranks.values())
    if done < total_steps and rate:
        parts.append(f"ETA {format_duration((total_steps - done) * global_batch_size / rate)}")
    return " | ".join(parts)


class ProgressPrinter:
    """Polls the metrics store in a background thread and prints a line every interval."""

    def __init__(self, store, total_steps: int, interval_s: float,
                 emit: Callable[[str], None] = print):
        self._store = store
        self._total_steps = total_steps
        self._interval_s = interval_s
        self._emit = emit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hetero-ray-progress")
        self._last_line: Optional[str] = None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        waiting_since = time.monotonic()
        while not self._stop.wait(self._interval_s):
            try:
                progress = ray.get(self._store.progress.remote(), timeout=self._interval_s)
            except Exception:  # noqa: BLE001 - the store restarting; try again next tick
                continue
            line = format_progress(progress, self._total_steps)
            if line is None:
                self._emit(f"[hetero_ray] waiting for the workers to start "
                           f"({format_duration(time.monotonic() - waiting_since)})…")
            elif line != self._last_line:
                self._emit(f"[hetero_ray] {line}")
                self._last_line = line
