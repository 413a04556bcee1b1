"""`ray job submit` entrypoints write outside Ray's temporary copy of the working dir.

Inside a Ray job (Ray's job supervisor sets RAY_JOB_CONFIG_JSON_ENV_VAR for the job's
driver), relative --storage-path / --json resolve against HETERO_RAY_JOB_OUTPUT_DIR, else
~/hetero_ray. Checked through the real argument parser, and once through a real
`python jobs/train.py` run as a job's driver would start it (in a throwaway copy of the
working dir, with that variable set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from jobs.job_paths import JOB_OUTPUT_DIR_ENV_VAR, RAY_JOB_ENV_VAR, resolve_output_paths

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_job(root=None) -> dict:
    env = {RAY_JOB_ENV_VAR: '{"runtime_env": {}, "metadata": {}}'}
    if root is not None:
        env[JOB_OUTPUT_DIR_ENV_VAR] = str(root)
    return env


def resolve(command, argv, environ):
    printed: list[str] = []
    return resolve_output_paths(command, argv, environ, emit=printed.append), printed


def test_the_variable_is_the_one_ray_sets_for_a_job_driver():
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    assert RAY_JOB_ENV_VAR == RAY_JOB_CONFIG_JSON_ENV_VAR


def test_outside_a_job_nothing_changes(tmp_path):
    argv = ["--model", "mlp", "--storage-path", "runs", "--json", "x.json"]
    assert resolve("train", argv, {JOB_OUTPUT_DIR_ENV_VAR: str(tmp_path)}) == (argv, [])


@pytest.mark.parametrize("command,argv,added", [
    ("train", ["--model", "mlp"], ["--storage-path", "{root}/runs"]),  # the default `runs`
    ("train", ["--storage-path", "out/a"], ["--storage-path", "{root}/out/a"]),
    ("train", ["--storage-path=out/b"], ["--storage-path", "{root}/out/b"]),
    ("train", ["--storage-p", "out/c"], ["--storage-path", "{root}/out/c"]),  # argparse's abbreviation
    ("train", ["--storage-path", "/abs/runs"], []),
    ("profile", ["--json", "nodes.json"], ["--json", "{root}/nodes.json"]),
    ("profile", ["--model", "mlp"], []),
    ("bench", ["--json", "bench.json", "--output-dir", "/abs/bench"], ["--json", "{root}/bench.json"]),
])
def test_relative_output_paths_resolve_against_the_job_output_dir(tmp_path, command, argv, added):
    resolved, printed = resolve(command, argv, in_job(tmp_path))
    assert resolved == argv + [a.format(root=tmp_path) for a in added]
    if added:
        assert printed and "running as a Ray job: results go to" in printed[0]
        assert added[1].format(root=tmp_path) in printed[0]
    else:
        assert not printed


def test_the_bench_default_lands_under_the_job_output_dir(tmp_path):
    resolved, _ = resolve("bench", [], in_job(tmp_path))
    assert resolved[0] == "--output-dir" and resolved[1].startswith(f"{tmp_path}/runs/bench-")


def test_without_the_variable_results_go_to_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    resolved, printed = resolve("train", [], in_job())
    assert resolved == ["--storage-path", f"{tmp_path}/hetero_ray/runs"]
    assert os.path.isdir(tmp_path / "hetero_ray")


def test_bad_flags_still_fail_as_the_cli_does(tmp_path):
    with pytest.raises(SystemExit) as exited:
        resolve("train", ["--global-batch-size", "six"], in_job(tmp_path))
    assert exited.value.code == 2


@pytest.mark.ray
@pytest.mark.slow
def test_a_job_driver_writes_its_run_outside_the_working_dir_copy(tmp_path, session_ray_address):
    """`python jobs/train.py` started the way Ray's job supervisor starts it: from a copy
    of the working dir (which Ray deletes later), with RAY_JOB_CONFIG_JSON_ENV_VAR set and
    RAY_ADDRESS naming the running cluster."""
    copy = tmp_path / "runtime_resources" / "working_dir_files" / "hetero_ray"
    shutil.copytree(REPO_ROOT, copy,
                    ignore=shutil.ignore_patterns(".venv", ".git", "runs", "*.egg-info"))  # bytecode too: as fast as the original
    results = tmp_path / "results"
    env = {**os.environ, **in_job(results), "RAY_ADDRESS": session_ray_address, "PYTHONPATH": str(copy)}
    completed = subprocess.run(
        [sys.executable, "jobs/train.py", "--model", "mlp", "--num-samples", "128", "--eval-samples", "32",
         "--global-batch-size", "32", "--epochs", "1", "--num-workers", "2", "--no-profile", "--policy", "static",
         "--name", "job"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    run_dir = results / "runs" / "job"
    assert f"running as a Ray job: results go to --storage-path {results}/runs" in completed.stdout
    assert f"results: {run_dir}" in completed.stdout
    assert (run_dir / "summary.json").is_file() and (run_dir / "steps.parquet").is_file()
    assert not (copy / "runs").exists(), "the run landed in the working dir copy"
