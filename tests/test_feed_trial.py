"""The feeding trial (planning/feed_trial.py) without Ray: which ranks it tries, how it
measures a window, the rule that picks feeding or training (faster, beyond the threshold
and the windows' noise), its reasons, and the balancer running it on simulated steps —
a CPU rank that slows the pipeline stays out for good, one that helps trains again."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero_ray.errors import ConfigError
from hetero_ray.hetero_config import HeteroConfig
from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.balancer_state import DecisionState
from hetero_ray.runs.records import DECISIONS, SCHEMAS, to_table
from hetero_ray.planning.feed_trial import (
    DONE, FEEDING, FeedTrial, TrialWindow, feed_candidates, judge, ranks_words, shares_without, step_periods,
    steps_per_epoch,
)
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.planner import Planner
from hetero_ray.planning.policies import PolicyConfig, make_policy
from hetero_ray.planning.rank_facts import RankFacts
from hetero_ray.trainer import _feed_trial_mode
from tests.helpers import estimates_for

# --- which ranks


@pytest.mark.parametrize("nodes, kinds, same_node, expected", [
    (["a", "a", "b"], ["gpu", "cpu", "cpu"], False, (1, 2)),  # beside a GPU: every CPU rank, on any node
    (["a", "b", "b"], ["gpu", "gpu", "cpu"], False, (2,)),
    (["a", "b"], ["cpu", "cpu"], False, (1,)),  # CPU ranks alone: a node of its own to give the pipeline
    (["a", "a", "b"], ["cpu", "cpu", "cpu"], False, (2,)),
    (["a", "a"], ["cpu", "cpu"], False, ()),  # one node: nothing of its own to give
    (["a", "a"], ["cpu", "cpu"], True, (1,)),  # ... unless asked for (feed_trial=True)
    (["a", "b"], None, False, (1,)),  # kinds unknown: CPUs
    (["a", "a"], ["cpu", "gpu"], False, ()),  # rank 0 is never one
])
def test_candidates_are_cpu_ranks_with_cores_to_give_never_rank_0(nodes, kinds, same_node, expected):
    assert feed_candidates(nodes, kinds, same_node) == expected


def test_reasons_name_the_candidates():
    assert ranks_words((1,), ["gpu", "cpu"]) == "CPU-only rank 1"
    assert ranks_words((2, 3), None) == "ranks 2, 3"


# --- a window


def test_periods_are_consecutive_steps_after_the_plan_settles_across_an_epochs_end():
    steps = [(10, 1.0, 64), (11, 1.1, 64), (12, 1.2, 64), (13, 1.35, 40), (14, 3.0, 64), (15, 3.1, 64), (17, 3.5, 64)]
    # settle 2: the periods ending at 12 and later; across the epoch's end (13 → 14: its reading, its report),
    # not across a gap (15 → 17)
    periods = step_periods(steps, settle_steps=2)
    assert [b for _, b in periods] == [64, 40, 64, 64]
    assert [p for p, _ in periods] == pytest.approx([0.1, 0.15, 1.65, 0.1])
    assert len(step_periods(steps, settle_steps=0)) == 5


def test_an_epochs_length_is_the_difference_of_two_consecutive_epochs_first_steps():
    assert steps_per_epoch({}) is None and steps_per_epoch({3: 96}) is None
    assert steps_per_epoch({2: 64, 3: 96}) == 32 and steps_per_epoch({0: 0, 2: 64}) is None


def test_a_window_rate_is_the_samples_over_the_wall_time_stalls_included():
    window = TrialWindow.of([0.1] * 9 + [0.5], [64] * 10)  # a step that waited for the pipeline
    assert window.samples_per_s == pytest.approx(64 / 0.14) and window.steps == 10
    assert TrialWindow.of([0.1, 0.1], [64, 32]).samples_per_s == pytest.approx(96 / 0.2)  # a short last step
    periods = np.random.default_rng(0).normal(0.1, 0.01, 400)
    assert TrialWindow.of(periods, [64] * len(periods)).rel_se == pytest.approx(0.1 / 20, rel=0.15)  # sd/mean/√N


# --- the rule


def _window(rate: float, rel_se: float = 0.0, steps: int = 20) -> TrialWindow:
    return TrialWindow(rate, steps, rel_se)


def test_feeding_clearly_faster_feeds_and_the_reason_names_both_rates():
    verdict = judge("CPU-only rank 1", _window(977, 0.01), _window(1175, 0.01), threshold=0.05)
    assert verdict.feed and verdict.gain == pytest.approx(1175 / 977 - 1)
    assert verdict.reason.startswith("CPU-only rank 1 feeds the pipeline: 1,175 samples/s with it out vs 977 with "
                                     "it training (20 steps each; feeding +20.3%")
    assert "required 7.8% = threshold 5.0% + noise 2.8%" in verdict.reason


def test_training_faster_trains():
    verdict = judge("ranks 1, 2", _window(1200), _window(900), threshold=0.05, plural=True)
    assert not verdict.feed
    assert verdict.reason.startswith("ranks 1, 2 train: 1,200 samples/s with them training vs 900 with them out "
                                     "feeding the pipeline (20 steps each; feeding -25.0%")


def test_a_gain_within_the_threshold_keeps_the_ranks_training():
    assert not judge("rank 1", _window(1000), _window(1040), threshold=0.05).feed
    assert judge("rank 1", _window(1000), _window(1060), threshold=0.05).feed


def test_a_gain_within_the_windows_noise_keeps_the_ranks_training():
    # +10 % clears the 5 % threshold on quiet windows, not on windows whose means are ±4 % each
    assert judge("rank 1", _window(1000, 0.005), _window(1100, 0.005), threshold=0.05).feed
    noisy = judge("rank 1", _window(1000, 0.04), _window(1100, 0.04), threshold=0.05)
    assert not noisy.feed and noisy.required_gain == pytest.approx(0.05 + 2 * math.hypot(0.04, 0.04))
    # noise_margin scales the noise as it does the policies' (0: the threshold alone)
    assert judge("rank 1", _window(1000, 0.04), _window(1100, 0.04), threshold=0.05, noise_margin=0.0).feed


def test_the_verdict_picks_the_faster_window_beyond_its_bar_over_seeded_windows():
    rng = np.random.default_rng(7)
    for _ in range(2000):
        training, feeding = (TrialWindow.of(rng.normal(p, p * rng.uniform(0, 0.2), 20).clip(1e-4), [64] * 20)
                             for p in rng.uniform(0.01, 0.1, 2))
        threshold = rng.uniform(0, 0.2)
        verdict = judge("rank 1", training, feeding, threshold)
        assert verdict.feed == (feeding.samples_per_s > training.samples_per_s * (1 + verdict.required_gain))
        assert verdict.required_gain >= threshold
        if verdict.feed:
            assert feeding.samples_per_s > training.samples_per_s


def test_a_window_reaches_back_at_most_four_windows_and_a_verdict_within_the_noise_waits_for_more_steps():
    trial = FeedTrial((1,), "rank 1", window_steps=5)
    assert trial.window([(0.1, 64)] * 4) is None
    assert trial.window([(1.0, 64)] * 30 + [(0.1, 64)] * 20).steps == 20  # the newest 4 × 5
    trial.start(TrialWindow(1000, 20, 0.05), (32, 32), version=3)
    noisy = dict(threshold=0.05, noise_margin=1.0)  # noise 2·√(0.05² + 0.05²) ≈ 14 %: required ≈ 19 %
    assert not trial.clear(TrialWindow(1080, 5, 0.05), **noisy)  # +8 %: either way within the noise
    assert trial.clear(TrialWindow(1080, 20, 0.05), **noisy)  # ... until the window is as long as it gets
    assert trial.clear(TrialWindow(1300, 5, 0.05), **noisy)  # +30 %: feeding, clearly
    assert trial.clear(TrialWindow(800, 5, 0.05), **noisy)  # −20 %: training, clearly


@pytest.mark.parametrize("feeding_rate, feeds", [(1080, True), (1030, False), (900, False), (1300, True)])
def test_after_the_longest_windows_the_measured_rates_decide_within_the_noise(feeding_rate, feeds):
    trial = FeedTrial((1,), "CPU-only rank 1", window_steps=5)
    trial.start(TrialWindow(1000, 20, 0.05), (32, 32), version=3)
    verdict = trial.conclude(TrialWindow(feeding_rate, 20, 0.05), threshold=0.05, noise_margin=1.0)
    assert verdict.feed is feeds and trial.held_out == (frozenset({1}) if feeds else frozenset())
    gain, noise = feeding_rate / 1000 - 1, 2 * math.hypot(0.05, 0.05)
    within = 0.05 - noise < gain <= 0.05 + noise  # neither clearly feeding nor clearly training
    assert ("the measured rates decide" in verdict.reason) is within, verdict.reason


# --- the shares with the candidates out


def test_the_shares_without_the_candidates_keep_the_global_batch_in_proportion():
    shares = shares_without((30, 10, 20, 4), (3,))
    assert shares[3] == 0 and sum(shares) == 64
    assert np.abs(np.array(shares[:3]) - np.array([30, 10, 20]) * 64 / 60).max() <= 1  # in proportion, rounded
    assert shares_without((40, 24), (1,)) == (64, 0)
    assert shares_without((30, 30, 4), (2,), caps=[31, None, None]) == (31, 33, 0)
    rng = np.random.default_rng(3)
    for _ in range(500):
        sizes = tuple(int(b) for b in rng.integers(1, 50, rng.integers(2, 6)))
        out = tuple(int(r) for r in rng.choice(np.arange(1, len(sizes)), rng.integers(1, len(sizes)), replace=False))
        shares = shares_without(sizes, out)
        assert sum(shares) == sum(sizes) and all(shares[r] == 0 for r in out)
        assert all(shares[r] >= sizes[r] for r in range(len(sizes)) if r not in out)
    with pytest.raises(ValueError, match="no rank in"):
        shares_without((0, 8), (1,))


# --- a rank that feeds stays out


@pytest.mark.parametrize("policy", ["optimal", "dynamic"])
def test_a_policy_keeps_a_held_out_rank_out_where_it_would_bring_it_back(policy):
    plan = Plan(5, (48, 0, 16))
    est = estimates_for([0.001] * 3, [1e-3, 1e-3, 2e-3], [48, 8, 16])  # rank 1 as fast as rank 0
    free = make_policy(policy, PolicyConfig())
    assert free.decide(plan, est, global_step=100).proposed_local_batch_sizes[1] > 0  # it would come back
    held = make_policy(policy, PolicyConfig())
    decision = held.decide(plan, est, global_step=100, held_out=frozenset({1}))
    assert decision.proposed_local_batch_sizes[1] == 0 and sum(decision.proposed_local_batch_sizes) == 64
    assert "ranks 1 kept out: they feed the pipeline" in decision.reason and "stale" not in decision.reason
    assert held.probes_of((64, 0, 0), est, 0.05, held_out=frozenset({1}))[1] == 1  # its cores go to the pipeline
    assert held.probes_of((64, 0, 0), est, 0.05)[1] > 1  # … where a rank out only for speed probes more


# --- the balancer runs it


B = 64


def _period_s(sizes, data_wait_in_s: float, beta0: float, rng) -> tuple[list[float], float]:
    """Busy times and rank 0's step period: rank 0 a fast device fed by the pipeline, which
    it waits ``data_wait_in_s`` for while rank 1 trains on the pipeline's cores (2 ms with
    them free); rank 1 a CPU, 0.8 ms a sample."""
    wait = data_wait_in_s if sizes[1] > 0 else 0.002
    noise = 1 + 0.02 * rng.standard_normal(2)
    busy = [(0.002 + beta0 * sizes[0] + wait) * noise[0], (0.002 + 0.0008 * max(sizes[1], 1)) * noise[1]]
    in_ = [t for t, b in zip(busy, sizes) if b > 0]
    return busy, max(in_) + (0.001 if len(in_) > 1 else 0.0)


def _drive(balancer: Balancer, steps: int, data_wait_in_s: float, beta0: float, lag_steps: int = 2,
           first_step: int = 0, sizes=(32, 32), version: int = 0, attempt: int = 0, epoch_steps: int = 20,
           epoch_end_s=lambda sizes: 0.0):
    """``epoch_end_s(sizes)``: the wait between epochs (the next reading, a report) under a plan."""
    rng = np.random.default_rng(first_step)
    sizes, wall, pending, rows_out, plans = list(sizes), 1000.0 + first_step, [], [], []
    for step in range(first_step, steps):
        while pending and pending[0][0] <= step:
            sizes, version = list(pending.pop(0)[1].local_batch_sizes), version + 1
        busy, period = _period_s(sizes, data_wait_in_s, beta0, rng)
        wall += period + (epoch_end_s(sizes) if step % epoch_steps == 0 else 0.0)
        rows = [{"rank": r, "global_step": step, "epoch": step // epoch_steps, "step": step % epoch_steps,
                 "local_batch_size": b, "busy_time_s": t,
                 "wait_time_s": 0.001, "step_time_s": period, "wall_time": wall, "plan_version": version,
                 "attempt": attempt, "probe_batch_size": 0 if b else 1} for r, (b, t) in enumerate(zip(sizes, busy))]
        out = balancer.add_steps(rows, now=wall)
        rows_out += out.decision_rows
        for proposal in out.new_plans:
            plans.append((step, proposal.numbered(version + 1 + len(pending))))
            pending.append((step + lag_steps, plans[-1][1]))
    return rows_out, plans, sizes


def _balancer(window_steps: int = 10) -> Balancer:
    balancer = Balancer(make_policy("optimal", PolicyConfig()), rebalance_interval=10, global_batch_size=B)
    balancer.begin_attempt(attempt=0, num_workers=2, start_global_step=0)
    balancer.feed_trial = FeedTrial((1,), "CPU-only rank 1", window_steps)
    return balancer


def test_a_cpu_rank_that_starves_the_pipeline_is_left_out_to_feed_it_for_good():
    balancer = _balancer()
    rows, plans, final = _drive(balancer, 300, data_wait_in_s=0.010, beta0=0.0001)
    start = next(r for r in rows if r["reason"].startswith("feeding trial:"))
    verdict = next(r for r in rows if r.get("samples_per_s_feeding") is not None)
    assert start["adopted"] and start["left_out_ranks"] == [1] and start["local_batch_sizes"] == [B, 0]
    assert verdict["reason"].startswith("CPU-only rank 1 feeds the pipeline: ")
    assert verdict["feeding_ranks"] == [1] and not verdict["adopted"]
    assert verdict["samples_per_s_feeding"] > 1.3 * verdict["samples_per_s_training"]
    assert verdict["samples_per_s_training"] == pytest.approx(start["samples_per_s_training"])
    for row in (start, verdict):  # every column of the decisions table, of its type
        assert set(row) == set(SCHEMAS[DECISIONS].names)
        to_table(DECISIONS, [row])
    # the policy made no decision while the trial ran, and never brings the rank back
    during = [r for r in rows if start["global_step"] < r["global_step"] < verdict["global_step"]]
    assert during == []
    assert balancer.feed_trial.phase == DONE and final == [B, 0]
    after = [p for s, p in plans if s > verdict["global_step"]]
    assert all(p.local_batch_sizes[1] == 0 for p in after)
    later = [r for r in rows if r["global_step"] > verdict["global_step"]]
    assert later and all("kept out: they feed the pipeline" in r["reason"] for r in later
                         if not r["reason"].startswith("rollback"))


def test_the_trial_measures_whole_epochs_as_a_separate_run_does_the_wait_between_them_included():
    """The run on bench_ray_data.py --two-nodes (docs/benchmarks.md): with the CPU rank out
    the steps inside an epoch ran 1.5× faster on rows read ahead, and the next reading
    waited between epochs, 0.5 s against 20 ms with it training. Per epoch (20 steps) that
    is 0.71 s against 0.32 s: training is faster, as the separate runs measured. A window
    of periods inside one epoch left the wait out and chose feeding."""
    balancer = _balancer()
    rows, _, final = _drive(balancer, 300, data_wait_in_s=0.010, beta0=0.0001,
                            epoch_end_s=lambda sizes: 0.5 if sizes[1] == 0 else 0.02)
    verdict = next(r for r in rows if r.get("samples_per_s_feeding") is not None)
    assert verdict["reason"].startswith("CPU-only rank 1 trains: "), verdict["reason"]
    assert final[1] > 0
    b0, b1 = balancer.feed_trial.training_sizes  # _period_s without its noise, and the wait between epochs
    epoch_s = {"training": 20 * (max(0.002 + 0.0001 * b0 + 0.010, 0.002 + 0.0008 * b1) + 0.001) + 0.02,
               "feeding": 20 * (0.002 + 0.0001 * B + 0.002) + 0.5}
    for name, seconds in epoch_s.items():  # samples trained per second of wall-clock, whole epochs
        assert verdict[f"samples_per_s_{name}"] == pytest.approx(20 * B / seconds, rel=0.05), name


def test_a_cpu_rank_that_helps_more_by_training_trains_again_with_its_shares():
    balancer = _balancer()
    rows, plans, final = _drive(balancer, 300, data_wait_in_s=0.002, beta0=0.0004)
    start = next(r for r in rows if r["reason"].startswith("feeding trial:"))
    verdict = next(r for r in rows if r.get("samples_per_s_feeding") is not None)
    assert verdict["reason"].startswith("CPU-only rank 1 trains: ")
    assert verdict["adopted"] and verdict["feeding_ranks"] == []
    assert verdict["samples_per_s_training"] > verdict["samples_per_s_feeding"]
    restored = next(p for s, p in plans if s == verdict["global_step"])
    before = next(r for r in reversed(rows) if r["global_step"] < start["global_step"] and r["adopted"])
    assert list(restored.local_batch_sizes) == before["local_batch_sizes"] and restored.local_batch_sizes[1] > 0
    assert final[1] > 0 and balancer.feed_trial.held_out == frozenset()


def test_a_run_that_ends_during_the_trial_says_so():
    balancer = _balancer()
    _drive(balancer, 60, data_wait_in_s=0.010, beta0=0.0001)  # the trial leaves rank 1 out from step ~50
    assert balancer.feed_trial.phase == FEEDING
    [row] = [r for r in balancer.flush() if r["reason"].startswith("feeding trial unfinished")]
    assert row["samples_per_s_training"] > 0 and balancer.feed_trial.phase == DONE


def test_a_worker_group_restarted_during_the_trial_measures_the_feeding_window_from_its_own_steps():
    balancer = _balancer()
    _, plans, sizes = _drive(balancer, 60, data_wait_in_s=0.010, beta0=0.0001)
    assert balancer.feed_trial.phase == FEEDING and sizes == [B, 0]
    saved = balancer.decision_state()
    restarted = _balancer()  # the planner restarted too: its state read back
    restarted.begin_attempt(attempt=1, num_workers=2, start_global_step=60)
    restarted.load_state_dict(balancer.state_dict())
    restarted.load_decision_state(DecisionState.from_dict(saved, 2))
    rows, _, _ = _drive(restarted, 140, data_wait_in_s=0.010, beta0=0.0001, first_step=60, sizes=sizes,
                        version=len(plans), attempt=1)
    verdict = next(r for r in rows if r.get("samples_per_s_feeding") is not None)
    assert verdict["feeding_ranks"] == [1] and verdict["global_step"] > 60
    assert restarted.feed_trial.held_out == frozenset({1})


# --- the planner and the configuration


def test_the_planner_sets_a_trial_from_where_the_ranks_run_and_keeps_it_across_a_restart():
    planner = Planner(B, "optimal", 10, feed_trial="auto", feed_trial_steps=8)
    planner.plan_for(2, ranks=RankFacts(node_ids=("a", "b"), device_kinds=("cpu", "cpu")))
    planner.begin_attempt(0, 2, 0)
    trial = planner.balancer.feed_trial
    assert trial.candidates == (1,) and trial.window_steps == 8 and trial.words == "CPU-only rank 1"
    trial.start(TrialWindow(900.0, 8, 0.01), (40, 24), version=1)
    again = Planner(B, "optimal", 10, feed_trial="auto")
    again.load_state_dict(planner.state_dict())
    restored = again.balancer.feed_trial
    assert restored.phase == FEEDING and restored.training == trial.training and restored.training_sizes == (40, 24)


@pytest.mark.parametrize("mode, nodes, trial", [("auto", ("a", "a"), False), ("on", ("a", "a"), True),
                                                ("off", ("a", "b"), False)])
def test_the_planner_trials_ranks_on_rank_0s_node_only_when_asked(mode, nodes, trial):
    planner = Planner(B, "optimal", 10, feed_trial=mode)
    planner.plan_for(2, ranks=RankFacts(node_ids=nodes, device_kinds=("cpu", "cpu")))
    assert (planner.balancer.feed_trial is not None) == trial


class _Datasets:
    def __init__(self, *names):
        self.feeds = {name: object() for name in names}


@pytest.mark.parametrize("asked, policy, names, mode", [
    (None, "optimal", ("train",), "auto"), (None, "dynamic", ("train",), "auto"),
    (None, "static", ("train",), "off"), (None, "optimal", (), "off"),
    (False, "optimal", ("train",), "off"), (True, "optimal", ("train",), "on"),
])
def test_feed_trial_is_on_by_default_only_where_it_applies(asked, policy, names, mode):
    assert _feed_trial_mode(HeteroConfig(global_batch_size=B, policy=policy, feed_trial=asked),
                            _Datasets(*names)) == mode


@pytest.mark.parametrize("kwargs, names, message", [
    (dict(feed_trial="yes"), ("train",), "HeteroConfig.feed_trial must be None"),
    (dict(feed_trial_steps=1), ("train",), "HeteroConfig.feed_trial_steps must be an integer ≥ 2"),
    (dict(feed_trial=True), (), "no 'train' dataset"),
    (dict(feed_trial=True, policy="static"), ("train",), "policy='static' never does"),
])
def test_bad_feed_trial_settings_are_refused_with_what_to_do(kwargs, names, message):
    with pytest.raises(ConfigError, match=message):
        _feed_trial_mode(HeteroConfig(global_batch_size=B, **kwargs), _Datasets(*names))


def test_a_trial_measures_with_every_batch_of_records_when_steps_outrun_them():
    """Steps of ~5 ms, their records every 10 steps and 0.25 s late, an epoch's last ones
    during a 1 s evaluation: the feeding window's first look, at the end of epoch 0 and
    still within its noise, takes a lead of ~250 steps, which puts the next rebalance point
    past the end of this 100-step run (windows of whole 30-step epochs). The window is looked at again with each batch of its
    steps, and the run ends with a verdict (tests/test_ray_data_feed_trial.py ended
    without one, the same way, once its pipeline kept up with the steps)."""
    balancer = _balancer(window_steps=4)
    rng = np.random.default_rng(0)
    sizes, version, wall, rows_out, batch = [B // 2, B // 2], 0, 1000.0, [], []
    for step in range(100):
        busy = [0.004 * (1 + 0.5 * abs(rng.standard_normal())) for b in sizes]  # alike, out or in: bursty
        period = max(t for t, b in zip(busy, sizes) if b > 0)
        wall += period
        batch += [{"rank": r, "global_step": step, "epoch": step // 30, "step": step % 30, "local_batch_size": b,
                   "busy_time_s": t,
                   "wait_time_s": 0.001, "step_time_s": period, "wall_time": wall, "plan_version": version,
                   "attempt": 0, "probe_batch_size": 0 if b else 1} for r, (b, t) in enumerate(zip(sizes, busy))]
        if step % 10 == 9:
            stall_s = 1.0 if step % 30 == 29 else 0.0  # an evaluation: the epoch's records arrive during it
            out = balancer.add_steps(batch, now=wall + 0.25 + stall_s)
            batch, rows_out = [], rows_out + out.decision_rows
            for proposal in out.new_plans:  # the workers take it at the next step
                sizes, version = list(proposal.local_batch_sizes), version + 1
            wall += stall_s
    reasons = "\n".join(f"{r['global_step']} {r['reason'][:100]}" for r in rows_out)
    starts = [r for r in rows_out if r["reason"].startswith("feeding trial:")]
    assert len(starts) == 1, reasons
    verdicts = [r for r in rows_out if r.get("samples_per_s_feeding") is not None]
    assert len(verdicts) == 1 and verdicts[0]["global_step"] > starts[0]["global_step"], reasons
