"""The training configuration: TrainConfig's parts, the rules across parts, the flat
contract (construction, reads, config.json) and the CLI generated from the parts.

Pure Python, no Ray. The shared validators are in test_validate.py, the CLI's messages
for bad flags in test_cli_bad_input.py, the public API's in test_api_bad_use.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from hetero_ray.builtin.config import (
    ProbeChoice, TrainConfig, changed_on_resume, parts, setting_flag, setting_names,
)
from hetero_ray.config import ClusterConfig, EmulationConfig, PlanConfig, ProfilingConfig
from hetero_ray.errors import ConfigError


# --- the parts check their own fields


@pytest.mark.parametrize("part, settings, message", [
    (ClusterConfig, dict(num_workers=2, min_workers=3), "--num-workers 3-2: the minimum must not exceed the maximum"),
    (ClusterConfig, dict(num_workers=2, worker_devices=["gpu", "gpu"], use_gpu="no"), "but --use-gpu is no"),
    (ClusterConfig, dict(num_workers=1, worker_devices=["cpu"], worker_labels=[{"a": "b"}]),
     "give one of them"),
    (PlanConfig, dict(rebalance_threshold=1.0), "--rebalance-threshold must be in [0, 1)"),
    (PlanConfig, dict(plan_changes=[{"global_step": -1, "local_batch_sizes": [1]}]), "--plan-changes: each change"),
    (EmulationConfig, dict(emulate_speeds=[1, 2]), "--emulate-speeds values must be in (0, 1]"),
    (EmulationConfig, dict(emulate_speed_changes=[{"global_step": 1, "rank": 0, "speed": 2}]),
     "--emulate-speed-changes: each change"),
    (ProfilingConfig, dict(profile_batch_sizes=[8]), "--profile-batch-sizes needs two or more different"),
    (ProfilingConfig, dict(profile_timeout_s=0), "--profile-timeout-s must be a positive number of seconds"),
])
def test_a_part_rejects_its_own_bad_fields(part, settings, message):
    with pytest.raises(ConfigError) as raised:
        part(**settings)
    assert message in str(raised.value)


def test_parts_keep_the_checked_form_and_cannot_be_changed_after():
    speeds = EmulationConfig(emulate_speeds=(1, 0.5))
    assert speeds.emulate_speeds == [1.0, 0.5]
    assert ProfilingConfig(profile_batch_sizes=(16, 8)).profile_batch_sizes == [8, 16]
    with pytest.raises(dataclasses.FrozenInstanceError):
        speeds.emulate_speeds = [0.0]


def test_train_config_rejects_a_single_probe_size_naming_its_flag():
    """Before, TrainConfig let it through and the profiler refused it later under the
    profile command's --batch-sizes, a flag `train` does not have."""
    with pytest.raises(ConfigError, match="--profile-batch-sizes needs two or more different positive sizes"):
        TrainConfig(profile_batch_sizes=[8])
    assert TrainConfig(profile_batch_sizes=[16, 8]).probe_batch_sizes() == [8, 16]


# --- rules across parts: checked once, by TrainConfig


@pytest.mark.parametrize("settings, message", [
    (dict(global_batch_size=3, num_workers=4), "--global-batch-size 3 is smaller than --num-workers 4"),
    (dict(global_batch_size=64, num_samples=32), "--num-samples 32 is smaller than --global-batch-size 64"),
    (dict(global_batch_size=64, batch_split=[40, 24, 0]), "--batch-split has 3 values but --num-workers is 2"),
    (dict(global_batch_size=64, batch_split=[40, 20]), "--batch-split sums to 60, but --global-batch-size is 64"),
    (dict(global_batch_size=64, plan_changes=[{"global_step": 4, "local_batch_sizes": [64]}]),
     "--plan-changes at step 4 has 1 values but --num-workers is 2"),
    (dict(global_batch_size=64, plan_changes=[{"global_step": 4, "local_batch_sizes": [60, 3]}]),
     "--plan-changes at step 4 sums to 63, but --global-batch-size is 64"),
    (dict(emulate_speeds=[1.0, 0.5, 0.5]), "--emulate-speeds has 3 values but --num-workers is 2"),
    (dict(emulate_speed_changes=[{"global_step": 4, "rank": 2, "speed": 0.5}]),
     "--emulate-speed-changes rank 2 does not exist with --num-workers 2"),
])
def test_rules_across_parts(settings, message):
    with pytest.raises(ConfigError) as raised:
        TrainConfig(name="x", **settings)
    assert message in str(raised.value)


def test_a_file_dataset_is_not_held_to_num_samples():
    config = TrainConfig(dataset="cifar10", data_dir="/data", global_batch_size=8192, num_samples=16, name="x")
    assert config.global_batch_size == 8192


# --- the flat contract: construction, reads, config.json


