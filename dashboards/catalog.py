"""The catalog: every run the app can show, and the source for a run key."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

from hetero_ray.reporting.run_source import OfflineRunSource, RunSource, read_config
from hetero_ray.runs.table_cache import TableCache
from hetero_ray_dashboards.live_source import LiveRunSource
from hetero_ray_dashboards.run_keys import (
    LIVE, MAX_KEY_LENGTH, OFFLINE, RunEntry, RunNotFound, list_offline_runs, resolve_run_dir,
)


class RunCatalog:
    """Runs under ``runs_dir`` plus running experiments (when a bridge to Ray exists).

    Sources are kept per key (live ones hold their accumulated rows); resolving a key
    never opens anything outside ``runs_dir``.
    """

    def __init__(self, runs_dir: str, bridge=None, cache: Optional[TableCache] = None):
        self.runs_dir = runs_dir
        self.bridge = bridge
        self.cache = cache or TableCache()
        self._sources: dict[str, RunSource] = {}
        self._lock = threading.Lock()
        self._live_names: list[str] = []
        self._live_checked = 0.0
        self._ended: dict[str, Optional[str]] = {}  # live key of an ended run → its offline key

    def connection(self) -> dict[str, Any]:
        """``mode`` (offline | live) and a message for the header."""
        if self.bridge is None:
            return {"mode": "offline", "state": "off",
                    "message": "offline: no Ray cluster (start with --address HOST:PORT or on a `ray start --head` "
                               "machine to see running experiments)"}
        return {"mode": "live", **self.bridge.status()}

    def live_experiments(self, max_age_s: float = 2.0) -> list[str]:
        if self.bridge is None:
            return []
        from hetero_ray_dashboards.ray_bridge import BridgeUnavailable

        if time.monotonic() - self._live_checked >= max_age_s:
            self._live_checked = time.monotonic()
            try:
                self._live_names = self.bridge.experiments()
            except BridgeUnavailable:
                self._live_names = []
                return []
            self._forget_ended(set(self._live_names))
        return list(self._live_names)

    def _forget_ended(self, running: set[str]) -> None:
        """Live sources of experiments that stopped give their rows back (the run's
        directory has them), remembering where that directory is."""
        with self._lock:
            for key, source in list(self._sources.items()):
                if isinstance(source, LiveRunSource) and source.experiment not in running:
                    self._ended[key] = source.offline_key
                    del self._sources[key]

    def entries(self) -> list[RunEntry]:
        live = [RunEntry(LIVE + name, name, f"{name} (live)", True, "running", time.time())
                for name in self.live_experiments()]
        return live + list_offline_runs(self.runs_dir)

    def source(self, key: Optional[str]) -> RunSource:
        """The source for ``key``; raises :class:`RunNotFound` with a message for people."""
        if not isinstance(key, str) or not key:
            raise RunNotFound("no run selected")
        if key.startswith(OFFLINE):
            name = key[len(OFFLINE):]
            run_dir = resolve_run_dir(self.runs_dir, name)
            with self._lock:
                source = self._sources.get(key)
                if not isinstance(source, OfflineRunSource) or source.run_dir != run_dir:
                    source = self._sources[key] = OfflineRunSource(key, name, run_dir, self.cache)
            return source
        if key.startswith(LIVE):
            experiment = key[len(LIVE):]
            with self._lock:
                source = self._sources.get(key)
            if source is None:
                if key in self._ended:
                    raise RunNotFound(f"experiment {experiment!r} has ended"
                                      + ("; its run directory is in the list" if self._ended[key] else ""))
                if self.bridge is None or len(experiment) > MAX_KEY_LENGTH or experiment not in self.live_experiments(0):
                    raise RunNotFound(f"experiment {experiment!r} is not running"
                                      + ("" if self.bridge else " (the app has no connection to a Ray cluster)"))
                config, offline_key = self._run_dir_of(experiment)
                source = LiveRunSource(key, experiment, self.bridge, config=config, offline_key=offline_key)
                with self._lock:
                    source = self._sources.setdefault(key, source)
            return source
        raise RunNotFound(f"{key[:80]!r} is not a run")

    def _run_dir_of(self, experiment: str) -> tuple[dict[str, Any], Optional[str]]:
        """The live run's config.json and offline key, when its directory is under runs_dir."""
        try:
            info = self.bridge.call(experiment, "info")
            name = os.path.relpath(os.path.realpath(info["run_dir"]), os.path.realpath(self.runs_dir))
            name = name.replace(os.sep, "/")
            run_dir = resolve_run_dir(self.runs_dir, name)
        except Exception:  # noqa: BLE001 - not under runs_dir, or not reachable: no config
            return {}, None
        return read_config(run_dir), OFFLINE + name

    def successor(self, key: str) -> Optional[str]:
        """For a live run that has ended: its run directory's key (if under runs_dir)."""
        with self._lock:
            source = self._sources.get(key)
            if key in self._ended:
                return self._ended[key]
        if isinstance(source, LiveRunSource) and source.gone:
            return source.offline_key
        return None

    def cluster_nodes(self) -> Optional[list[dict]]:
        """Alive and dead nodes of the connected Ray cluster, or None when offline."""
        if self.bridge is None:
            return None
        from hetero_ray_dashboards.ray_bridge import BridgeUnavailable

        try:
            return self.bridge.nodes()
        except BridgeUnavailable:
            return None
