"""Names, defaults and environment knobs shared by the whole package.

Environment knobs come as ``X_ENV_VAR`` / ``DEFAULT_X`` pairs; read them with
:func:`env_float` so a bad value fails loudly instead of silently using a default.
"""

from __future__ import annotations

import os

# Ray namespace for every actor of hetero_ray, so the Ray dashboard groups them and the
# performance app finds running experiments by listing named actors in one namespace.
RAY_NAMESPACE = "hetero_ray"

# Named actors of one experiment are called "<experiment>/<role>".
PLANNER_ROLE = "planner"
METRICS_STORE_ROLE = "metrics_store"


# The dataset that follows the plan, as in Ray Train's examples: HeteroTrainer(datasets={"train": ...}).
TRAIN_DATASET = "train"


def data_feed_role(dataset_name: str) -> str:
    """The role of the feed that reads ``HeteroTrainer(datasets={dataset_name: ...})``."""
    return f"data-{dataset_name}"


# How long rank 0 waits for the planner's latest plan before keeping the current one.
# Training must not stall on a slow or restarting actor; the next interval retries.
PLAN_FETCH_TIMEOUT_S_ENV_VAR = "HETERO_RAY_PLAN_FETCH_TIMEOUT_S"
DEFAULT_PLAN_FETCH_TIMEOUT_S = 2.0

# How long rank 0 waits for the metrics store to register a worker-group start. The store
# answers in milliseconds; a store that does not (dead, restarting for good) must fail the
# start with a message, not hang every rank in the broadcast that follows.
REGISTER_ATTEMPT_TIMEOUT_S_ENV_VAR = "HETERO_RAY_REGISTER_ATTEMPT_TIMEOUT_S"
DEFAULT_REGISTER_ATTEMPT_TIMEOUT_S = 120.0

# Workers batch their step records and send them at most this often (fire-and-forget),
# so the metrics store sees a few calls per second, not one per step and rank.
RECORD_FLUSH_INTERVAL_S_ENV_VAR = "HETERO_RAY_RECORD_FLUSH_INTERVAL_S"
DEFAULT_RECORD_FLUSH_INTERVAL_S = 1.0

# The metrics store writes a Parquet part this often; readers (the dashboard, a crash
# post-mortem) see at most this much lag on disk.
PARQUET_FLUSH_INTERVAL_S_ENV_VAR = "HETERO_RAY_PARQUET_FLUSH_INTERVAL_S"
DEFAULT_PARQUET_FLUSH_INTERVAL_S = 5.0

# Step records kept in the metrics store's memory for live queries; older rows are
# already in Parquet. 200k rows is ~100 MB at worst and hours of a 4-rank run.
STORE_MAX_RECENT_STEPS_ENV_VAR = "HETERO_RAY_STORE_MAX_RECENT_STEPS"
DEFAULT_STORE_MAX_RECENT_STEPS = 200_000

# Seconds between progress lines printed by the driver.
PROGRESS_INTERVAL_S_ENV_VAR = "HETERO_RAY_PROGRESS_INTERVAL_S"
DEFAULT_PROGRESS_INTERVAL_S = 5.0

# Connecting to an explicit --address must fail fast when nothing answers there.
CONNECT_TIMEOUT_S_ENV_VAR = "HETERO_RAY_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 30.0

# How long to wait for the cluster to have room for the workers before giving up with a
# message that says what is missing.
PLACEMENT_TIMEOUT_S_ENV_VAR = "HETERO_RAY_PLACEMENT_TIMEOUT_S"
DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
# How long the multi-node preflight waits for every node's answer (a node's first task
# starts a Python worker there, ~2 s; CIFAR is read once, ~1 s) before naming the silent ones.
NODE_CHECK_TIMEOUT_S_ENV_VAR = "HETERO_RAY_NODE_CHECK_TIMEOUT_S"
DEFAULT_NODE_CHECK_TIMEOUT_S = 60.0
# Elastic runs restart with the workers they can have after this long, not the full size.
# Each try at a size the cluster no longer has costs this much (Ray Train's view of the
# cluster's resources lags a node's death by a try or two); a placement group that can be
# placed is ready in well under a second.
DEFAULT_ELASTIC_START_TIMEOUT_S = 5.0

# Node labels set by cluster_configs/ scripts and manifests, and read by --worker-devices:
# what kind of device a node offers its training workers, and which GPU model.
DEVICE_LABEL = "hetero-ray.io/device"  # "gpu" | "cpu"
GPU_MODEL_LABEL = "hetero-ray.io/gpu-model"  # e.g. "nvidia-a100-sxm4-40gb" (lower case, '-' for spaces)

# Checkpoints Ray Train keeps on storage; older ones are deleted. Two, not one: a crash
# while the newest is being written must still leave a complete one.
CHECKPOINTS_TO_KEEP = 2

# Where versions before HeteroTrainer became the one driver kept Ray Train's own files
# (checkpoints, manager snapshot) in a `hetero-ray train` run directory; now they sit in
# the run directory itself, as in every HeteroTrainer run.
RAY_TRAIN_SUBDIR = "ray_train"


def env_float(name: str, default: float) -> float:
    """Reads a float knob from the environment; a malformed value is an error, not a default."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number") from None


def actor_name(experiment_name: str, role: str) -> str:
    """The Ray actor name of one of an experiment's actors."""
    return f"{experiment_name}/{role}"
