"""The validators every configuration shares (hetero_ray/validate.py): each rejects a bad
value naming the setting it was given, and returns the form the configurations store."""

from __future__ import annotations

import pytest

from hetero_ray import validate
from hetero_ray.errors import ConfigError


@pytest.mark.parametrize("check, args, message", [
    (validate.choice, ("--policy", "fastest", ("static", "optimal")),
     "--policy must be one of static, optimal; got 'fastest'"),
    (validate.switch, ("X.profile", "yes"), "X.profile must be True or False"),
    (validate.positive_int, ("--epochs", 0), "--epochs must be a positive integer, got 0"),
    (validate.positive_int, ("--epochs", 2.0), "--epochs must be a positive integer, got 2.0"),
    (validate.positive_int, ("--epochs", True), "--epochs must be a positive integer, got True"),
    (validate.non_negative_int, ("--seed", -1), "--seed must be a non-negative integer"),
    (validate.positive_number, ("--lr", 0), "--lr must be a positive number, got 0"),
    (validate.positive_number, ("--lr", float("inf")), "--lr must be a positive number"),
    (validate.positive_number, ("--lr", float("nan")), "--lr must be a positive number"),
    (validate.positive_number, ("--timeout", -1, "seconds"), "--timeout must be a positive number of seconds"),
    (validate.fraction, ("--ram-fraction", 0), "--ram-fraction must be in (0, 1]"),
    (validate.fraction, ("--ram-fraction", 1.01, "RAM"), "--ram-fraction must be in (0, 1] (a fraction of RAM)"),
    (validate.fraction_below_one, ("--rebalance-threshold", 1), "--rebalance-threshold must be in [0, 1)"),
    (validate.fraction_below_one, ("--rebalance-threshold", -0.1), "must be in [0, 1)"),
    (validate.fractions, ("--emulate-speeds", [1, 0]), "--emulate-speeds values must be in (0, 1]"),
    (validate.fractions, ("--emulate-speeds", []), "--emulate-speeds values must be in (0, 1]"),
    (validate.fractions, ("--emulate-speeds", "1,0.5"), "--emulate-speeds must be a list of values"),
    (validate.int_list, ("--batch-split", [40, 2.5]), "--batch-split values must be integers"),
    (validate.probe_sizes, ("--profile-batch-sizes", [8]), "--profile-batch-sizes needs two or more different"),
    (validate.probe_sizes, ("--profile-batch-sizes", [8, 8]), "--profile-batch-sizes needs two or more different"),
    (validate.probe_sizes, ("--profile-batch-sizes", [0, 8]), "--profile-batch-sizes must be positive integers"),
    (validate.probe_sizes, ("--profile-batch-sizes", []), "--profile-batch-sizes must be positive integers"),
    (validate.shares, ("--batch-split", [64, 0], 64, "--global-batch-size"), "--batch-split values must be ≥ 1"),
    (validate.shares, ("--batch-split", [40, 20], 64, "--global-batch-size"),
     "--batch-split sums to 60, but --global-batch-size is 64 (got 40,20)"),
    (validate.per_rank, ("--emulate-speeds", [1.0], 2), "--emulate-speeds has 1 values but --num-workers is 2"),
    (validate.speed_changes, ("X", [{"global_step": 5, "rank": 0}]), "X: each change has the keys"),
    (validate.speed_changes, ("X", [{"global_step": 5, "rank": 0, "speed": 0}]), "speed (in (0, 1])"),
    (validate.speed_changes, ("X", [{"global_step": -1, "rank": 0, "speed": 1}]), "integers ≥ 0"),
    (validate.plan_changes, ("X", [{"global_step": 5}]), "X: each change has the keys global_step"),
    (validate.plan_changes, ("X", [{"global_step": 5, "local_batch_sizes": [1, "a"]}]),
     "X at step 5 values must be integers"),
])
def test_each_validator_rejects_naming_the_setting(check, args, message):
    with pytest.raises(ConfigError) as raised:
        check(*args)
    assert message in str(raised.value)


def test_validators_return_what_the_configs_store():
    assert validate.positive_number("x", 2) == 2.0 and isinstance(validate.positive_number("x", 2), float)
    assert validate.fractions("x", (1, 0.5)) == [1.0, 0.5]
    assert validate.probe_sizes("x", (32, 8, 8, 16)) == [8, 16, 32]
    assert validate.shares("x", (40, 24), 64, "B") == [40, 24]
    assert validate.speed_changes("x", ({"global_step": 3, "rank": 1, "speed": 1},)) == [
        {"global_step": 3, "rank": 1, "speed": 1.0}]


def test_the_profilers_config_names_the_profile_commands_flags():
    from hetero_ray.profiling.profile_config import ProfileConfig

    with pytest.raises(ConfigError, match="--batch-sizes needs two or more different positive sizes"):
        ProfileConfig(batch_sizes=(8,))
    with pytest.raises(ConfigError, match=r"--ram-fraction must be in \(0, 1\]"):
        ProfileConfig(ram_fraction=1.5)
    with pytest.raises(ConfigError, match="--timeout-s must be a positive number of seconds"):
        ProfileConfig(timeout_s=0)
    assert ProfileConfig(batch_sizes=[32, 8, 8]).batch_sizes == (8, 32)


def test_a_setting_is_named_in_the_words_of_the_front_end_that_checks_it():
    api = validate.Words("HeteroConfig", {"num_workers": "ScalingConfig"})
    assert validate.named("profile_timeout_s") == "--profile-timeout-s"
    with validate.words(api):
        assert validate.named("profile_timeout_s") == "HeteroConfig.profile_timeout_s"
        with pytest.raises(ConfigError, match=r"^HeteroConfig.batch_split has 1 values but ScalingConfig.num_workers"):
            validate.per_rank(validate.named("batch_split"), [1], 2)
    assert validate.named("num_workers") == "--num-workers", "the words end with the block"
