"""Bad input: a clear message, exit code 2, and no run directory — for every case.

Most cases fail in validation before Ray is touched (fast, in-process through the real
CLI entry point); the cluster cases use the session's Ray or a real subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import cli
from tests.cifar_files import write_cifar10

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code, _, err = cli.run_cli(argv, capsys)
    return code, err


def base_args(output_dir) -> list[str]:
    return ["train", "--storage-path", str(output_dir), "--name", "bad", "--model", "mlp"]


def corrupt_cifar(tmp_path):
    root = write_cifar10(tmp_path / "cifar", num_train=50, num_test=20)
    batch = os.path.join(root, "cifar-10-batches-py", "data_batch_3")
    with open(batch, "r+b") as f:
        f.truncate(100)
    return root


CASES = [
    # (id, extra flags, expected message fragment)
    ("unknown model", ["--model", "vgg99"], "--model must be one of"),
    ("unknown dataset", ["--dataset", "imagenet"], "--dataset must be one of"),
    ("unknown policy", ["--policy", "fastest"], "--policy must be one of"),
    ("zero batch", ["--global-batch-size", "0"], "--global-batch-size must be a positive integer"),
    ("negative epochs", ["--epochs", "-1"], "--epochs must be a positive integer"),
    ("non-integer batch", ["--global-batch-size", "6.5"], "invalid int value"),
    ("non-integer workers", ["--num-workers", "two"], "expected N or MIN-MAX"),
    ("elastic range reversed", ["--num-workers", "4-2"], "the minimum must not exceed the maximum"),
    ("elastic minimum zero", ["--num-workers", "0-2"], "--num-workers (minimum) must be a positive integer"),
    ("zero samples", ["--num-samples", "0"], "--num-samples must be a positive integer"),
    ("zero rebalance interval", ["--rebalance-interval", "0"], "--rebalance-interval must be a positive integer"),
    ("batch below workers", ["--global-batch-size", "3", "--num-workers", "4"], "smaller than --num-workers"),
    ("split wrong length", ["--batch-split", "40,24,8"], "--batch-split has 3 values but --num-workers is 2"),
    ("split wrong sum", ["--batch-split", "40,20"], "sums to 60, but --global-batch-size is 64"),
    ("split zero share", ["--batch-split", "64,0"], "--batch-split values must be ≥ 1"),
    ("split not integers", ["--batch-split", "40,x"], "comma-separated integers"),
    ("speeds wrong length", ["--emulate-speeds", "1,0.5,0.5"], "--emulate-speeds has 3 values"),
    ("speed above one", ["--emulate-speeds", "1,1.5"], "--emulate-speeds values must be in (0, 1]"),
    ("speed zero", ["--emulate-speeds", "1,0"], "--emulate-speeds values must be in (0, 1]"),
    ("model and dataset mismatch", ["--model", "gpt_tiny"], "needs a text dataset"),
    ("cifar without data dir", ["--dataset", "cifar10"], "reads its files from --data-dir"),
    ("bad experiment name", ["--name", "../escape"], "--name"),
    ("negative lr", ["--lr", "-0.1"], "--lr must be a positive number"),
    ("zero checkpoint interval", ["--checkpoint-every", "0"], "--checkpoint-every must be a positive integer"),
    ("negative max failures", ["--max-failures", "-1"], "--max-failures must be a non-negative integer"),
    ("zero max steps", ["--max-steps", "0"], "--max-steps must be a positive integer"),
    ("zero eval samples", ["--eval-samples", "0"], "--eval-samples must be a positive integer"),
    ("zero cpus per worker", ["--cpus-per-worker", "0"], "--cpus-per-worker must be a positive number"),
    ("unknown optimizer", ["--optimizer", "adam9"], "--optimizer must be one of"),
    ("unknown lr schedule", ["--lr-schedule", "linear"], "--lr-schedule must be one of"),
    ("unknown use-gpu", ["--use-gpu", "maybe"], "--use-gpu must be one of"),
    ("unknown backend", ["--backend", "mpi"], "--backend must be one of"),
    ("threshold above one", ["--rebalance-threshold", "1.5"], "--rebalance-threshold must be in [0, 1)"),
    ("negative cooldown", ["--rebalance-cooldown", "-1"], "--rebalance-cooldown must be a non-negative integer"),
    ("negative profile interval", ["--profile-interval", "-1"], "--profile-interval must be a non-negative integer"),
    ("zero profile timeout", ["--profile-timeout-s", "0"], "--profile-timeout-s must be a positive number"),
    ("zero probe batch", ["--profile-batch-sizes", "0,8"], "--profile-batch-sizes must be positive integers"),
    ("one probe size", ["--profile-batch-sizes", "8"], "--profile-batch-sizes needs two or more different positive sizes"),
    ("repeated probe size", ["--profile-batch-sizes", "8,8"], "--profile-batch-sizes needs two or more different"),
    ("unknown worker device", ["--worker-devices", "gpu,tpu"], "--worker-devices must give each worker gpu or cpu"),
    ("worker devices wrong length", ["--worker-devices", "gpu"], "--worker-devices has 1 values but --num-workers is 2"),
    ("malformed worker labels", ["--worker-labels", "gpu;cpu"], "expected KEY=VALUE pairs per worker"),
    ("malformed plan change", ["--plan-changes", "10:40,x"], "expected STEP:B0,B1"),
    ("plan change wrong sum", ["--plan-changes", "10:40,20"], "--plan-changes at step 10 sums to 60, but --global-batch-size is 64"),
    ("malformed speed change", ["--emulate-speed-changes", "10:1"], "expected STEP:RANK:SPEED"),
    ("speed change above one", ["--emulate-speed-changes", "10:1:2"], "SPEED in (0, 1]"),
]


@pytest.mark.parametrize("flags,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_flags_exit_2_without_a_run_directory(flags, fragment, tmp_path, capsys):
    output_dir = tmp_path / "runs"
    code, err = run_cli(base_args(output_dir) + ["--global-batch-size", "64"] + flags, capsys)
    assert code == 2
    assert fragment in err
    assert not output_dir.exists()


PROFILE_CASES = [
    # (id, flags, expected message fragment): each fails before Ray is started
    ("unknown model", ["--model", "vgg99"], "--model must be one of"),
    ("dataset without model", ["--dataset", "cifar10"], "--dataset only shapes the --model probe"),
    ("one probe size", ["--batch-sizes", "8"], "--batch-sizes needs two or more different positive sizes"),
    ("probe sizes not integers", ["--batch-sizes", "8,x"], "comma-separated integers"),
    ("zero cpus per worker", ["--cpus-per-worker", "0"], "--cpus-per-worker must be a positive number"),
    ("ram fraction above one", ["--ram-fraction", "1.5"], "--ram-fraction must be in (0, 1]"),
    ("zero timeout", ["--timeout-s", "0"], "--timeout-s must be a positive number of seconds"),
]


@pytest.mark.parametrize("flags,fragment", [c[1:] for c in PROFILE_CASES], ids=[c[0] for c in PROFILE_CASES])
def test_bad_profile_flags_exit_2_naming_the_flag(flags, fragment, tmp_path, capsys):
    json_file = tmp_path / "nodes.json"
    code, err = run_cli(["profile", "--address", "127.0.0.1:1", "--json", str(json_file), *flags], capsys)
    assert code == 2
    assert fragment in err
    assert not json_file.exists()


def test_missing_data_dir(tmp_path, capsys):
    code, err = run_cli(base_args(tmp_path / "runs") + ["--dataset", "cifar10", "--data-dir", str(tmp_path / "nope")], capsys)
    assert code == 2 and "nope" in err and "--download" in err
    assert not (tmp_path / "runs").exists()


def test_malformed_data_dir(tmp_path, capsys):
    root = corrupt_cifar(tmp_path)
    # The test's files are not the published ones: --no-verify-checksums gets past the md5
    # check to the file that is broken.
    code, err = run_cli(base_args(tmp_path / "runs") + ["--dataset", "cifar10", "--data-dir", str(root),
                                                        "--no-verify-checksums"], capsys)
    assert code == 2 and "data_batch_3" in err and "truncated" in err
    assert not (tmp_path / "runs").exists()


def test_cifar_files_that_are_not_the_published_ones(tmp_path, capsys):
    root = write_cifar10(tmp_path / "cifar", num_train=50, num_test=20)
    code, err = run_cli(base_args(tmp_path / "runs") + ["--dataset", "cifar10", "--data-dir", str(root)], capsys)
    assert code == 2 and "data_batch_1" in err and "md5" in err and "--no-verify-checksums" in err
    assert not (tmp_path / "runs").exists()


def test_output_dir_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("not a directory")
    code, err = run_cli(base_args(target), capsys)
    assert code == 2 and "is not a directory" in err


def test_output_dir_that_cannot_be_written(capsys):
    code, err = run_cli(base_args("/proc/hetero_ray_runs"), capsys)
    assert code == 2 and "cannot be written" in err
    assert not os.path.exists("/proc/hetero_ray_runs")


def test_resume_with_nothing_to_resume(tmp_path, capsys):
    code, err = run_cli(base_args(tmp_path / "runs") + ["--resume"], capsys)
    assert code == 2 and "nothing to resume" in err
    assert not (tmp_path / "runs" / "bad").exists()


def test_existing_run_directory_is_not_overwritten(tmp_path, capsys):
    existing = tmp_path / "runs" / "bad"
    existing.mkdir(parents=True)
    (existing / "keep.txt").write_text("precious")
    code, err = run_cli(base_args(tmp_path / "runs"), capsys)
    assert code == 2 and "already exists" in err and "--resume" in err
    assert (existing / "keep.txt").read_text() == "precious"


def test_bad_speed_change_rank(tmp_path, capsys):
    code, err = run_cli(base_args(tmp_path / "runs") + ["--emulate-speed-changes", "10:5:0.5"], capsys)
    assert code == 2 and "rank 5 does not exist" in err


@pytest.mark.ray
def test_more_workers_than_the_cluster_can_place(ray_session, tmp_path, capsys):
    code, err = run_cli(base_args(tmp_path / "runs") + ["--num-workers", "64", "--global-batch-size", "64"], capsys)
    assert code == 2
    assert "can place 8 worker(s) of 1 CPU" in err and "8 CPU" in err
    assert not (tmp_path / "runs").exists()


def test_unreachable_address_fails_fast(tmp_path):
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "hetero_ray", *base_args(tmp_path / "runs"), "--address", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,  # generous: imports take long on a busy machine
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert completed.returncode == 2, completed.stderr
    # Said by the connection check made before Ray is asked to connect: it does not wait on Ray.
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in completed.stderr
    print(f"\nexit 2 {time.monotonic() - started:.1f} s after the start")  # a figure, not a check
    assert not (tmp_path / "runs").exists()