def test_flat_settings_go_to_their_parts_and_read_back_flat():
    config = TrainConfig(model="mlp", global_batch_size=48, num_workers=3, policy="static", emulate_speeds=[1, 1, 0.5],
                         profile_timeout_s=30, name="x")
    assert (config.data.model, config.batch.global_batch_size, config.cluster.num_workers) == ("mlp", 48, 3)
    assert (config.plan.policy, config.emulation.emulate_speeds) == ("static", [1.0, 1.0, 0.5])
    assert (config.global_batch_size, config.num_workers, config.profile_timeout_s) == (48, 3, 30)
    with pytest.raises(AttributeError):
        config.global_batch_size = 64  # read-only: a change goes through replace(), which checks it
    assert config.replace(global_batch_size=96).global_batch_size == 96 and config.global_batch_size == 48
    with pytest.raises(ConfigError, match="--global-batch-size 2 is smaller than --num-workers 3"):
        config.replace(global_batch_size=2)


def test_every_setting_belongs_to_exactly_one_part():
    names = [f.name for part in parts().values() for f in dataclasses.fields(part)]
    assert len(names) == len(set(names)) == len(setting_names())
    assert not set(names) & set(parts()), "a setting named like a part would hide it"
    with pytest.raises(TypeError, match="unknown settings: bogus"):
        TrainConfig(bogus=1)


def test_config_json_round_trips_and_keeps_the_keys_the_dashboard_reads():
    config = TrainConfig(global_batch_size=48, num_workers=3, batch_split=[16, 16, 16], min_workers=2,
                         plan_changes=[{"global_step": 4, "local_batch_sizes": [8, 16, 24]}], name="x")
    recorded = config.to_dict()
    assert list(recorded) == list(setting_names())
    assert {"epochs", "max_steps", "global_batch_size", "dataset", "num_samples", "drop_last", "policy", "num_workers",
            "model", "emulate_speeds", "name"} <= set(recorded)
    assert TrainConfig.from_dict(recorded) == config
    recorded["batch_split"].append(1)
    assert config.batch_split == [16, 16, 16], "to_dict hands out copies"


def test_a_config_json_of_an_older_version_still_loads():
    older = TrainConfig(name="x").to_dict()
    del older["emulate_speed_changes"]  # recorded before the speed changes were a setting
    assert TrainConfig.from_dict(older).emulate_speed_changes is None
    for key, renamed in (("global_batch_size", "batch_size"), ("name", "experiment_name"),
                         ("storage_path", "output_dir")):  # the settings' names before they were the flags'
        older[renamed] = older.pop(key)
    assert TrainConfig.from_dict(older) == TrainConfig.from_dict(TrainConfig(name="x").to_dict())
    assert changed_on_resume(older, TrainConfig(name="x")) == []
    with pytest.raises(ConfigError, match="unknown configuration keys: bogus"):
        TrainConfig.from_dict({**older, "bogus": 1})


def test_one_profile_timeout_default_everywhere():
    from hetero_ray import HeteroConfig
    from hetero_ray.profile_defaults import DEFAULT_PROFILE_TIMEOUT_S
    from hetero_ray.profiling.profile_config import ProfileConfig

    assert TrainConfig().profile_timeout_s == ProfileConfig().timeout_s == DEFAULT_PROFILE_TIMEOUT_S
    assert HeteroConfig(global_batch_size=8).profile_timeout_s == DEFAULT_PROFILE_TIMEOUT_S


def test_hetero_config_is_checked_by_the_parts_of_the_cli_in_its_own_words():
    """One set of checks: a value the CLI refuses naming its flag, HeteroConfig refuses
    naming its field; the rules that join parts are the same functions."""
    from hetero_ray import HeteroConfig

    for settings, api, flag in [
        (dict(policy="fastest"), "HeteroConfig.policy must be one of", "--policy must be one of"),
        (dict(rebalance_cooldown=-1), "HeteroConfig.rebalance_cooldown must be", "--rebalance-cooldown must be"),
        (dict(profile_timeout_s=-1), "HeteroConfig.profile_timeout_s must be", "--profile-timeout-s must be"),
        (dict(emulate_speeds=[0]), "HeteroConfig.emulate_speeds values must be", "--emulate-speeds values must be"),
        (dict(batch_split=[3, 3]), "HeteroConfig.batch_split sums to 6, but HeteroConfig.global_batch_size is 8",
         "--batch-split sums to 6, but --global-batch-size is 8"),
    ]:
        with pytest.raises(ConfigError) as from_api:
            HeteroConfig(global_batch_size=8, **settings)
        with pytest.raises(ConfigError) as from_cli:
            TrainConfig(global_batch_size=8, num_workers=2, **settings)
        assert api in str(from_api.value) and flag in str(from_cli.value)
        assert str(from_api.value).replace(api, flag).replace("HeteroConfig.global_batch_size", "--global-batch-size") \
            == str(from_cli.value)


