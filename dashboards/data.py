"""Data access for the app: which runs exist, and each run's tables.

A run is named by a *key*: ``offline:<path under --runs-dir>`` for a run directory, or
``live:<experiment>`` for a running experiment found through its metrics-store actor.
Keys arrive from the browser (the run list, the URL), so they are untrusted: an offline
key resolves only to a directory under ``runs_dir`` that looks like a run (no ``..``, no
absolute paths, no symlink out of the folder), and a live key only names an actor. The
files inside a run directory are untrusted too (anyone who can write there can plant a
symlink): a file is read only if its real path lies inside that run directory; one that
leads out of it is ignored, and the run's notice names it.

Two implementations of :class:`RunSource`:

- :class:`OfflineRunSource` reads the run directory through
  :mod:`hetero_ray.metrics.run_files` (merged Parquet files, or the parts of a run that is
  still being written), cached by file modification time; new parts of a running run are
  read incrementally.
- :class:`LiveRunSource` asks the experiment's metrics store for what is new since its
  cursors (one round trip per refresh, through :class:`~dashboards.ray_bridge.RayBridge`)
  and keeps a bounded window of step rows in memory.

Only JSON and Parquet are read; nothing read is ever executed or unpickled.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hetero_ray.metrics import run_files
from hetero_ray.metrics.records import DECISIONS, EPOCHS, PLANS, SCHEMAS, STEP_COLUMN, STEPS, TRAJECTORY_TABLES
from hetero_ray.metrics.trajectory import effective_rows

OFFLINE = "offline:"
LIVE = "live:"
MAX_KEY_LENGTH = 512
MAX_SCAN_DEPTH = 2  # runs/<name> and runs/<group>/<name>
RUNNING_IF_WRITTEN_WITHIN_S = 30.0  # an unfinished run dir written to this recently is "running"
LIVE_REFRESH_MIN_S = 0.5  # browsers refreshing together share one store round trip
LIVE_MAX_ROWS = 400_000  # step rows a live source keeps (the store keeps 200k by default)
CACHE_MAX_ROWS = 4_000_000  # rows of offline tables kept in memory (~1 GB of step rows at worst)
_RUN_MARKERS = (run_files.CONFIG_FILE, run_files.SUMMARY_FILE, "steps.parquet", run_files.PARTS_DIR)
_SKIP_DIRS = {run_files.PARTS_DIR, "ray_train", "__pycache__"}


class RunNotFound(LookupError):
    """The key names no run that may be opened; the message says what to do."""


# ---- run keys and paths ------------------------------------------------------------------

def resolve_run_dir(runs_dir: str, name: str) -> str:
    """The run directory ``name`` (relative to ``runs_dir``), refusing anything outside it.

    Raises:
        RunNotFound: for absolute paths, ``..`` components, symlinks leading out of
            ``runs_dir``, control characters, and directories that are not runs.
    """
    if not isinstance(name, str) or not name or len(name) > MAX_KEY_LENGTH:
        raise RunNotFound("no run selected")
    if any(ord(c) < 32 for c in name) or "\\" in name or name.startswith(("/", "~")) or os.path.isabs(name):
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    root = os.path.realpath(runs_dir)
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, path]) != root or path == root:
        raise RunNotFound(f"{name!r} is not a run under the runs folder")
    if not os.path.isdir(path) or not looks_like_run(path):
        raise RunNotFound(f"no run directory {name!r} under {runs_dir}")
    return path


def looks_like_run(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, marker)) for marker in _RUN_MARKERS)


# ---- files inside a run directory: never through a symlink that leads out of it --------------

def _inside(run_dir: str, path: str) -> Optional[str]:
    """The real path of ``path`` when it lies inside ``run_dir``, else None."""
    root = os.path.realpath(run_dir)
    real = os.path.realpath(path)
    return real if os.path.commonpath([root, real]) == root else None


def _read_run_json(run_dir: str, filename: str, default: Any = None) -> Any:
    """A JSON file of the run, or ``default`` when it is absent or leads out of the run."""
    real = _inside(run_dir, os.path.join(run_dir, filename))
    return default if real is None else run_files.read_json(real, default)


def _attempt_starts(run_dir: str) -> dict[int, int]:
    """:func:`hetero_ray.metrics.run_files.attempt_starts`, through :func:`_read_run_json`."""
    attempts = _read_run_json(run_dir, run_files.ATTEMPTS_FILE, []) or []
    return {int(a["attempt"]): int(a["start_global_step"]) for a in attempts}


def escaping_links(run_dir: str) -> list[str]:
    """Entries of the run (its files, its parts folders and their files) that are symlinks
    leading out of it, relative to ``run_dir``: what the app ignored."""
    found = []

    def scan(directory: str, depth: int) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_symlink():
                if _inside(run_dir, entry.path) is None:
                    found.append(os.path.relpath(entry.path, run_dir).replace(os.sep, "/"))
            elif entry.is_dir() and ((depth == 0 and entry.name == run_files.PARTS_DIR) or depth == 1):
                scan(entry.path, depth + 1)  # parts/, then parts/<table>/

    scan(run_dir, 0)
    return found


@dataclass(frozen=True)
class RunEntry:
    key: str
    name: str
    label: str
    live: bool
    status: str  # running | finished | failed | unknown
    mtime: float


def list_offline_runs(runs_dir: str) -> list[RunEntry]:
    """Run directories under ``runs_dir`` (two levels deep at most), newest first."""
    root = os.path.realpath(runs_dir)
    if not os.path.isdir(root):
        return []
    entries = []

    def scan(directory: str, depth: int) -> None:
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for child in children:
            if child.name.startswith(".") or child.name in _SKIP_DIRS or not child.is_dir():
                continue
            real = os.path.realpath(child.path)
            if os.path.commonpath([root, real]) != root:
                continue  # a symlink out of the runs folder
            if looks_like_run(real):
                name = os.path.relpath(child.path, root).replace(os.sep, "/")
                status = offline_status(real)
                entries.append(RunEntry(OFFLINE + name, name, f"{name} ({status})", False, status, _mtime(real)))
            elif depth < MAX_SCAN_DEPTH:
                scan(child.path, depth + 1)

    scan(root, 1)
    return sorted(entries, key=lambda e: e.mtime, reverse=True)


def offline_status(run_dir: str, now: Optional[float] = None) -> str:
    summary = _read_run_json(run_dir, run_files.SUMMARY_FILE)
    if isinstance(summary, dict) and summary.get("status"):
        return str(summary["status"])
    now = time.time() if now is None else now
    return "running" if now - _mtime(run_dir) <= RUNNING_IF_WRITTEN_WITHIN_S else "unfinished"


def _mtime(run_dir: str) -> float:
    """Newest modification time of the run's files (parts included)."""
    paths = [run_dir, *glob.glob(os.path.join(run_dir, "*")),
             *glob.glob(os.path.join(run_dir, run_files.PARTS_DIR, "*"))]
    signatures = [_stat(run_dir, path) for path in paths]
    return max((sig[0] / 1e9 for sig in signatures if sig is not None), default=0.0)


