"""Emulated devices with the shape of real ones: the pad rule, the common factor, the entries."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hetero_ray import ProfileModel
from hetero_ray.builtin.config import TrainConfig
from hetero_ray.config import EmulationConfig
from hetero_ray.errors import ConfigError, UserError
from hetero_ray.hetero_config import HeteroConfig
from hetero_ray.runtime.device_curves import device_curves
from hetero_ray.training.timing import curve_emulation
from hetero_ray.training.timing.curve_emulation import CurveEmulator, DeviceCurve, common_factor, curve_pad_s, rank_ratio
from tests.helpers import FakeClocks

H100 = os.path.join(os.path.dirname(__file__), "data", "h100_resnet18_nodes.json")
FLAT = DeviceCurve(floor_s=0.007, alpha_s=0.0, beta_s_per_sample=0.0001, source="flat")  # flat up to b = 70
LINE = DeviceCurve(floor_s=0.0, alpha_s=0.002, beta_s_per_sample=0.0005, source="line")


# ---------------------------------------------------------------------------- the pad rule
def test_the_pad_brings_the_step_to_k_times_the_curve():
    assert curve_pad_s(0.001, LINE, factor=3.0, local_batch_size=8) == pytest.approx(3 * 0.006 - 0.001)
    assert curve_pad_s(0.001, FLAT, factor=3.0, local_batch_size=8) == pytest.approx(3 * 0.007 - 0.001)
    # at half speed the target doubles
    assert curve_pad_s(0.001, LINE, factor=3.0, local_batch_size=8, speed=0.5) == pytest.approx(6 * 0.006 - 0.001)


def test_a_step_already_past_its_target_is_not_padded():
    assert curve_pad_s(1.0, LINE, factor=2.0, local_batch_size=8) == 0.0


def test_padded_steps_follow_the_curves_shape_whatever_the_real_work():
    # Real work that grows with the batch (a CPU) is padded to a flat curve, and to a line.
    for curve, expected in ((FLAT, 1.0), (LINE, (0.002 + 0.0005 * 64) / (0.002 + 0.0005 * 8))):
        busy = {b: real + curve_pad_s(real, curve, 10.0, b) for b, real in ((8, 0.004), (64, 0.030))}
        assert busy[64] / busy[8] == pytest.approx(expected)


def test_a_rank_holding_no_sample_costs_one_sample():
    assert curve_pad_s(0.0, LINE, 1.0, 0) == pytest.approx(LINE.busy_time_s(1))


def test_the_emulator_sleeps_once_before_the_last_bucket(monkeypatch):
    clock = FakeClocks(wall=50.0)
    monkeypatch.setattr(curve_emulation, "time", clock)
    share = {"b": 16}
    emulator = CurveEmulator(LINE, factor=2.0, local_batch_size=lambda: share["b"])
    emulator.begin_step(1.0, clock.wall)
    clock.wall += 0.003  # data + forward + backward of the first buckets
    emulator.pad(is_last=False)
    assert clock.slept == []  # earlier buckets leave as they are ready
    emulator.pad(is_last=True)
    assert clock.wall - 50.0 == pytest.approx(2.0 * LINE.busy_time_s(16))
    assert emulator.padded_s == pytest.approx(2.0 * LINE.busy_time_s(16) - 0.003)
    # the share is read at the pad (the loader knows it only after the step began)
    share["b"] = 4
    emulator.begin_step(1.0, clock.wall)
    start = clock.wall
    emulator.pad()
    assert clock.wall - start == pytest.approx(2.0 * LINE.busy_time_s(4))


def test_an_overrun_is_counted_not_padded(monkeypatch):
    clock = FakeClocks(wall=50.0)
    monkeypatch.setattr(curve_emulation, "time", clock)
    emulator = CurveEmulator(FLAT, factor=1.0, local_batch_size=lambda: 8)
    emulator.begin_step(1.0, clock.wall)
    clock.wall += 0.5
    emulator.pad()
    assert clock.slept == [] and emulator.overruns == 1 and emulator.padded_s == 0.0


def test_outside_a_step_nothing_is_padded(monkeypatch):
    clock = FakeClocks(wall=50.0)
    monkeypatch.setattr(curve_emulation, "time", clock)
    emulator = CurveEmulator(LINE, factor=1.0)  # no share known: a backward pass outside a step
    emulator.begin_step(1.0, clock.wall)
    emulator.pad()
    assert clock.slept == []


# ---------------------------------------------------------------------------- the common factor
def test_the_ratio_is_the_worst_over_every_share_up_to_the_global_batch():
    real = lambda b: 0.001 * b  # noqa: E731 - a CPU: 1 ms per sample
    # against the flat curve the worst shares are past its knee (b = 70): 1 ms / 0.1 ms per sample
    assert rank_ratio(real, FLAT, 256) == pytest.approx(10.0)
    # a global batch below the knee: the whole batch on the floor
    assert rank_ratio(real, FLAT, 48) == pytest.approx(0.048 / 0.007)


def test_one_factor_for_all_ranks_is_the_largest_ratio_with_headroom_and_at_least_one():
    assert common_factor([2.0, 8.0, None]) == pytest.approx(8.0 * curve_emulation.HEADROOM)
    assert common_factor([0.1, 0.2]) == 1.0  # never faster than the curves
    with pytest.raises(UserError, match="no rank could time the model"):
        common_factor([None, None])


# ---------------------------------------------------------------------------- the entries
def test_the_h100_profiles_curve_is_flat_over_its_probes_within_ten_percent():
    (curve,) = device_curves("--emulate-devices", [f"{H100}:gpu0"])
    for b, measured in ((8, 6.6e-3), (16, 7.5e-3), (32, 6.8e-3), (64, 7.0e-3)):
        assert curve.busy_time_s(b) == pytest.approx(measured, rel=0.10)
    assert curve.busy_time_s(64) == pytest.approx(curve.busy_time_s(8))
    assert device_curves("x", [H100])[0] == DeviceCurve(curve.floor_s, curve.alpha_s, curve.beta_s_per_sample, H100)
    assert device_curves("x", [f"{H100}:28c424db:gpu"])[0].floor_s == curve.floor_s


def test_entries_expand_per_rank_and_a_curve_is_written_in_ms():
    config = EmulationConfig(emulate_devices=[f"{H100}:gpu0", "curve:0:2:0.5*2"])
    assert config.emulate_devices == [f"{H100}:gpu0", "curve:0:2:0.5", "curve:0:2:0.5"]
    curves = device_curves("--emulate-devices", config.emulate_devices)
    assert curves[1] == curves[2] == DeviceCurve(0.0, 0.002, 0.0005, "curve:0:2:0.5")


@pytest.mark.parametrize("entry, message", [
    ("curve:1:2", "expected PROFILE.json"),
    ("curve:-1:2:0.5", "FLOOR_MS and BETA_MS must be ≥ 0"),
    ("curve:0:0:0", "one sample must take some time"),
    ("nodes.txt", "expected PROFILE.json"),
    ("nodes.json:a:b", "expected PROFILE.json"),
    ("curve:0:2:0.5*0", "COUNT must be ≥ 1"),
])
def test_bad_entries_are_refused_with_the_forms(entry, message):
    with pytest.raises(ConfigError, match=message):
        EmulationConfig(emulate_devices=[entry])


def test_one_entry_per_rank():
    with pytest.raises(ConfigError, match="--emulate-devices has 3 values but --num-workers is 2"):
        TrainConfig(model="mlp", num_workers=2, emulate_devices=["curve:0:2:0.5*3"])
    with pytest.raises(ConfigError, match="HeteroConfig.emulate_devices needs a profile_model"):
        HeteroConfig(global_batch_size=8, emulate_devices=("curve:0:2:0.5",))


_LINEAR = ProfileModel(build=lambda: torch.nn.Linear(2, 2), make_batch=lambda b: (torch.randn(b, 2),), name="lin")


def test_a_pinned_factor_is_a_positive_number_for_emulated_devices_only():
    assert EmulationConfig(emulate_devices=["curve:0:2:0.5"], emulate_devices_factor=12).emulate_devices_factor == 12.0
    with pytest.raises(ConfigError, match="--emulate-devices-factor must be a positive number"):
        EmulationConfig(emulate_devices=["curve:0:2:0.5"], emulate_devices_factor=0)
    with pytest.raises(ConfigError, match="--emulate-devices-factor stretches the curves of --emulate-devices"):
        EmulationConfig(emulate_devices_factor=3.0)
    assert HeteroConfig(global_batch_size=8, emulate_devices=("curve:0:2:0.5",), emulate_devices_factor=4,
                        profile_model=_LINEAR).emulate_devices_factor == 4.0
    with pytest.raises(ConfigError, match="HeteroConfig.emulate_devices_factor stretches the curves of "
                                          "HeteroConfig.emulate_devices"):
        HeteroConfig(global_batch_size=8, emulate_devices_factor=3.0)


def test_a_pinned_factor_is_used_as_it_is_without_timing_the_model():
    # the same emulated devices in runs of different worker groups: no rank times anything
    # (warmup_model None would refuse a measurement), every rank pads to that factor
    from hetero_ray.training.rank.identity import WorkerIdentity
    from hetero_ray.training.rank.session import WorkerSettings, _curve_emulator

    settings = WorkerSettings(experiment_name="pinned", global_batch_size=64, seed=0, rebalance_interval=10,
                              device_mode="cpu", emulate_devices=[DeviceCurve(0.0, 2e-3, 5e-4, "curve:0:2:0.5").to_dict()] * 2,
                              emulate_devices_factor=7.5)
    for rank in (0, 1):
        identity = WorkerIdentity(rank, 2, rank, torch.device("cpu"), "n", 0, ("n", "n"), ("cpu", "cpu"), (2, 2),
                                  ({}, {}))
        emulator = _curve_emulator(settings, identity, synchronize=None)
        assert emulator.factor == 7.5 and emulator.curve == DeviceCurve(0.0, 2e-3, 5e-4, "curve:0:2:0.5")


def test_profiles_that_cannot_give_a_curve_are_refused(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        device_curves("--emulate-devices", [str(tmp_path / "none.json")])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="is not JSON"):
        device_curves("--emulate-devices", [str(tmp_path / "bad.json")])
    (tmp_path / "list.json").write_text(json.dumps({"nodes": 3}))
    with pytest.raises(UserError, match="not a nodes.json"):
        device_curves("--emulate-devices", [str(tmp_path / "list.json")])
    with pytest.raises(UserError, match=r"no such device with a model probe \(probed devices: 28c424db:gpu0\)"):
        device_curves("--emulate-devices", [f"{H100}:cpu"])
    with pytest.raises(UserError, match="no such device"):
        device_curves("--emulate-devices", [f"{H100}:ffff:gpu0"])


# ---------------------------------------------------------------------------- the warm-up pads to the curve
def test_the_warm_up_measures_the_curve_not_the_machine():
    from hetero_ray.builtin.recipe import builtin_recipe
    from hetero_ray.training.timing.warmup import measure_rank

    slow_flat = DeviceCurve(floor_s=0.030, alpha_s=0.0, beta_s_per_sample=0.0, source="flat 30 ms")
    emulator = CurveEmulator(slow_flat, factor=1.0)
    # A budget no machine runs out of: under load the run's 3 s keeps only the two smallest
    # sizes, whose fit is then as good as one stalled step lets it be.
    fit = measure_rank(builtin_recipe("mlp", "synthetic_image"), torch.device("cpu"), [4, 16, 64], emulator, 1.0,
                       time_budget_s=120.0)
    assert fit is not None, "the warm-up measured nothing"
    predicted = [max(fit["floor_s"], fit["alpha_s"] + fit["beta_s_per_sample"] * b) for b in (4, 16, 64)]
    # the padded step, not the real mlp step (a few ms); a busy machine may stall one size, so the median
    assert sorted(predicted)[1] > 0.8 * 0.030, predicted


def test_the_trainer_reads_the_profiles_before_anything_starts(tmp_path):
    from ray.train import ScalingConfig

    from hetero_ray import HeteroTrainer, ProfileModel

    model = ProfileModel(build=lambda: torch.nn.Linear(2, 2), make_batch=lambda b: (torch.randn(b, 2),), name="lin")
    with pytest.raises(UserError, match="HeteroConfig.emulate_devices: .*none.json: no such file"):
        HeteroTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=2),
                      hetero_config=HeteroConfig(global_batch_size=8, profile_model=model,
                                                 emulate_devices=(str(tmp_path / "none.json"), "curve:0:2:0.5")))
    with pytest.raises(ConfigError, match="HeteroConfig.emulate_devices has 1 values but ScalingConfig.num_workers is 2"):
        HeteroTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=2),
                      hetero_config=HeteroConfig(global_batch_size=8, profile_model=model,
                                                 emulate_devices=("curve:0:2:0.5",)))
