"""The examples/ scripts run as a user runs them, only tiny: each example's ``main(argv)`` with
small flags, in this process on the session's Ray (``HeteroTrainer`` uses an initialised
Ray; a subprocess per example would start its own, ~10 s more each). own_model trains as a
Ray job instead (tests/test_ray_job_submit.py), held to the same checks.

Each run must finish with the expected global steps (``summary.json``), hand back the
reported metrics in ``Result.metrics`` and a ``Result.checkpoint`` that loads into the
example's model; ResNet-18 reads CIFAR-format files written here; the TensorBoard example's
event files are read back. Each script also runs as a real subprocess, with ``--help``:
standalone, as ``python examples/X.py``, its imports and argparse work.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os

import pandas as pd
import pytest
import torch

from tests.cifar_files import write_cifar10
from tests.helpers import assert_loads

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("own_model", "resnet_cifar", "tensorboard_logging", "ray_data")
# 2 epochs of ceil(200 / 48) = 5 steps (the last a short window of 8 samples).
NUM_SAMPLES, BATCH, EPOCHS = 200, 48, 2
STEPS_PER_EPOCH = 5


def _example(name: str):
    # examples/ is a namespace package from the repository root, which the session's Ray
    # workers also have on their path: the loop travels to them by reference.
    return importlib.import_module(f"examples.{name}")


def _small_flags(tmp_path, name: str, *extra: str) -> list[str]:
    return ["--num-workers", "2", "--global-batch-size", str(BATCH), "--epochs", str(EPOCHS),
            "--storage-path", str(tmp_path), "--name", name, *extra]


def _summary(tmp_path, name: str) -> dict:
    with open(os.path.join(tmp_path, name, "summary.json")) as f:
        return json.load(f)


def _checkpoint_state(result) -> dict:
    with result.checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, "state.pt"), weights_only=True)


def test_resnet_cifar_trains_one_epoch_on_cifar_format_files(ray_session, tmp_path):
    from torchvision.models import resnet18

    data_dir = write_cifar10(tmp_path / "data", num_train=200, num_test=20)
    resnet_cifar = _example("resnet_cifar")
    result = resnet_cifar.main(["--data-dir", str(data_dir), "--no-verify-checksums", "--num-workers", "2",
                                "--global-batch-size", "64", "--epochs", "1", "--loader-workers", "0",
                                "--storage-path", str(tmp_path / "runs"), "--name", "resnet"])

    steps = 4  # ceil(200 / 64): three full windows and one of 8
    assert _summary(tmp_path / "runs", "resnet")["global_steps"] == steps
    assert result.metrics["epoch"] == 0 and result.metrics["global_steps"] == steps
    assert_loads(resnet18(num_classes=10), _checkpoint_state(result)["model"])


def test_resnet_cifar_refuses_unpublished_files_before_starting(tmp_path):
    from hetero_ray.errors import UserError

    data_dir = write_cifar10(tmp_path / "data", num_train=20, num_test=5)
    with pytest.raises(UserError, match="--no-verify-checksums"):  # the md5 check names the way out
        _example("resnet_cifar").main(["--data-dir", str(data_dir), "--storage-path", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_tensorboard_logging_writes_rank0_scalars(ray_session, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tensorboard_logging = _example("tensorboard_logging")
    result = tensorboard_logging.main(_small_flags(tmp_path, "tb", "--num-samples", str(NUM_SAMPLES),
                                                   "--loader-workers", "0",
                                                   "--emulate-speeds", "1,0.5"))  # unequal shares tell ranks apart

    steps = EPOCHS * STEPS_PER_EPOCH
    assert _summary(tmp_path, "tb")["global_steps"] == steps
    assert result.metrics["global_steps"] == steps
    logdir = tmp_path / "tb" / "tensorboard"  # the default --logdir
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1, "one writer (rank 0), one event file"
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/local_batch_size", "epoch/loss", "epoch/time_s"}
    assert [e.step for e in events.Scalars("train/loss")] == list(range(steps))
    rows = pd.read_parquet(tmp_path / "tb" / "steps.parquet")
    rank0 = rows[rows["rank"] == 0].sort_values("global_step")["local_batch_size"].tolist()
    shares = [int(e.value) for e in events.Scalars("train/local_batch_size")]
    assert shares == rank0 and any(2 * share > BATCH for share in shares)  # rank 0's share, the larger one
    assert [e.step for e in events.Scalars("epoch/loss")] == list(range(EPOCHS))
    assert all(e.value > 0 for e in events.Scalars("epoch/time_s"))


def test_ray_data_trains_on_shares_and_evaluates_every_row(ray_session, tmp_path):
    ray_data = _example("ray_data")
    result = ray_data.main(_small_flags(tmp_path, "rd", "--num-samples", str(NUM_SAMPLES),
                                        "--emulate-speeds", "1,0.5"))

    assert _summary(tmp_path, "rd")["global_steps"] == EPOCHS * STEPS_PER_EPOCH
    assert result.metrics["epoch"] == EPOCHS - 1 and 0 <= result.metrics["val_accuracy"] <= 1
    rows = pd.read_parquet(tmp_path / "rd" / "steps.parquet")
    assert rows.groupby("global_step")["local_batch_size"].sum().iloc[0] == BATCH
    assert_loads(ray_data.make_model(), _checkpoint_state(result)["model"])


# What a user may import: the package's top level and its public modules.
PUBLIC_MODULES = {"hetero_ray", "hetero_ray.train", "hetero_ray.train.huggingface", "hetero_ray.train.lightning",
                  "hetero_ray.datasets"}


def _hetero_ray_imports(path: str) -> set[str]:
    import ast

    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from hetero_ray import train` names a module too
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if importlib.util.find_spec(node.module) and _is_module(f"{node.module}.{alias.name}"))
    return {name for name in found if name == "hetero_ray" or name.startswith("hetero_ray.")}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_examples_import_only_the_public_api():
    examples = sorted(f for f in os.listdir(os.path.join(REPO_ROOT, "examples")) if f.endswith(".py"))
    assert {f[:-3] for f in examples} >= set(SCRIPTS)
    for name in examples:
        private = _hetero_ray_imports(os.path.join(REPO_ROOT, "examples", name)) - PUBLIC_MODULES
        assert not private, f"examples/{name} imports {sorted(private)}: use {sorted(PUBLIC_MODULES)} only"