# ---- offline tables, cached by modification time -------------------------------------------

def _stat(run_dir: str, path: str) -> Optional[tuple[int, int]]:
    """(mtime in ns, size) of a file of the run; None when absent or leading out of the run."""
    real = _inside(run_dir, path)
    if real is None:
        return None
    try:
        st = os.stat(real)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class TableCache:
    """Tables of run directories, re-read only when their files change.

    The signature of a table is the merged file's (mtime, size) plus the names of its
    parts; when only new parts appeared (a running run), only those are read. The
    effective trajectory (rows of redone steps dropped) is recomputed on each change.
    """

    def __init__(self, max_rows: int = CACHE_MAX_ROWS):
        self._lock = threading.Lock()
        self._max_rows = max_rows
        self._entries: dict[tuple[str, str], dict] = {}  # least recently read first

    def read(self, run_dir: str, table: str) -> tuple[pd.DataFrame, tuple]:
        """The table's effective rows and a signature that changes when they do."""
        merged = _inside(run_dir, run_files.table_path(run_dir, table))
        merged_sig = _stat(run_dir, merged) if merged is not None else None
        parts_folder = run_files.parts_dir(run_dir, table)
        parts = []
        if _inside(run_dir, parts_folder) is not None:  # the folder checked once, then only links
            parts = [p for p in sorted(glob.glob(os.path.join(parts_folder, "part-*.parquet")))
                     if not os.path.islink(p) or _inside(run_dir, p) is not None]
        attempts_sig = _stat(run_dir, os.path.join(run_dir, run_files.ATTEMPTS_FILE))
        key = (run_dir, table)
        with self._lock:
            entry = self._entries.get(key)
        if entry and entry["merged"] == merged_sig and entry["parts"] == parts and entry["attempts"] == attempts_sig:
            with self._lock:
                self._entries[key] = self._entries.pop(key, entry)  # most recently used
            return entry["df"], entry["signature"]
        frames = []
        if entry and entry["merged"] == merged_sig and parts[: len(entry["parts"])] == entry["parts"]:
            raw = entry["raw"]  # only new parts to read
            new_parts = parts[len(entry["parts"]):]
        else:
            raw = None
            new_parts = parts
            if merged_sig is not None:
                frames.append(_read_parquet(merged))
        for path in new_parts:
            try:
                frames.append(_read_parquet(os.path.realpath(path)))
            except (FileNotFoundError, OSError):  # merged away meanwhile: read again next time
                parts = parts[: parts.index(path)]
                break
        frames = [f for f in ([raw] if raw is not None else []) + frames if f is not None and not f.empty]
        raw = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (
            frames[0] if frames else SCHEMAS[table].empty_table().to_pandas())
        df = raw
        starts = _attempt_starts(run_dir)
        # One attempt: every row is on the trajectory (skip the per-row pass on big tables).
        if table in TRAJECTORY_TABLES and len(starts) > 1:
            df = effective_rows(raw, starts, STEP_COLUMN.get(table, "global_step"))
        signature = (merged_sig, len(parts), parts[-1] if parts else None, attempts_sig)
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = {"merged": merged_sig, "parts": parts, "attempts": attempts_sig,
                                  "raw": raw, "df": df, "signature": signature}
            # Bounded by rows, not files: one long run can outweigh a hundred short ones.
            while len(self._entries) > 1 and sum(len(e["raw"]) for e in self._entries.values()) > self._max_rows:
                self._entries.pop(next(iter(self._entries)))
        return df, signature


