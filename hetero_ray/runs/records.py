"""The tables of a run and their columns: one vocabulary for code, Parquet and the app.

Every table is written to ``<run_dir>/<table>.parquet``. While a run is going, rows are
appended as part files under ``<run_dir>/parts/<table>/`` and merged at the end; readers
accept either (see :mod:`hetero_ray.runs.run_files`).
"""

from __future__ import annotations

import pyarrow as pa

STEPS = "steps"
PLANS = "plans"
EPOCHS = "epochs"
SAMPLE_IDS = "sample_ids"
DECISIONS = "decisions"
REPORTS = "reports"  # what train loops reported (hetero_ray.train.report), rank 0's copy
TABLES = (STEPS, PLANS, EPOCHS, SAMPLE_IDS, DECISIONS, REPORTS)

# Tables whose rows belong to a global step, and so to the run's effective trajectory:
# rows of steps that were redone after a restart are replaced by the redone ones.
TRAJECTORY_TABLES = (STEPS, PLANS, EPOCHS, SAMPLE_IDS, REPORTS)
STEP_COLUMN = {PLANS: "first_global_step"}

# The steps table's data_source: where a rank's batches came from.
DATA_LOADER_SOURCE = "data_loader"  # a map-style dataset, through prepare_data_loader
RAY_DATA_SOURCE_PREFIX = "ray_data:"  # + the dataset's name: a Ray Data dataset's feed (get_dataset_shard)

# What identifies a row: a row received twice (a retried call, a replayed log) is one row.
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    STEPS: ("attempt", "global_step", "rank"),
    SAMPLE_IDS: ("attempt", "global_step", "rank", "sample_index"),
    PLANS: ("attempt", "plan_version", "first_global_step"),
    EPOCHS: ("attempt", "epoch", "global_step"),
    DECISIONS: ("global_step", "policy", "wall_time"),
    REPORTS: ("attempt", "global_step", "wall_time"),
}  # the global-step column, where not "global_step"

_f64 = pa.float64()
_i64 = pa.int64()

SCHEMAS: dict[str, pa.Schema] = {
    STEPS: pa.schema([
        ("epoch", _i64), ("step", _i64), ("global_step", _i64), ("rank", _i64),
        ("node_id", pa.string()), ("attempt", _i64),
        ("local_batch_size", _i64), ("global_batch_size", _i64), ("plan_version", _i64),
        ("data_time_s", _f64), ("forward_time_s", _f64), ("backward_time_s", _f64),
        ("pad_time_s", _f64), ("optimizer_time_s", _f64), ("busy_time_s", _f64),
        ("wait_time_s", _f64), ("step_time_s", _f64), ("loss", _f64), ("lr", _f64),
        ("wall_time", _f64),
        # A rank the plan leaves out (local_batch_size 0) times its step on this many samples
        # with weight 0 and no all-reduce, so its curve stays known (training/data/loader.py); else 0.
        ("probe_batch_size", _i64),
        # In-training profiler; empty where not measured (no GPU, sampling off).
        ("h2d_time_s", _f64), ("gpu_util", _f64), ("gpu_mem_used_bytes", _f64),
        ("gpu_mem_peak_bytes", _f64), ("gpu_mem_total_bytes", _f64), ("gpu_temp_c", _f64),
        ("gpu_power_w", _f64), ("cpu_util", _f64), ("rss_bytes", _f64),
        ("cpu_util_from_step", _f64), ("cpu_quota_cores", _f64),  # float, like every profiler column: null or NaN where not read
        # Where the rank's batch came from (DATA_LOADER_SOURCE, RAY_DATA_SOURCE_PREFIX + name).
        ("data_source", pa.string()),
    ]),
    PLANS: pa.schema([
        ("plan_version", _i64), ("first_global_step", _i64), ("epoch", _i64), ("step", _i64),
        ("attempt", _i64), ("num_workers", _i64), ("global_batch_size", _i64),
        ("local_batch_sizes", pa.list_(_i64)), ("reason", pa.string()), ("wall_time", _f64),
        # A trial (shares a rank never ran: planning/moves.py): the steps after which it is
        # checked, and rolled back there if it made the step slower; null for any other plan.
        ("check_after_steps", _i64),
    ]),
    EPOCHS: pa.schema([
        ("epoch", _i64), ("global_step", _i64), ("attempt", _i64), ("train_loss", _f64),
        ("eval_loss", _f64), ("eval_metric", _f64), ("eval_metric_name", pa.string()),
        ("samples", _i64), ("epoch_time_s", _f64), ("samples_per_s", _f64), ("wall_time", _f64),
    ]),
    SAMPLE_IDS: pa.schema([
        ("epoch", _i64), ("step", _i64), ("global_step", _i64), ("rank", _i64),
        ("attempt", _i64), ("sample_index", _i64),
    ]),
    DECISIONS: pa.schema([
        ("global_step", _i64), ("policy", pa.string()), ("adopted", pa.bool_()),
        ("reason", pa.string()), ("plan_version", _i64), ("local_batch_sizes", pa.list_(_i64)),
        ("predicted_step_time_s", _f64), ("current_predicted_step_time_s", _f64),
        ("predicted_gain", _f64), ("achieved_step_time_s", _f64), ("wall_time", _f64),
        # Ranks the proposal leaves out, and its prediction with every rank in (planning/subset.py).
        ("left_out_ranks", pa.list_(_i64)), ("all_ranks_predicted_step_time_s", _f64),
        # The step time beyond the prediction's max_i t_i + c, measured (planning/balancer.py).
        ("rest_of_step_s", _f64),
        # A feeding trial's rows (planning/feed_trial.py): the ranks left out to feed the Ray
        # Data pipeline for good, and the samples/s measured with them training and left out.
        ("feeding_ranks", pa.list_(_i64)), ("samples_per_s_training", _f64), ("samples_per_s_feeding", _f64),
    ]),
    # global_step: the last step completed when the report was made (-1 before the first),
    # so a report that carried a checkpoint stays on the trajectory of a restarted run.
    # metrics: the reported dict as JSON (its keys are the user's).
    REPORTS: pa.schema([
        ("global_step", _i64), ("epoch", _i64), ("attempt", _i64), ("wall_time", _f64),
        ("metrics", pa.string()),
    ]),
}

STEP_COLUMNS = tuple(SCHEMAS[STEPS].names)


def to_table(name: str, rows: list[dict]) -> pa.Table:
    """Rows (dicts) as an Arrow table of the table's schema; missing columns are null."""
    schema = SCHEMAS[name]
    columns = {field.name: [row.get(field.name) for row in rows] for field in schema}
    return pa.Table.from_pydict(columns, schema=schema)
