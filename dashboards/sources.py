"""One run's data for the app, offline or live: the two implementations of :class:`RunSource`.

- :class:`OfflineRunSource` reads the run directory through a
  :class:`~dashboards.table_cache.TableCache` (tables cached by file modification time)
  and its JSON files through :mod:`dashboards.run_dir_files` (never out of the run).
- :class:`LiveRunSource` asks the experiment's metrics store for what is new since its
  cursors (one round trip per refresh, through :class:`~dashboards.ray_bridge.RayBridge`)
  and keeps a bounded window of step rows in memory.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

import pandas as pd
import pyarrow as pa

from dashboards.run_dir_files import escaping_links, file_signature, read_run_json
from dashboards.run_keys import offline_status
from dashboards.table_cache import TableCache
from dashboards.verdicts import classify_recent
from hetero_ray.metrics import run_files
from hetero_ray.metrics.records import DECISIONS, EPOCHS, PLANS, SCHEMAS, STEPS
from hetero_ray.metrics.trajectory import effective_rows

LIVE_REFRESH_MIN_S = 0.5  # browsers refreshing together share one store round trip
LIVE_MAX_ROWS = 400_000  # step rows a live source keeps (the store keeps 200k by default)


class RunSource:
    """One run's data, offline or live. Subclasses fill in the tables.

    ``version()`` changes whenever the data does; derived frames are memoised per version
    (see :meth:`derived`), so several pages and browsers share one computation.
    """

    key: str
    name: str
    live: bool = False

    def __init__(self) -> None:
        self._derived: dict[str, tuple[Any, Any]] = {}
        self._derived_lock = threading.Lock()

    def refresh(self) -> None:
        """Fetches what is new (live) or notices changed files (offline)."""

    def version(self) -> Any:
        raise NotImplementedError

    def steps(self) -> pd.DataFrame:
        raise NotImplementedError

    def plans(self) -> pd.DataFrame:
        raise NotImplementedError

    def epochs(self) -> pd.DataFrame:
        raise NotImplementedError

    def decisions(self) -> pd.DataFrame:
        raise NotImplementedError

    def nodes(self) -> list[dict]:
        return []

    def config(self) -> dict[str, Any]:
        return {}

    def summary(self) -> Optional[dict[str, Any]]:
        return None

    def bottlenecks(self) -> tuple[list[dict], Optional[str]]:
        """Verdicts and, when there are none, why (shown as the empty state)."""
        return [], None

    def status(self) -> str:
        """running | finished | failed | unfinished | unknown."""
        return "unknown"

    def active(self) -> bool:
        """Whether the page should keep refreshing."""
        return self.status() == "running"

    def notice(self) -> Optional[str]:
        """Something the person should know about this run's data (shown above the page)."""
        return None

    def derived(self, name: str, compute) -> Any:
        """``compute()`` memoised for the current data version."""
        version = self.version()
        with self._derived_lock:
            hit = self._derived.get(name)
            if hit is not None and hit[0] == version:
                return hit[1]
        value = compute()
        with self._derived_lock:
            self._derived[name] = (version, value)
        return value


class OfflineRunSource(RunSource):
    def __init__(self, key: str, name: str, run_dir: str, cache: TableCache):
        super().__init__()
        self.key, self.name, self.run_dir = key, name, run_dir
        self._cache = cache
        self._signatures: dict[str, tuple] = {}

    def _table(self, table: str) -> pd.DataFrame:
        df, signature = self._cache.read(self.run_dir, table)
        self._signatures[table] = signature
        return df

    def version(self) -> Any:
        for table in (STEPS, PLANS, EPOCHS, DECISIONS):
            self._table(table)
        return (tuple(self._signatures.get(t) for t in (STEPS, PLANS, EPOCHS, DECISIONS)),
                file_signature(self.run_dir, os.path.join(self.run_dir, run_files.NODES_FILE)),
                file_signature(self.run_dir, os.path.join(self.run_dir, run_files.SUMMARY_FILE)))

    def steps(self) -> pd.DataFrame:
        return self._table(STEPS)

    def plans(self) -> pd.DataFrame:
        return self._table(PLANS)

    def epochs(self) -> pd.DataFrame:
        return self._table(EPOCHS)

    def decisions(self) -> pd.DataFrame:
        return self._table(DECISIONS)

    def nodes(self) -> list[dict]:
        return normalise_nodes(read_run_json(self.run_dir, run_files.NODES_FILE))

    def config(self) -> dict[str, Any]:
        config = read_run_json(self.run_dir, run_files.CONFIG_FILE, {})
        return config if isinstance(config, dict) else {}

    def summary(self) -> Optional[dict[str, Any]]:
        summary = read_run_json(self.run_dir, run_files.SUMMARY_FILE)
        return summary if isinstance(summary, dict) else None

    def status(self) -> str:
        return offline_status(self.run_dir)

    def notice(self) -> Optional[str]:
        links = escaping_links(self.run_dir)
        if not links:
            return None
        shown = ", ".join(links[:5]) + (", …" if len(links) > 5 else "")
        return (f"ignored {len(links)} file(s) of this run that are symbolic links leading out of its "
                f"directory: {shown} (the app reads only files inside the run)")

    def bottlenecks(self) -> tuple[list[dict], Optional[str]]:
        summary = self.summary() or {}
        if isinstance(summary.get("bottlenecks"), list):
            return summary["bottlenecks"], None if summary["bottlenecks"] else "the classifier found no bottleneck"
        return classify_recent(self.steps(), self.nodes())


def normalise_nodes(value: Any) -> list[dict]:
    """``nodes.json`` holds ``{"nodes": [...]}``; the store may hold the bare list."""
    if isinstance(value, dict):
        value = value.get("nodes")
    return [n for n in value if isinstance(n, dict)] if isinstance(value, list) else []


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
        from dashboards.ray_bridge import BridgeUnavailable, ExperimentGone

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
        from dashboards.ray_bridge import BridgeUnavailable, ExperimentGone

        try:
            verdicts = self._bridge.call(self.experiment, "bottlenecks")
        except (BridgeUnavailable, ExperimentGone) as e:
            return [], str(e)
        if verdicts:
            return verdicts, None
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
    from hetero_ray.metrics.records import to_table

    return to_table(table, rows).to_pandas() if rows else SCHEMAS[table].empty_table().to_pandas()