def _read_parquet(path: str) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()


# ---- run sources -----------------------------------------------------------------------

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
                _stat(self.run_dir, os.path.join(self.run_dir, run_files.NODES_FILE)),
                _stat(self.run_dir, os.path.join(self.run_dir, run_files.SUMMARY_FILE)))

    def steps(self) -> pd.DataFrame:
        return self._table(STEPS)

    def plans(self) -> pd.DataFrame:
        return self._table(PLANS)

    def epochs(self) -> pd.DataFrame:
        return self._table(EPOCHS)

    def decisions(self) -> pd.DataFrame:
        return self._table(DECISIONS)

    def nodes(self) -> list[dict]:
        return normalise_nodes(_read_run_json(self.run_dir, run_files.NODES_FILE))

    def config(self) -> dict[str, Any]:
        config = _read_run_json(self.run_dir, run_files.CONFIG_FILE, {})
        return config if isinstance(config, dict) else {}

    def summary(self) -> Optional[dict[str, Any]]:
        summary = _read_run_json(self.run_dir, run_files.SUMMARY_FILE)
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


def classify_recent(steps: pd.DataFrame, nodes: list[dict]) -> tuple[list[dict], Optional[str]]:
    """Verdicts over the run's last steps by the one rule of
    :func:`hetero_ray.profiling.run_bottlenecks.judge_run` (node caps from the profiles)."""
    from hetero_ray.profiling.run_bottlenecks import judge_run, node_caps_from_profiles

    if steps.empty:
        return [], "no steps recorded yet"
    try:
        verdicts = judge_run(steps, node_caps_from_profiles(nodes))
    except Exception as e:  # noqa: BLE001 - shown on the page; the app keeps working
        return [], f"the bottleneck classifier failed on this run: {type(e).__name__}: {e}"
    return verdicts, None if verdicts else "the classifier found no bottleneck in the last steps"


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


# ---- the catalog: every run the app can show ------------------------------------------------

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
        from dashboards.ray_bridge import BridgeUnavailable

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
        config = _read_run_json(run_dir, run_files.CONFIG_FILE, {})
        return (config if isinstance(config, dict) else {}), OFFLINE + name

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
        from dashboards.ray_bridge import BridgeUnavailable

        try:
            return self.bridge.nodes()
        except BridgeUnavailable:
            return None
