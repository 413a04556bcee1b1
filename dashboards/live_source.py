"""A running experiment's data for the app: :class:`LiveRunSource`.

It asks the experiment's metrics store for what is new since its cursors (one round
trip per refresh, through :class:`~hetero_ray_dashboards.ray_bridge.RayBridge`) and keeps
a bounded window of step rows in memory. The offline source, which the HTML report
shares, is :class:`hetero_ray.reporting.run_source.OfflineRunSource`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional

import pandas as pd

from hetero_ray.reporting.run_source import RunSource, normalise_nodes
from hetero_ray.reporting.verdicts import classify_recent
from hetero_ray.runs.records import DECISIONS, EPOCHS, PLANS, SCHEMAS, STEPS
from hetero_ray.runs.trajectory import effective_rows

if TYPE_CHECKING:  # the store hands over its steps as one Arrow table
    import pyarrow as pa

LIVE_REFRESH_MIN_S = 0.5  # browsers refreshing together share one store round trip
LIVE_MAX_ROWS = 400_000  # step rows a live source keeps (the store keeps 200k by default)


class LiveRunSource(RunSource):
    """A running experiment, fed by its metrics store's increments."""

    live = True

    def __init__(self, key: str, experiment: str, bridge, config: Optional[dict] = None,
                 offline_key: Optional[str] = None, max_rows: int = LIVE_MAX_ROWS):
        super().__init__()
        self.key, self.name, self.experiment = key, experiment, experiment
        self.offline_key = offline_key  # the same run's directory under runs_dir, if it is there
        self._config = dict(config or {})
        self._bridge = bridge
        self._max_rows = max_rows
        self._lock = threading.Lock()
        self._cursors: dict[str, int] = {}
        self._chunks: list[pd.DataFrame] = []
        self._steps = SCHEMAS[STEPS].empty_table().to_pandas()
        self._plans: list[dict] = []
        self._epochs: list[dict] = []
        self._decisions: list[dict] = []
        self._info: dict[str, Any] = {}
        self._nodes: Optional[list[dict]] = None
        self._version = 0
        self._last_refresh = 0.0
        self._missed = 0
        self._dropped = 0
        self.gone = False  # the experiment's store stopped (the run ended)
        self.error: Optional[str] = None

    def refresh(self) -> None:
        """One round trip (more while the store has a backlog); shared by all browsers."""
        from hetero_ray_dashboards.ray_bridge import BridgeUnavailable, ExperimentGone

        with self._lock:
            if time.monotonic() - self._last_refresh < LIVE_REFRESH_MIN_S or self.gone:
                return
            self._last_refresh = time.monotonic()
            try:
                for _ in range(20):  # backlog of at most 20 × 50k rows per refresh
                    update = self._bridge.updates(self.experiment, dict(self._cursors))
                    self._apply(update)
                    if not update.get("more"):
                        break
                if self._nodes is None:
                    self._nodes = normalise_nodes(self._bridge.call(self.experiment, "capabilities"))
                self.error = None
            except ExperimentGone:
                self.gone, self.error = True, None
            except BridgeUnavailable as e:
                self.error = str(e)

    def _apply(self, update: dict) -> None:
        table: pa.Table = update["steps"]
        self._missed += int(update.get("missed_steps") or 0)
        if table.num_rows:
            self._chunks.append(table.to_pandas())
        self._plans.extend(update.get("plans") or [])
        self._epochs.extend(update.get("epochs") or [])
        self._decisions.extend(update.get("decisions") or [])
        self._info = update.get("info") or self._info
        changed = table.num_rows or update.get("plans") or update.get("epochs") or update.get("decisions")
        self._cursors = dict(update["cursors"])
        if changed:
            self._version += 1

    def version(self) -> Any:
        return self._version

    def steps(self) -> pd.DataFrame:
        with self._lock:
            if self._chunks:
                steps = pd.concat([self._steps, *self._chunks], ignore_index=True) if not self._steps.empty \
                    else pd.concat(self._chunks, ignore_index=True)
                if len(steps) > self._max_rows:  # bounded: the oldest rows go (they are on disk)
                    self._dropped += len(steps) - self._max_rows
                    steps = steps.iloc[len(steps) - self._max_rows:].reset_index(drop=True)
                self._steps, self._chunks = steps, []
            steps = self._steps
            starts = self._attempt_starts()
        if len(starts) > 1:
            steps = effective_rows(steps, starts)
        return steps

    def _attempt_starts(self) -> dict[int, int]:
        return {int(a): int(s) for a, s in (self._info.get("attempt_starts") or {}).items()}

    def plans(self) -> pd.DataFrame:
        return _frame(PLANS, self._plans)

    def epochs(self) -> pd.DataFrame:
        return _frame(EPOCHS, self._epochs)

    def decisions(self) -> pd.DataFrame:
        return _frame(DECISIONS, self._decisions)

    def nodes(self) -> list[dict]:
        return self._nodes or []

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def config(self) -> dict[str, Any]:
        # The store does not hold the config; the run directory does, when it lies under
        # runs_dir (RunCatalog passes it in).
        return dict(self._config)

    def status(self) -> str:
        return "finished" if self.gone else "running"

    def active(self) -> bool:
        return not self.gone

    def bottlenecks(self) -> tuple[list[dict], Optional[str]]:
        """The one rule (as the driver's summary applies it) on the steps and profiles held here."""
        return classify_recent(self.steps(), self.nodes())

    def notice(self) -> Optional[str]:
        if self.error:
            return self.error
        if self.gone:
            return f"experiment {self.experiment} has ended; choose its run directory in the list for the full record"
        if self._missed or self._dropped:
            return (f"showing the most recent {len(self._steps):,} step rows held in memory; the full history "
                    "is in the run directory's Parquet files (open it from the list)")
        return None


def _frame(table: str, rows: list[dict]) -> pd.DataFrame:
    from hetero_ray.runs.records import to_table

    return to_table(table, rows).to_pandas() if rows else SCHEMAS[table].empty_table().to_pandas()
