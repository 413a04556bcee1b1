"""One vocabulary: every ``HeteroConfig`` field is the ``hetero-ray train`` flag of the same
name (``global_batch_size`` is ``--global-batch-size``), or is listed below as set from
Python only, with the reason; the run's name and where runs go are Ray Train's
``RunConfig(name=, storage_path=)`` as ``--name`` and ``--storage-path``. The old spellings
still work and say which flag to use. No Ray; the parsers are built in this process."""

from __future__ import annotations

import dataclasses

import pytest

from hetero_ray import HeteroConfig
from hetero_ray.builtin.config import TrainConfig, setting_names
from hetero_ray.cli.main import build_parser, main
from hetero_ray.cli.reference import subcommand_parsers
from hetero_ray.cli.train import config_from_args
from hetero_ray.flags import DeprecatedFlag

# HeteroConfig fields with no flag of their name, and why.
API_ONLY = {
    "profile_model": "a Python object (how to build the model and a batch); the CLI's --model names a built-in one",
    "output_dir": "where the tables go when RunConfig.storage_path is a URI; the CLI writes to a local or "
                  "shared --storage-path itself",
    "feed_trial": "the Ray Data path's (HeteroTrainer(datasets=...)); the CLI's built-in jobs read map-style datasets",
    "feed_trial_steps": "the Ray Data path's feeding trial, as feed_trial",
}


def _own_flag(setting: str) -> str:
    """``--x-y`` for ``x_y``; ``--no-x-y`` for a switch that is on by default (argparse's one way to
    turn it off)."""
    on_by_default = TrainConfig(name="x").to_dict().get(setting) is True
    return "--" + ("no-" if on_by_default else "") + setting.replace("_", "-")


def _flags(command: str) -> dict[str, object]:
    parser = subcommand_parsers()[command]
    return {flag: action for action in parser._actions for flag in action.option_strings}


def test_every_hetero_config_field_is_the_train_flag_of_its_name_or_api_only():
    flags = _flags("train")
    missing = []
    for field in dataclasses.fields(HeteroConfig):
        if field.name in API_ONLY:
            assert API_ONLY[field.name], field.name
            continue
        flag = _own_flag(field.name)
        if flag not in flags or isinstance(flags[flag], DeprecatedFlag):
            missing.append(f"HeteroConfig.{field.name}: no {flag}")
    assert not missing, "\n".join(missing)
    assert set(API_ONLY) <= {f.name for f in dataclasses.fields(HeteroConfig)}, "API_ONLY names a field that is gone"


def test_every_train_flag_is_the_name_of_the_setting_it_sets():
    """``--x-y`` fills the setting ``x_y`` of TrainConfig and config.json: no flag is spelled
    apart from its field, so an error, the docs and a run's files all use one word."""
    for flag, action in _flags("train").items():
        if action.dest not in setting_names() or isinstance(action, DeprecatedFlag):
            continue
        own = _own_flag(action.dest)
        assert flag == own, f"{flag} sets {action.dest}: name the flag {own}"
    flagged = {action.dest for action in _flags("train").values()}
    assert set(setting_names()) - flagged == {"min_workers"}, "min_workers is set by --num-workers MIN-MAX"


def test_every_profile_flag_is_the_name_of_the_setting_it_sets():
    from hetero_ray.builtin.config import ProbeChoice
    from hetero_ray.profiling.profile_config import ProfileConfig

    settings = {f.name for cls in (ProbeChoice, ProfileConfig) for f in dataclasses.fields(cls)}
    for flag, action in _flags("profile").items():
        if action.dest in settings and not isinstance(action, DeprecatedFlag):
            assert flag == "--" + action.dest.replace("_", "-"), f"{flag} sets {action.dest}"


def test_the_run_name_and_where_runs_go_are_ray_trains_words_everywhere():
    train, plan = _flags("train"), _flags("plan")
    for flag in ("--global-batch-size", "--name", "--storage-path"):
        assert flag in train and not isinstance(train[flag], DeprecatedFlag), flag
    assert "--global-batch-size" in plan and not isinstance(plan["--global-batch-size"], DeprecatedFlag)


@pytest.mark.parametrize("old, new, value, setting, expected", [
    ("--batch-size", "--global-batch-size", "32", "global_batch_size", 32),
    ("--experiment-name", "--name", "r1", "name", "r1"),
    ("--output-dir", "--storage-path", "out", "storage_path", "out"),
    ("--profile-timeout", "--profile-timeout-s", "9", "profile_timeout_s", 9.0),
    ("--plan-change", "--plan-changes", "4:16,16", "plan_changes", [{"global_step": 4, "local_batch_sizes": [16, 16]}]),
    ("--emulate-speed-change", "--emulate-speed-changes", "4:1:0.5", "emulate_speed_changes",
     [{"global_step": 4, "rank": 1, "speed": 0.5}]),
])
def test_an_old_flag_sets_the_same_value_and_names_the_new_one(capsys, old, new, value, setting, expected):
    base = ["train", "--global-batch-size", "32"] if setting != "global_batch_size" else ["train"]
    old_config = config_from_args(build_parser().parse_args([*base, old, value]))
    assert f"{old} is deprecated and will be removed; use {new}" in capsys.readouterr().err
    new_config = config_from_args(build_parser().parse_args([*base, new, value]))
    assert capsys.readouterr().err == ""
    assert getattr(old_config, setting) == getattr(new_config, setting) == expected


def test_old_and_new_spellings_of_a_repeatable_flag_add_up():
    args = build_parser().parse_args(["train", "--global-batch-size", "32", "--plan-changes", "4:16,16",
                                      "--plan-change", "8:8,24"])
    assert [c["global_step"] for c in config_from_args(args).plan_changes] == [4, 8]


def test_plan_takes_the_old_spelling_and_needs_one_of_them(capsys, tmp_path):
    assert main(["plan", "--profile", str(tmp_path / "none.json")]) == 2
    assert "--global-batch-size is required" in capsys.readouterr().err
    main(["plan", "--profile", str(tmp_path / "none.json"), "--batch-size", "0"])
    err = capsys.readouterr().err
    assert "--batch-size is deprecated" in err and "--global-batch-size must be a positive integer" in err
