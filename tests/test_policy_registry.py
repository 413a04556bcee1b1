"""A policy is one class in one place: registered in this test module alone, it is known to
``hetero-ray train``'s ``--policy``, to ``HeteroConfig``, to the planner (as the driver hands
it to the planner actor: its class) and to ``hetero-ray plan``; nothing else names it."""

from __future__ import annotations

import json

import pytest

from hetero_ray.config import PlanConfig
from hetero_ray.errors import ConfigError
from hetero_ray.hetero_config import HeteroConfig
from hetero_ray.planning import policies
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.planner import Planner
from hetero_ray.planning.rank_facts import RankFacts
from tests import cli
from tests.helpers import h100_document, user_policy_file, with_cpu_probe


class FrontLoadedPolicy(policies.StaticPolicy):
    """Rank 0 holds half the global batch, the others share the rest equally; never changes."""

    name = "front_loaded"

    def initial_plan(self, global_batch_size, num_workers, capacities=None, caps=None) -> Plan:
        self._check_room(global_batch_size, num_workers)
        first = global_batch_size // 2 if num_workers > 1 else global_batch_size
        rest = global_batch_size - first
        others = [rest // (num_workers - 1) + (r < rest % (num_workers - 1)) for r in range(num_workers - 1)]
        return Plan(0, (first, *others), "front_loaded: half on rank 0")


@pytest.fixture
def registered(monkeypatch):
    """FrontLoadedPolicy registered for one test (the registry as it was afterwards)."""
    monkeypatch.setattr(policies, "_REGISTERED", dict(policies._REGISTERED))
    return policies.register_policy(FrontLoadedPolicy)


def test_an_unregistered_name_is_refused_everywhere_with_the_registered_ones():
    with pytest.raises(ConfigError, match="one of static, proportional, dynamic, optimal; got 'front_loaded'"):
        HeteroConfig(global_batch_size=64, policy="front_loaded")
    with pytest.raises(ConfigError, match="--policy"):
        PlanConfig(policy="front_loaded")


def test_a_registered_policy_runs_through_heteroconfig_the_planner_and_the_cli(registered, tmp_path, capsys):
    assert policies.policy_names()[-1] == "front_loaded"
    assert HeteroConfig(global_batch_size=64, policy="front_loaded").policy == "front_loaded"

    # The planner as the planner actor builds it: from the class the driver hands over.
    planner = Planner(64, registered, rebalance_interval=20)
    plan = planner.plan_for(3, ranks=RankFacts(node_ids=["n0", "n0", "n0"], device_kinds=["cpu"] * 3))
    assert plan["local_batch_sizes"] == [32, 16, 16]

    # `hetero-ray train --policy front_loaded` parses into the run's configuration.
    from hetero_ray.cli.main import build_parser
    from hetero_ray.cli.train import config_from_args

    args = build_parser().parse_args(["train", "--policy", "front_loaded"])
    assert config_from_args(args).policy == "front_loaded"

    # `hetero-ray plan` plans with it through the same planner.
    profile = tmp_path / "nodes.json"
    profile.write_text(json.dumps(with_cpu_probe(h100_document())))
    plan_json = tmp_path / "plan.json"
    code, out, err = cli.run_cli(["plan", "--profile", str(profile), "--global-batch-size", "64", "--workers",
                                  "gpu,cpu*2", "--policy", "front_loaded", "--json", str(plan_json)], capsys)
    assert code == 0, err
    report = json.loads(plan_json.read_text())
    assert [w["local_batch_size"] for w in report["workers"]] == [32, 16, 16]
    assert report["plan_reason"] == "front_loaded: half on rank 0"


def test_a_second_class_cannot_take_a_registered_name(registered):
    class Impostor(policies.StaticPolicy):
        name = "front_loaded"

    with pytest.raises(ValueError, match="a name of its own"):
        policies.register_policy(Impostor)
    assert policies.register_policy(FrontLoadedPolicy) is FrontLoadedPolicy  # the same class again is fine


# --- a policy in a user's file: what a CLI user names with --policy-module


def test_the_cli_imports_a_users_policy_module_for_train_and_plan(tmp_path, monkeypatch, capsys):
    from hetero_ray.builtin.config import TrainConfig
    from hetero_ray.cli.main import build_parser
    from hetero_ray.cli.train import config_from_args

    path = user_policy_file(tmp_path, monkeypatch)
    args = build_parser().parse_args(["train", "--policy-module", path, "--policy", "back_loaded"])
    config = config_from_args(args)
    assert (config.policy, config.policy_module) == ("back_loaded", path)
    assert TrainConfig.from_dict(config.to_dict()) == config, "a worker's or a --resume's copy imports it again"

    profile = tmp_path / "nodes.json"
    profile.write_text(json.dumps(with_cpu_probe(h100_document())))
    plan_json = tmp_path / "plan.json"
    code, out, err = cli.run_cli(["plan", "--profile", str(profile), "--global-batch-size", "64", "--workers",
                                  "gpu,cpu*2", "--policy-module", path, "--policy", "back_loaded",
                                  "--json", str(plan_json)], capsys)
    assert code == 0, err
    assert [w["local_batch_size"] for w in json.loads(plan_json.read_text())["workers"]] == [16, 16, 32]


@pytest.mark.parametrize("command", ["train", "plan"])
@pytest.mark.parametrize("module, policy, message", [
    ("{tmp}/none.py", "back_loaded", "--policy-module {tmp}/none.py: no such file"),
    ("no_such_policies_module", "back_loaded", "--policy-module no_such_policies_module: cannot import it"),
    ("{tmp}/broken.py", "back_loaded", "raised while it was imported: RuntimeError: no GPU here"),
    ("{tmp}/json.py", "back_loaded", "--policy-module {tmp}/json.py: a module named json is already imported"),
    ("{policy_file}", "front_back", "--policy must be one of static, proportional, dynamic, optimal, back_loaded; "
                                    "got 'front_back'"),
])
def test_a_policy_module_that_does_not_give_the_policy_exits_2_saying_why(
        tmp_path, monkeypatch, capsys, command, module, policy, message):
    policy_file = user_policy_file(tmp_path, monkeypatch)
    (tmp_path / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "json.py").write_text("raise AssertionError('never imported: json is the standard one')\n")
    fill = dict(tmp=tmp_path, policy_file=policy_file)
    flags = ["--profile", str(tmp_path / "nodes.json"), "--global-batch-size", "64"] if command == "plan" else []
    code, out, err = cli.run_cli([command, *flags, "--policy-module", module.format(**fill), "--policy", policy],
                                 capsys)
    assert code == 2 and message.format(**fill) in err, err
