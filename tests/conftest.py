"""Shared fixtures: one real local Ray cluster per test session, fast run configurations."""

from __future__ import annotations

import os

import pytest

# Progress lines every second and Parquet parts every second keep test runs observable.
os.environ.setdefault("HETERO_RAY_PROGRESS_INTERVAL_S", "2")
os.environ.setdefault("HETERO_RAY_PARQUET_FLUSH_INTERVAL_S", "1")
# Short runs: records reach the balancer four times a second so it can act within them.
os.environ.setdefault("HETERO_RAY_RECORD_FLUSH_INTERVAL_S", "0.25")
# Ray Train's controller looks at its workers every 2 s, and a worker's report waits for
# the look that takes the one before it (a queue of one): a loop reporting every step
# steps at most once per look, and a run's end is seen a look later. Looking every 0.1 s
# saves ~2 s per fit of four steps here. A slow look is not a missed one (a worker is
# declared lost only after 10 min of unanswered looks).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
# Ray's log monitor looks for new worker log files every 0.1 s until there are 1,000 of them,
# a glob of the whole folder each time: with the ~400 files of a few hundred actors it took
# 3.8 % of a core while Ray sat idle, 1.5 % looking every 0.5 s (its pace past 1,000 files).
# A suite starts ~700 workers. A new worker's first lines reach its driver up to 0.5 s later.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")

# Ray workers started by the session cluster must import this checkout's packages.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _ray_auth_mode_stays_as_it_was():
    """The CLI sets RAY_AUTH_MODE for an explicit --address before Ray loads; a test that
    runs it in this process must not leave it set. An already imported Ray keeps the mode
    it read, while the local cluster ray_session starts would read the changed one, and
    the two would then refuse each other."""
    before = os.environ.get("RAY_AUTH_MODE")
    yield
    if before is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = before


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray for the whole session (startup costs 5–10 s here; share it)."""
    if os.environ.get("HETERO_RAY_TESTS_WITHOUT_RAY"):  # scripts/test.sh's second process
        pytest.fail("this test uses the session's Ray but is not marked pytest.mark.ray: mark it, so that "
                    "scripts/test.sh runs it with the other Ray tests")
    import ray

    from hetero_ray.constants import RAY_NAMESPACE
    from hetero_ray.runtime.cluster import QUIET_ENV

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # Logical CPUs beyond the 2 real cores: 4 training workers plus Ray Train's controller
    # must fit; the workers then share the cores, which is what emulation expects anyway.
    # The dashboard stays on: without it Ray Train's placement-group cleaner cannot see
    # that the controller is alive, and now and then removes a running job's placement group.
    # The checkout reaches the workers through the environment the session's raylet is
    # started with (its workers inherit it), not a runtime_env: with one, Ray starts every
    # worker through its runtime-env setup process first, ~0.45 s more per actor (a fit
    # starts ~7; the suite ~300). Later subprocesses do not see it.
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, before) if p)
    try:
        ray.init(address="local", num_cpus=8, include_dashboard=True, namespace=RAY_NAMESPACE,
                 logging_level="WARNING")
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before
    yield ray
    ray.shutdown()


@pytest.fixture
def session_ray_address(ray_session) -> str:
    """The session Ray's address: a subprocess driver given it as RAY_ADDRESS joins this
    cluster, as a driver on a running cluster does, where starting a local Ray of its own
    (~6 s here) is not what the test is about."""
    return ray_session.get_runtime_context().gcs_address


def _fast_config(output_dir: str, **overrides):
    from hetero_ray.builtin.config import TrainConfig

    values = dict(model="mlp", dataset="synthetic_image", num_samples=256, eval_samples=64,
                  global_batch_size=32, epochs=1, num_workers=2, storage_path=output_dir,
                  checkpoint_every=1000, max_failures=0, policy="static", profile=False)
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture
def fast_config(tmp_path):
    """Builds a small, fast TrainConfig in a temporary output directory."""
    return lambda **overrides: _fast_config(str(tmp_path / "runs"), **overrides)


@pytest.fixture(scope="session")
def one_worker_run(ray_session, tmp_path_factory):
    """tests/helpers.py's ONE_DEVICE_JOB on one worker, trained once for the session: one
    device's weights and losses."""
    from hetero_ray.builtin.driver import run_training
    from tests.helpers import ONE_DEVICE_JOB

    return run_training(_fast_config(str(tmp_path_factory.mktemp("one-worker")), num_workers=1,
                                     name="one", **ONE_DEVICE_JOB))


_KUBERAY_SCHEMA_TESTS = "tests/test_cluster_configs_kuberay.py"
_FILES_SHOWN = 20
_seconds_per_file: dict = {}


def pytest_runtest_logreport(report):
    """Adds each phase's time (setup, call, teardown) to its test file's total."""
    path = report.nodeid.split("::", 1)[0]
    _seconds_per_file[path] = _seconds_per_file.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    _write_kuberay_counts(terminalreporter)
    _write_slowest_files(terminalreporter)


def _write_slowest_files(terminalreporter):
    """The files that took longest, all phases together: where a suite's time goes is a
    file's fits and fixtures as much as its slowest test (pytest's --durations)."""
    total = sum(_seconds_per_file.values())
    if total < 60:  # a handful of tests: nothing to look for
        return
    terminalreporter.write_sep("=", f"slowest {_FILES_SHOWN} test files (of {total:.0f} s in tests)")
    for path, seconds in sorted(_seconds_per_file.items(), key=lambda item: -item[1])[:_FILES_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}s {100 * seconds / total:5.1f}%  {path}")


def _write_kuberay_counts(terminalreporter):
    """Says how many KubeRay schema checks passed or skipped: they run only where KubeRay's
    CRDs were found (CI has them), and a skipped check is silent in pytest's one-line total."""
    counts = {outcome: sum(1 for report in terminalreporter.stats.get(outcome, [])
                           if getattr(report, "nodeid", "").startswith(_KUBERAY_SCHEMA_TESTS))
              for outcome in ("passed", "failed", "skipped")}
    if any(counts.values()):
        terminalreporter.write_line(
            "KubeRay schema checks (" + _KUBERAY_SCHEMA_TESTS + "): "
            + ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n))
