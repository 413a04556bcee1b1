"""One live run per experiment name on a cluster.

A run's actors are named after the experiment. A second run of the same name would talk
to the first one's actors and write into its files, so it is refused before it writes
anything: by ``hetero-ray train`` (exit 2) and by ``HeteroTrainer.fit()`` (UserError),
with a message that names the run and what to do. The live run does not notice.
"""

from __future__ import annotations

import os

import pytest
import ray
from ray.train import RunConfig, ScalingConfig

from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.errors import UserError
from hetero_ray.runtime import actors
from tests import cli

pytestmark = pytest.mark.ray

NAME = "twin"


def _loop(config):
    pass


@pytest.fixture
def live_run(ray_session, tmp_path):
    """The actors of a run named NAME in progress, started as its driver starts them."""
    run_dir = tmp_path / "first" / NAME
    run_dir.mkdir(parents=True)
    node_id = ray.get_runtime_context().get_node_id()
    store = actors.start_metrics_store(NAME, str(run_dir), node_id)
    planner = actors.start_planner(NAME, str(run_dir), node_id, global_batch_size=32, policy="static",
                                   rebalance_interval=20)
    ray.get(store.begin_attempt.remote(0, 2), timeout=30)
    ray.get(planner.plan_for.remote(2, 0), timeout=30)
    yield {"run_dir": run_dir, "store": store, "files": sorted(os.listdir(run_dir))}
    for actor in (planner, store):
        actors.kill_actor(actor)


def assert_untouched(live_run) -> None:
    assert sorted(os.listdir(live_run["run_dir"])) == live_run["files"]
    assert len(ray.get(live_run["store"].attempts.remote(), timeout=30)) == 1  # its own start only


def test_the_cli_refuses_a_second_run_of_a_live_name(live_run, tmp_path, capsys):
    second = tmp_path / "second"
    code, _, err = cli.run_cli(["train", "--model", "mlp", "--num-samples", "256", "--eval-samples", "64",
                                "--global-batch-size", "32", "--max-steps", "2", "--no-profile", "--num-workers", "2",
                                "--name", NAME, "--storage-path", str(second)], capsys)
    assert code == 2, err
    assert f"a run named {NAME!r} is already running on this Ray cluster" in err
    assert "twin/metrics_store" in err and "Choose another --name" in err
    assert not second.exists(), "the refused run wrote something"
    assert_untouched(live_run)


def test_fit_refuses_a_second_run_of_a_live_name(live_run, tmp_path):
    storage = tmp_path / "second"
    trainer = HeteroTrainer(_loop, scaling_config=ScalingConfig(num_workers=1),
                            run_config=RunConfig(name=NAME, storage_path=str(storage)),
                            hetero_config=HeteroConfig(global_batch_size=8), emit=lambda line: None)
    with pytest.raises(UserError, match="already running on this Ray cluster") as refused:
        trainer.fit()
    assert "Choose another RunConfig(name=...)" in str(refused.value)
    assert not storage.exists(), "the refused run wrote something"
    assert_untouched(live_run)


def test_a_run_never_attaches_to_the_actors_of_another(live_run, tmp_path):
    # Two runs that both passed the check in the same moment: the later actor is refused.
    node_id = ray.get_runtime_context().get_node_id()
    with pytest.raises(UserError, match="already running"):
        actors.start_planner(NAME, str(tmp_path), node_id, global_batch_size=32, policy="static",
                             rebalance_interval=20)
    assert_untouched(live_run)


def test_the_name_is_free_again_once_the_run_has_ended(ray_session, tmp_path):
    node_id = ray.get_runtime_context().get_node_id()
    store = actors.start_metrics_store("ended", str(tmp_path), node_id)
    planner = actors.start_planner("ended", str(tmp_path), node_id, global_batch_size=32, policy="static",
                                   rebalance_interval=20)
    ray.get([store.attempts.remote(), planner.info.remote()], timeout=30)
    with pytest.raises(UserError):
        actors.check_name_free("ended", "--name")
    for actor in (planner, store):
        actors.kill_actor(actor)
    actors.check_name_free("ended", "--name")  # a --resume right after: not refused