# --- the CLI is generated from the parts


def _train_args(*flags: str):
    from hetero_ray.cli.main import build_parser

    return build_parser().parse_args(["train", *flags])


def test_every_setting_has_a_flag_and_the_flags_defaults_are_the_configs():
    from hetero_ray.cli.train import config_from_args

    args = _train_args("--name", "x")
    assert set(setting_names()) - set(vars(args)) == {"min_workers"}  # set by --num-workers MIN-MAX
    assert config_from_args(args) == TrainConfig(name="x")
    assert setting_flag("profile_timeout_s") == "--profile-timeout-s"
    assert setting_flag("profile") == "--no-profile"
    assert setting_flag("worker_labels") == "--worker-labels"


def test_flags_become_settings():
    from hetero_ray.cli.train import config_from_args

    config = config_from_args(_train_args(
        "--model", "mlp", "--global-batch-size", "48", "--num-workers", "2-3", "--batch-split", "16,16,16",
        "--emulate-speeds", "1,1,0.5", "--emulate-speed-changes", "10:2:0.25", "--emulate-speed-changes", "20:2:1",
        "--plan-changes", "5:8,16,24", "--no-profile", "--no-verify-checksums", "--profile-timeout-s", "30",
        "--worker-labels", "a=1;a=1;b=2", "--drop-last", "--allow-non-finite-loss", "--name", "flags"))
    assert (config.model, config.global_batch_size, config.min_workers, config.num_workers) == ("mlp", 48, 2, 3)
    assert config.cluster.elastic and config.batch_split == [16, 16, 16]
    assert config.emulate_speed_changes == [{"global_step": 10, "rank": 2, "speed": 0.25},
                                            {"global_step": 20, "rank": 2, "speed": 1.0}]
    assert config.plan_changes == [{"global_step": 5, "local_batch_sizes": [8, 16, 24]}]
    assert (config.profile, config.verify_checksums, config.drop_last) == (False, False, True)
    assert config.allow_non_finite_loss and not TrainConfig().allow_non_finite_loss
    assert config.profile_timeout_s == 30 and config.worker_labels == [{"a": "1"}, {"a": "1"}, {"b": "2"}]


def test_help_groups_the_flags_by_part_and_shows_the_defaults(capsys):
    from hetero_ray.cli.main import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split("options:")[1].split())  # the flags, one line
    order = ["what to train:", "--model MODEL", "the global batch (what the optimiser's trajectory depends on, never the "
             "workers):", "--global-batch-size", "optimisation:", "--lr LR",
             "emulation (heterogeneity on one machine):", "--emulate-speed-changes STEP:RANK:SPEED", "profiling:"]
    assert [text.index(heading) for heading in order] == sorted(text.index(heading) for heading in order)
    assert "(default 2)" in text.split("--num-workers N|MIN-MAX")[1].split("--cpus-per-worker")[0]
    assert "--profile-timeout-s SECONDS seconds for profiling the whole cluster (default 120.0)" in text


# --- hetero-ray profile is generated from ProfileConfig the same way


def _profile_args(*flags: str):
    from hetero_ray.cli.main import build_parser

    return build_parser().parse_args(["profile", *flags])


def test_every_profile_setting_has_a_flag_and_the_flags_defaults_are_the_configs():
    from hetero_ray.cli.profile import config_from_args
    from hetero_ray.profiling.profile_config import ProfileConfig

    args = _profile_args()
    # A field added to ProfileConfig without a flag lands in this difference.
    unflagged = {f.name for f in dataclasses.fields(ProfileConfig)} - set(vars(args))
    assert unflagged == {"microbench_s", "probe_cpu_on_gpu_nodes"}  # set from Python only
    # --model names a built-in model (ProbeChoice); the command turns it into ProfileConfig.model's recipe.
    assert {f.name for f in dataclasses.fields(ProbeChoice)} <= set(vars(args))
    assert config_from_args(args) == (ProbeChoice(), ProfileConfig())
    assert (args.address, args.json) == (None, None)  # the command's own flags, beside the settings


def test_profile_flags_become_settings():
    from hetero_ray.cli.profile import config_from_args

    choice, config = config_from_args(_profile_args(
        "--model", "mlp", "--dataset", "synthetic_image", "--batch-sizes", "32,8", "--cpus-per-worker", "2",
        "--ram-fraction", "0.25", "--timeout-s", "30"))
    assert (choice.model, choice.dataset, config.batch_sizes) == ("mlp", "synthetic_image", (8, 32))
    assert (config.cpus_per_worker, config.ram_fraction, config.timeout_s) == (2.0, 0.25, 30.0)
