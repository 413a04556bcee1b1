"""Stopping a run by hand: Ctrl-C (once, or three times) and SIGTERM (``ray job stop``).

A stopped run must say so: summary.json ``interrupted``, the tables holding the steps
trained up to the stop, and the driver exiting ``128 + signal`` (130, 143) with the
``--resume`` command. Which handler meets a signal depends on the moment (Ray 2.60):

- While ``trainer.fit()`` waits, Ray Train's own SIGINT handler is installed: the first
  Ctrl-C aborts its controller (the workers stop) and raises ``SystemExit(0)`` once the
  controller is gone; the third raises ``SystemExit(0)`` at once. The driver takes either
  as a stop (it cannot tell which signal from the exit code Ray chose, so it counts a stop
  it did not see itself as a Ctrl-C).
- ``ray.init`` installs a SIGTERM handler that raises ``SystemExit(15)`` and leaves Ray
  Train's controller training. :class:`StopSignals` replaces it for the run: a SIGTERM is
  handed to whatever handles SIGINT at that moment, so ``ray job stop`` stops the workers
  the same graceful way a Ctrl-C does.
- While the run's files are written (:meth:`StopSignals.finishing`) both signals are only
  noted: a second or third Ctrl-C must not cut summary.json short. That writing is
  bounded by its own timeouts; SIGKILL still ends the driver at once.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class StopSignals:
    """Notes SIGINT and SIGTERM while the driver runs a job, from :meth:`install` to
    :meth:`restore`. Off the main thread (where Python allows no handlers) it notes nothing
    and the handlers in place stay."""

    def __init__(self):
        self.received: Optional[int] = None  # the first stop signal, if one came
        self._previous: dict[int, object] = {}
        self._finishing = False
        self._said: set[str] = set()

    def install(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNAL_NAMES:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Puts back the handlers :meth:`install` replaced (Ray's SIGTERM handler, Python's
        KeyboardInterrupt), not the one Ray Train left behind for a controller now gone."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def finishing(self) -> None:
        """From now on a stop signal is noted, never raised: the run's files are being
        written. Takes SIGINT back from Ray Train, whose handler stays after ``fit()``."""
        self._finishing = True
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def stopped_by(self) -> int:
        """The signal that stopped training; a stop this object did not see was Ray
        Train's SIGINT handler's (see the module docstring)."""
        return self.received or signal.SIGINT

    def _handle(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum
        if self._finishing:
            self._say("[hetero_ray] stopping: writing what was recorded first (seconds; SIGKILL stops at once "
                      "and leaves summary.json unwritten)")
            return
        if signum == signal.SIGTERM:
            self._say("[hetero_ray] SIGTERM: stopping the workers")
            on_sigint = signal.getsignal(signal.SIGINT)
            if callable(on_sigint) and on_sigint != self._handle:
                on_sigint(signal.SIGINT, frame)  # Ray Train's graceful abort while fit() runs
                return
        raise KeyboardInterrupt

    def _say(self, line: str) -> None:
        """Once per line. os.write, not print: a handler that prints while the main thread
        prints to the same stream raises "reentrant call" in the middle of the driver's work."""
        if line not in self._said:
            self._said.add(line)
            try:
                os.write(2, (line + "\n").encode())
            except OSError:
                pass
