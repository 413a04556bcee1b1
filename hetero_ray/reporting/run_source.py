"""One run's data as the report and the app read it: :class:`RunSource`, and the offline one.

- :class:`RunSource` is what every page, figure and report asks of a run: its tables
  (``steps``, ``plans``, ``epochs``, ``decisions``), its node profiles, config, summary
  and bottleneck verdicts, and a ``version`` that changes with the data (derived frames
  are memoised per version).
- :class:`OfflineRunSource` reads a run directory through a
  :class:`~hetero_ray.runs.table_cache.TableCache` (tables cached by file
  modification time) and its JSON files through :mod:`hetero_ray.runs.readers`
  (never out of the run).

The app's live source (the metrics store of a running experiment, through Ray) is the
other implementation; it lives with the app.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

import pandas as pd

from hetero_ray.builtin.config import renamed_settings
from hetero_ray.reporting.verdicts import classify_recent
from hetero_ray.runs import run_files
from hetero_ray.runs.readers import escaping_links, file_signature, offline_status, read_run_json
from hetero_ray.runs.records import DECISIONS, EPOCHS, PLANS, STEPS
from hetero_ray.runs.table_cache import TableCache


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
        return read_config(self.run_dir)

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


def read_config(run_dir: str) -> dict[str, Any]:
    """A run's config.json under this version's setting names ({} when absent or not an object)."""
    config = read_run_json(run_dir, run_files.CONFIG_FILE, {})
    return renamed_settings(config) if isinstance(config, dict) else {}
