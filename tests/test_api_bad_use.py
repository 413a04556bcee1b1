"""Bad use of the public API gets a message that says what is wrong and what to do —
before anything starts where it can be known then, and as a UserError from fit()
(without Ray Train's retries) where only a worker can see it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hetero_ray import HeteroConfig, HeteroTrainer
from hetero_ray.errors import ConfigError, UserError
from hetero_ray.training.data.loader import make_loader


def _loop(config):
    pass


class _NoLen:
    def __getitem__(self, index):
        return index


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def _session(global_batch_size=8, loader=None):
    return SimpleNamespace(parts=SimpleNamespace(loader=loader), identity=SimpleNamespace(num_workers=1),
                           settings=SimpleNamespace(global_batch_size=global_batch_size))


@pytest.mark.parametrize("dataset, message", [
    (_NoLen(), "has no __len__"),
    (_Stream(), "iterable-style _Stream"),
    (list(range(5)), "5 samples, fewer than one global batch of 8"),
])
def test_prepare_data_loader_rejects_datasets_it_cannot_split(dataset, message):
    with pytest.raises(UserError, match=message):
        make_loader(_session(), dataset, num_workers=0, prefetch_factor=None, drop_last=True)


def test_prepare_data_loader_twice_is_refused():
    with pytest.raises(UserError, match="called twice"):
        make_loader(_session(loader=object()), list(range(64)), num_workers=0, prefetch_factor=None)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_workers=-1, prefetch_factor=None), "num_workers"),
    (dict(num_workers=0, prefetch_factor=2), "prefetch_factor=2"),
])
def test_prepare_data_loader_rejects_bad_arguments(kwargs, message):
    with pytest.raises(UserError, match=message):
        make_loader(_session(), list(range(64)), **kwargs)


def test_the_api_outside_a_run_says_where_it_belongs():
    import hetero_ray.train

    with pytest.raises(UserError, match="inside the train_loop_per_worker"):
        hetero_ray.train.prepare_model(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch_size=0), "global_batch_size must be a positive integer"),
    (dict(global_batch_size=8, policy="fastest"), "policy must be one of"),
    (dict(global_batch_size=8, batch_split=(4, 3)), "batch_split sums to 7, but HeteroConfig.global_batch_size is 8"),
    (dict(global_batch_size=8, emulate_speeds=(1.0, 2.0)), r"emulate_speeds values must be in \(0, 1\]"),
    (dict(global_batch_size=8, rebalance_threshold=1.5), r"rebalance_threshold must be in \[0, 1\)"),
    (dict(global_batch_size=8, profile_model="resnet18"), r"profile_model must be a hetero_ray.ProfileModel"),
    (dict(global_batch_size=8, profile_batch_sizes=(8, 8)), "two or more different positive sizes"),
    (dict(global_batch_size=8, profile_timeout_s=0), "profile_timeout_s must be a positive number"),
    (dict(global_batch_size=8, output_dir=123), r"HeteroConfig.output_dir must be a folder's path .* got 123"),
    (dict(global_batch_size=8, output_dir=""), r"HeteroConfig.output_dir must be a folder's path"),
    (dict(global_batch_size=8, record_sample_ids="no"), "HeteroConfig.record_sample_ids must be True or False, "
                                                        "got 'no'"),
    (dict(global_batch_size=8, allow_non_finite_loss=1), "HeteroConfig.allow_non_finite_loss must be True or False"),
    (dict(global_batch_size=8, profile="yes"), "HeteroConfig.profile must be True or False"),
])
def test_hetero_config_rejects_bad_values_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        HeteroConfig(**kwargs)


def test_hetero_config_takes_a_pathlib_output_dir_as_text(tmp_path):
    assert HeteroConfig(global_batch_size=8, output_dir=tmp_path).output_dir == str(tmp_path)


def test_profile_model_rejects_what_it_cannot_call():
    from hetero_ray import ProfileModel

    with pytest.raises(ConfigError, match=r"ProfileModel\(make_batch=...\) must be a function, got tuple"):
        ProfileModel(build=torch.nn.Linear, make_batch=(8, 3))


def test_config_json_names_the_profile_model():
    from hetero_ray import ProfileModel

    recipe = ProfileModel(build=torch.nn.Linear, make_batch=torch.randn, name="linear")
    assert HeteroConfig(global_batch_size=8, profile_model=recipe).to_dict()["profile_model"] == "linear"


def test_global_batch_smaller_than_the_workers_is_refused():
    from ray.train import ScalingConfig

    with pytest.raises(ConfigError, match="HeteroConfig.global_batch_size 2 is smaller than ScalingConfig.num_workers 3"):
        HeteroTrainer(_loop, scaling_config=ScalingConfig(num_workers=3), hetero_config=HeteroConfig(global_batch_size=2))


def test_trainer_arguments_are_checked_before_anything_starts():
    with pytest.raises(ConfigError, match="needs hetero_config"):
        HeteroTrainer(_loop)
    with pytest.raises(UserError, match="at most one argument"):
        HeteroTrainer(lambda a, b: None, hetero_config=HeteroConfig(global_batch_size=8))
    with pytest.raises(ConfigError, match="name"):
        from ray.train import RunConfig

        HeteroTrainer(_loop, run_config=RunConfig(name="../x"), hetero_config=HeteroConfig(global_batch_size=8))


@pytest.mark.parametrize("make_torch_config, use_gpu, message", [
    (lambda: {"backend": "gloo"}, False, r"torch_config must be a ray.train.torch.TorchConfig, got dict; pass "
                                         r"torch_config=TorchConfig\(backend=...\)"),
    (lambda: _torch_config("nccl"), False, r"needs every worker on a GPU \(ScalingConfig\(use_gpu=True\)\); use "
                                           r"TorchConfig\(backend='gloo'\)"),
], ids=["not-a-TorchConfig", "nccl-on-cpu-workers"])
def test_torch_config_is_checked_before_anything_starts(make_torch_config, use_gpu, message):
    from ray.train import ScalingConfig

    with pytest.raises(ConfigError, match=message):
        HeteroTrainer(_loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=use_gpu),
                      hetero_config=HeteroConfig(global_batch_size=8), torch_config=make_torch_config())


def test_nccl_with_gpu_workers_and_gloo_with_cpu_workers_are_accepted():
    from ray.train import ScalingConfig

    for backend, use_gpu in (("nccl", True), ("gloo", False), ("gloo", True), (None, False)):
        HeteroTrainer(_loop, scaling_config=ScalingConfig(num_workers=2, use_gpu=use_gpu),
                      hetero_config=HeteroConfig(global_batch_size=8), torch_config=_torch_config(backend))


def _torch_config(backend):
    from ray.train.torch import TorchConfig

    return TorchConfig(backend=backend)


def non_scalar_loss_loop(config):
    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 2))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(16, 4)))
    for (inputs,) in loader:
        model(inputs).backward()  # (b, 2) outputs: not a scalar


@pytest.mark.ray
@pytest.mark.slow
def test_a_non_scalar_loss_stops_the_run_with_a_user_error(ray_session, tmp_path):
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    trainer = HeteroTrainer(non_scalar_loss_loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="bad-loss", storage_path=str(tmp_path),
                                                 failure_config=FailureConfig(max_failures=3)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static"))
    with pytest.raises(UserError, match="loss given to backward.. is not a scalar") as raised:
        trainer.fit()
    assert "without retrying" in str(raised.value)
    import json

    with open(tmp_path / "bad-loss" / "attempts.json") as f:
        assert len(json.load(f)) == 1, "a user error must not be retried"


def type_error_loop(config):
    import hetero_ray.train

    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 2))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(16, 4)))
    for (inputs,) in loader:
        model(inputs, "an argument forward() does not take").sum().backward()


@pytest.mark.ray
@pytest.mark.slow
def test_an_error_every_restart_would_meet_again_is_not_retried(ray_session, tmp_path):
    """A TypeError at the first step, on every rank: Ray Train would restart the workers
    (a minute each) and meet it again; the run stops at once with the loop's traceback."""
    import json
    import time

    from ray.train import FailureConfig, RunConfig, ScalingConfig

    trainer = HeteroTrainer(type_error_loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="type-error", storage_path=str(tmp_path),
                                                 failure_config=FailureConfig(max_failures=3)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static"))
    started = time.monotonic()
    with pytest.raises(UserError, match=r"raised TypeError: .*forward\(\) takes 2 positional arguments") as raised:
        trainer.fit()
    print(f"the run stopped {time.monotonic() - started:.1f} s after fit() was called")  # a figure, not a check
    message = str(raised.value)
    assert "before its first step completed" in message and "in type_error_loop" in message, message
    with open(tmp_path / "type-error" / "attempts.json") as f:
        assert len(json.load(f)) == 1, "an error a restart would meet again must not be retried"
    with open(tmp_path / "type-error" / "summary.json") as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and "TypeError" in summary["error"] and "type_error_loop" in summary["error"]


def step_three_error_loop(config):
    """Trains steps 0-2, then raises at global step 3 on the ranks ``config["ranks"]``."""
    import hetero_ray.train

    rank = hetero_ray.train.get_context().get_world_rank()
    model = hetero_ray.train.prepare_model(torch.nn.Linear(4, 2))
    loader = hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for (inputs,) in loader:
        if loader.position.global_step == 3 and rank in config["ranks"]:
            raise ValueError("no step 3 today")
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _fit_failing_at_step_three(tmp_path, name: str, ranks: list[int]) -> tuple[UserError, int, dict]:
    """fit() of step_three_error_loop on 2 workers with 3 retries allowed: the UserError, how
    many worker groups started, and summary.json."""
    import json

    from ray.train import FailureConfig, RunConfig, ScalingConfig

    trainer = HeteroTrainer(step_three_error_loop, train_loop_config={"ranks": ranks},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name=name, storage_path=str(tmp_path),
                                                 failure_config=FailureConfig(max_failures=3)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static"))
    with pytest.raises(UserError, match=r"raised ValueError: no step 3 today at global step 3") as raised:
        trainer.fit()
    with open(tmp_path / name / "attempts.json") as f:
        attempts = len(json.load(f))
    with open(tmp_path / name / "summary.json") as f:
        return raised.value, attempts, json.load(f)


@pytest.mark.ray
@pytest.mark.slow
def test_the_same_error_at_the_same_step_on_every_rank_is_not_retried(ray_session, tmp_path):
    """Past the first step: every rank raises the same ValueError at global step 3. The run
    stops with the loop's traceback instead of three restarts that meet it again (at most
    one, where Ray Train saw one rank's error before the other's)."""
    error, attempts, summary = _fit_failing_at_step_three(tmp_path, "every-rank", ranks=[0, 1])
    message = str(error)
    assert "without retrying" in message and "in step_three_error_loop" in message, message
    assert attempts <= 2, f"{attempts} worker groups: an error every restart meets again was retried"
    assert summary["status"] == "failed" and "no step 3 today" in summary["error"]
    assert "in step_three_error_loop" in summary["error"]


@pytest.mark.ray
@pytest.mark.slow
def test_an_error_that_comes_again_at_the_same_step_after_a_restart_ends_the_run(ray_session, tmp_path):
    """One rank raises at global step 3 (from one rank, a bug and a lost peer look alike:
    it is retried once); the restart meets it at the same step again, and the run stops."""
    error, attempts, _ = _fit_failing_at_step_three(tmp_path, "again", ranks=[0])
    assert "again after a restart" in str(error) and "in step_three_error_loop" in str(error), str(error)
    assert attempts == 2


def test_repeated_failures_tell_a_bug_from_what_a_restart_cures():
    from hetero_ray.runtime.failures import LoopFailure, LoopFailsEveryTime, RepeatedFailures, loop_failure
    from hetero_ray.training.rank.entry import FAILED_AT_STEP_ATTR

    boom = LoopFailure("ValueError", "boom", 5, "Traceback ...\n  in my_loop")
    judge = RepeatedFailures()
    judge.new_worker_group()
    assert judge.judge({0: boom}, 2) is None  # one rank: a bug or a lost peer, retried
    assert judge.judge({0: boom}, 2) is None  # the same group polled again is no repeat
    stop = judge.judge({0: boom, 1: boom}, 2)
    assert isinstance(stop, LoopFailsEveryTime) and "on every rank (2)" in str(stop) and "in my_loop" in str(stop)
    assert judge.judge({0: boom, 1: LoopFailure("ValueError", "boom", 6)}, 2) is None  # not the same step
    assert judge.judge({0: boom, 1: None}, 2) is None  # rank 1 lost a peer
    judge.new_worker_group()
    assert judge.judge({1: LoopFailure("ValueError", "boom", 6)}, 2) is not None  # met again after the restart
    assert judge.judge({1: LoopFailure("ValueError", "other", 6)}, 2) is None

    marked = ValueError("boom")
    setattr(marked, FAILED_AT_STEP_ATTR, 5)
    assert loop_failure(marked).key == ("ValueError", "boom", 5)
    assert loop_failure(ValueError("not marked")) is None and loop_failure(None) is None


def test_errors_a_restart_can_cure_are_told_apart_from_the_loops_own():
    import ray.exceptions

    from hetero_ray.training.rank.entry import restart_can_cure

    assert restart_can_cure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert restart_can_cure(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    assert restart_can_cure(ray.exceptions.ActorDiedError())
    assert not restart_can_cure(TypeError("forward() takes 2 positional arguments but 3 were given"))
    assert not restart_can_cure(KeyError("lr"))
    assert not restart_can_cure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x4 and 5x2)"))


def rank_dependent_data_loop(config):
    import hetero_ray.train

    rank = hetero_ray.train.get_context().get_world_rank()
    hetero_ray.train.prepare_data_loader(torch.utils.data.TensorDataset(torch.randn(16 + rank, 4)))


@pytest.mark.ray
@pytest.mark.slow
def test_ranks_whose_datasets_differ_in_length_are_stopped_before_the_first_step(ray_session, tmp_path):
    from ray.train import RunConfig, ScalingConfig

    trainer = HeteroTrainer(rank_dependent_data_loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="two-lengths", storage_path=str(tmp_path)),
                            hetero_config=HeteroConfig(global_batch_size=8, policy="static"))
    with pytest.raises(UserError, match=r"differ in length \(rank 0 \(node \w+\): 16, rank 1 \(node \w+\): 17\)"):
        trainer.fit()


def test_a_stop_says_whether_fit_again_continues(tmp_path):
    """Ctrl-C before the user's loop reported a checkpoint: fit() again under the same name
    would refuse the run directory, so the message says to choose another name."""
    import os
    import signal

    from ray.train import RunConfig

    from hetero_ray.runs import storage
    from hetero_ray.runs.checkpoints import RAY_CHECKPOINT_SNAPSHOT
    from hetero_ray.runs.folder import RunFolder

    trainer = HeteroTrainer(_loop, run_config=RunConfig(name="stopped", storage_path=str(tmp_path)),
                            hetero_config=HeteroConfig(global_batch_size=8))
    run = storage.resolve(str(tmp_path), "stopped", None)
    os.makedirs(run.run_dir)
    folder = RunFolder(run, trainer._job.words, held=None, locked=True)  # fit() holds its lock; not needed here
    early = trainer._interrupted(folder, signal.SIGINT, {"global_steps": 3})
    assert not early.resumable and "No checkpoint was reported before the stop" in str(early)
    assert "fit() again under another RunConfig(name=...)" in str(early)

    open(os.path.join(run.run_dir, RAY_CHECKPOINT_SNAPSHOT), "w").write("{}")
    later = trainer._interrupted(folder, signal.SIGINT, {"global_steps": 30})
    assert later.resumable and "fit() again with RunConfig(name='stopped')" in str(later)
