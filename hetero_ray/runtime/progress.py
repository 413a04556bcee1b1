"""The driver's progress line while training runs: steps, samples/s, loss, per-rank shares."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import ray

from hetero_ray.formatting import format_duration


def format_progress(progress: dict, total_steps: Optional[int]) -> Optional[str]:
    """One line from :meth:`MetricsStore.progress`; None before the first step.

    ``total_steps`` is None where the run's length is the user loop's business.
    """
    if progress.get("global_step") is None:
        return None
    done = progress["global_step"] + 1
    parts = [f"step {done}{f'/{total_steps}' if total_steps else ''} (epoch {progress['epoch']})"]
    rate = progress.get("samples_per_s")
    if rate:
        parts.append(f"{rate:,.0f} samples/s")
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4f}")
    ranks = progress.get("ranks", {})
    shares = "/".join(str(r["local_batch_size"]) for r in ranks.values())
    busy = "/".join(f"{r['busy_time_s'] * 1000:.0f}" for r in ranks.values())
    parts.append(f"plan v{progress['plan_version']} shares {shares}")
    left_out = [str(rank) for rank, r in ranks.items() if r.get("probe_batch_size")]
    if left_out:  # the plan leaves them out: no samples, no all-reduce (they time a probe)
        parts.append(f"out {','.join(left_out)}")
    parts.append(f"busy ms {busy}")
    global_batch_size = sum(r["local_batch_size"] for r in ranks.values())
    if total_steps and done < total_steps and rate:
        parts.append(f"ETA {format_duration((total_steps - done) * global_batch_size / rate)}")
    return " | ".join(parts)


def restart_message(previous: dict, current: dict, previous_nodes: set, current_nodes: set) -> str:
    """What happened between two worker-group starts (attempts), for the operator."""
    parts = []
    lost = sorted(previous_nodes - current_nodes)
    joined = sorted(current_nodes - previous_nodes)
    if lost:
        parts.append(f"node{'s' if len(lost) > 1 else ''} {', '.join(n[:8] for n in lost)} lost")
    if joined:
        parts.append(f"node{'s' if len(joined) > 1 else ''} {', '.join(n[:8] for n in joined)} joined")
    if not parts:
        parts.append("worker group restarted")
    n = current["num_workers"]
    message = (f"{'; '.join(parts)}; continuing with {n} worker{'s' if n != 1 else ''} "
               f"from step {current['start_global_step']}")
    if n != previous["num_workers"]:
        message += f" (was {previous['num_workers']}; same global batch, plan recomputed)"
    return message


def attempt_nodes(attempts: list[dict], workers: dict) -> Optional[tuple[int, set]]:
    """The newest attempt and its workers' nodes once every registered worker is of that
    attempt (the store's ``attempts()`` and ``workers()``); None before."""
    if attempts and workers and all(w.get("attempt") == attempts[-1]["attempt"] for w in workers.values()):
        return attempts[-1]["attempt"], {w["node_id"] for w in workers.values()}
    return None


def waiting_line(workers_started: bool, waited_s: float) -> str:
    """Before the first step: Ray placing and starting the workers, then the loop's own
    start on them (imports, the model, the data; a node profile) up to its first step."""
    awaited = "the first step" if workers_started else "the workers to start"
    return f"[hetero_ray] waiting for {awaited} ({format_duration(waited_s)})…"


class ProgressPrinter:
    """Polls the metrics store in a background thread and prints a line every interval."""

    def __init__(self, store, total_steps: Optional[int], interval_s: float,
                 emit: Callable[[str], None] = print):
        self._store = store
        self._total_steps = total_steps
        self._interval_s = interval_s
        self._emit = emit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hetero-ray-progress")
        self._last_line: Optional[str] = None
        self._attempts_seen = 0
        self._nodes_by_attempt: dict[int, set] = {}
        self._pending_restart: Optional[tuple[dict, dict]] = None
        self._workers_started = False  # every registered worker is of the newest attempt

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
            self._watch_restarts()
            line = format_progress(progress, self._total_steps)
            if line is None:
                self._emit(waiting_line(self._workers_started, time.monotonic() - waiting_since))
            elif line != self._last_line:
                self._emit(f"[hetero_ray] {line}")
                self._last_line = line

    def _watch_restarts(self) -> None:
        """Says when the worker group restarted, and which nodes left or joined."""
        try:
            attempts = ray.get(self._store.attempts.remote(), timeout=self._interval_s)
            workers = ray.get(self._store.workers.remote(), timeout=self._interval_s)
        except Exception:  # noqa: BLE001 - the store restarting; next tick
            return
        started = attempt_nodes(attempts, workers)
        self._workers_started = started is not None
        if started is not None:
            self._nodes_by_attempt[started[0]] = started[1]
        if len(attempts) > self._attempts_seen:
            if self._attempts_seen > 0:
                self._pending_restart = (attempts[self._attempts_seen - 1], attempts[-1])
            self._attempts_seen = len(attempts)
        if self._pending_restart is not None:
            previous, current = self._pending_restart
            if current["attempt"] in self._nodes_by_attempt:  # its workers have registered
                message = restart_message(previous, current, self._nodes_by_attempt.get(previous["attempt"], set()),
                                          self._nodes_by_attempt[current["attempt"]])
                self._emit(f"[hetero_ray] {message}")
                self._pending_restart = None
