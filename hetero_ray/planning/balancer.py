"""The balancer: per-step records in, decisions out, in time for each rebalance point.

Plain class, owned by the planner (:mod:`hetero_ray.planning.planner`), which acts on what
it returns. It learns the plan in force from the records (each row's ``plan_version`` and
``local_batch_size``), decides for the next point ``B`` once the next batch of records would
come too late, and records each adopted decision's ``achieved_step_time_s`` beside its
prediction. A worse plan is never kept: checked after ``rollback_check_steps`` (a trial:
``TRIAL_CHECK_STEPS``), it is rolled back when slower by :data:`ROLLBACK_MARGIN`, the ranks
it grew capped half way (at their old shares past :data:`CLIFF_FACTOR` × the prediction: a
cliff), and judged again by later decisions (:data:`REVERT_MARGIN`). It also runs the
feeding trial (planning/feed_trial.py).
Why: docs/profiling-and-planning.md#the-balancer-moving-work-while-training-runs
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from typing import Callable, Optional, Sequence

from hetero_ray.planning.balancer_state import BalancerOutput, DecisionState, PlanInForce, Predecessor, Proposal, StepInfo
from hetero_ray.planning.balancer_trial import FeedTrialSteps
from hetero_ray.planning.comm import CommEstimates
from hetero_ray.planning.cost_model import kept_mean_s
from hetero_ray.planning.decision import Decision
from hetero_ray.planning.estimates import ClusterEstimates, Estimates
from hetero_ray.planning.feed_trial import FEEDING, WAITING, FeedTrial
from hetero_ray.planning.moves import TRIAL_CHECK_STEPS, MeasuredShares, lift_to_hold, tighter
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import Policy
from hetero_ray.planning.quota import QuotaCaps

_STEPS_TRACKED = 1024  # per-step completeness kept for the newest steps only (a trial's windows: whole epochs)
_EPOCHS_TRACKED = 8  # epochs' first steps kept (a feeding trial's windows span whole epochs)
_GAPS_TRACKED = 4  # the lead plans for the longest of the last few gaps between batches (in steps)
_MAX_LAG_S = 60.0  # a step "older" than this means clocks disagree: ignore the lag
# A plan whose step is this much slower than its predecessor's is rolled back. Below the
# 10 % a user would call "worse", with room for the measurements' own noise.
ROLLBACK_MARGIN = 0.07
_MIN_ROLLBACK_STEPS = 3  # a decision due before the check: judge on at least this many steps
# A plan in force judged again at later decisions is reverted when its step is this much
# slower than its predecessor's: the 10 % a user calls "worse" (the first check, on fewer
# steps, acts earlier at ROLLBACK_MARGIN).
REVERT_MARGIN = 0.10
# A worse plan whose step came out this many times its prediction found a cliff, not a
# wrong slope (see the module docstring). Slopes fitted under noise miss by tens of
# percent; a quota that binds, by 2-3×.
CLIFF_FACTOR = 1.5


class Balancer(FeedTrialSteps):
    def __init__(self, policy: Policy, rebalance_interval: int, window_steps: int = 32,
                 achieved_window_steps: Optional[int] = None, global_batch_size: Optional[int] = None,
                 memory_caps: Optional[Callable[[], Optional[list]]] = None):
        self.policy = policy
        # The memory caps in force, as the owner knows them (the planner: they change with the
        # worker group); alone, the caps the policy was made with.
        self._memory_caps = memory_caps or (lambda: policy.caps)
        # B, when known: a step is a whole plan's exactly when its sizes sum to it (a plan may
        # leave ranks out, so a 0 does not mark an epoch's short last window).
        self.global_batch_size = global_batch_size
        self.rebalance_interval = rebalance_interval
        self.window_steps = window_steps
        self.achieved_window_steps = achieved_window_steps or max(5, min(rebalance_interval, window_steps))
        # Half an interval (≥ 3 steps): early enough that the rollback is in force at the next point.
        self.rollback_check_steps = min(self.achieved_window_steps, max(3, rebalance_interval // 2))
        self.num_workers = 0
        self.attempt = -1
        self.estimates: Optional[ClusterEstimates] = None
        self.comm = CommEstimates()  # c(G) of the groups of ranks in (planning/comm.py)
        self._steps: collections.OrderedDict[int, StepInfo] = collections.OrderedDict()
        self._next_point = 0  # the rebalance point the next decision is for
        self._gap_steps: collections.deque = collections.deque(maxlen=_GAPS_TRACKED)
        self._newest_complete = -1
        self._end_global_step: Optional[int] = None
        self._full_window = 0  # the largest batch of a complete step: the global batch
        self._waiting_since_version: Optional[int] = None  # a proposal made under this version
        self._awaiting_outcome: Optional[tuple[dict, int]] = None  # (row, version it was proposed under)
        self._achieved: list[float] = []
        self._predecessor: Optional[Predecessor] = None  # of the adoption awaiting its check
        self._holds_left = 0  # decisions to skip after a rollback
        self._in_force: Optional[PlanInForce] = None  # the adopted plan judged again (module docstring)
        self._learned_caps: list[Optional[int]] = []  # per rank, from rollbacks (see module docstring)
        self._quota_caps = QuotaCaps(0)  # per rank, from CPU quotas and use (planning/quota.py)
        self._measured = MeasuredShares(0)  # per rank, busy times at the shares it ran (planning/moves.py)
        self._check_steps = self.rollback_check_steps  # of the adoption awaiting its check
        self._shape_seeds: Optional[list] = None  # per rank (α, β, τ) of the first plan's curves
        self.feed_trial: Optional[FeedTrial] = None  # feeding or training (planning/feed_trial.py)
        self._settled_version: Optional[int] = None  # the plan a decision last kept (a trial starts from it)
        self._epoch_starts: dict[int, int] = {}  # epoch → its first global step (the run's, across attempts)

    # ------------------------------------------------------------------ lifecycle
    def begin_attempt(self, attempt: int, num_workers: int, start_global_step: int,
                      end_global_step: Optional[int] = None) -> None:
        """A worker group (re)started; estimates survive unless the number of ranks changed.

        ``end_global_step`` (the run's last step + 1, when known): no plan is proposed for a
        point the workers will never reach — it would be recorded as adopted and never run.
        """
        if self.estimates is None or num_workers != self.num_workers:
            self.estimates = ClusterEstimates(num_workers, window_steps=self.window_steps)
            self.comm = CommEstimates()
        if self.feed_trial is not None and max(self.feed_trial.candidates) >= num_workers:
            self.feed_trial = None  # its candidates were ranks of a larger group (a first plan sets a new one)
        if self._shape_seeds is not None and len(self._shape_seeds) == num_workers:
            self.estimates.seed_shapes(self._shape_seeds)
        self.num_workers = num_workers
        self.attempt = attempt
        self._steps.clear()
        self._next_point = self._point_after(start_global_step)
        self._end_global_step = end_global_step
        self._waiting_since_version = None
        self._newest_complete, self._full_window = -1, 0
        self._gap_steps.clear()
        self._predecessor, self._holds_left, self._learned_caps = None, 0, [None] * num_workers
        self._in_force = None
        self._settled_version = None
        self._quota_caps = QuotaCaps(num_workers)
        self._measured = MeasuredShares(num_workers)
        self._check_steps = self.rollback_check_steps

    def seed_shapes(self, shapes: Optional[Sequence[Optional[tuple[float, float, float]]]]) -> None:
        """The curves the group's first plan was made from, ``(α, β, τ)`` per rank (None:
        none): each rank's estimate keeps that shape, scaled to its measured level, until
        its own steps at several batch sizes fix one (estimates.ClusterEstimates.seed_shapes).
        Applied to the estimates of the group :meth:`begin_attempt` starts."""
        self._shape_seeds = None if shapes is None else list(shapes)

    @property
    def end_global_step(self) -> Optional[int]:
        """Where the run ends (no plan is proposed for a point at or after it); None: unknown."""
        return self._end_global_step

    # ------------------------------------------------------------------ feeding
    def add_steps(self, rows: list[dict], now: Optional[float] = None) -> BalancerOutput:
        """Takes a batch of step records (``now``: the arrival time, default the clock)."""
        now = time.time() if now is None else now
        out = BalancerOutput()
        if self.estimates is None:
            return out
        current = [r for r in rows if r.get("attempt") == self.attempt]
        self.estimates.add(current)
        self._quota_caps.add(current)
        self._measured.add(current)
        newest_complete = None
        for row in current:
            info = self._steps.get(row["global_step"])
            if info is None:
                info = self._steps[row["global_step"]] = StepInfo()
                while len(self._steps) > _STEPS_TRACKED:
                    self._steps.popitem(last=False)
            info.ranks.add(row["rank"])
            info.plan_version = row["plan_version"]
            info.epoch = int(row.get("epoch", -1))
            self._note_epoch_start(row)
            if row["rank"] == 0 and row.get("wall_time") is not None:
                info.rank0_wall_time = float(row["wall_time"])
            info.local_batch_sizes[row["rank"]] = row["local_batch_size"]
            busy, wait = row.get("busy_time_s"), row.get("wait_time_s")
            if row["local_batch_size"] > 0 and busy is not None and busy == busy:  # in, not NaN
                info.max_busy_time_s = max(info.max_busy_time_s, busy)
                info.busy_time_s[row["rank"]] = busy
                if wait is not None and wait == wait:
                    info.comm_time_s = min(info.comm_time_s, wait)
            for key in ("step_time_s", "wall_time"):
                value = row.get(key)
                if value is not None and math.isfinite(value):
                    setattr(info, key, max(value, getattr(info, key)))
            if len(info.ranks) == self.num_workers:
                self._full_window = max(self._full_window, sum(info.local_batch_sizes.values()))
                self._on_complete_step(row["global_step"], info, out)
                newest_complete = max(newest_complete or -1, row["global_step"])
        if newest_complete is None or newest_complete <= self._newest_complete:
            return out
        if self._newest_complete >= 0:
            self._gap_steps.append(newest_complete - self._newest_complete)
        self._newest_complete = newest_complete
        # A feeding trial that measures looks again with every batch: it waits for steps, not
        # for a point, and a lead taken in a stall (records that arrive during an evaluation,
        # after steps of a few ms) can put the next point past the end of a short run.
        # So does a trial waiting for its training window: whole epochs of it are ready between
        # two points, and the lead of a stall can put the next point past the run's end.
        measuring = self.feed_trial is not None and self.feed_trial.phase == FEEDING
        waiting = self.feed_trial is not None and self.feed_trial.phase == WAITING
        lead = self._lead_steps(newest_complete, now)
        reach = newest_complete + lead  # where the next batch finds the workers
        if not measuring and self._end_global_step is not None and self._next_point >= self._end_global_step:
            if waiting and self._trial_starts_between_points(newest_complete, out):
                self._next_point = self._point_after(reach)
            return out  # the run ends before the next point: nothing left to decide for
        if (reach >= self._next_point or measuring) and self._decide(newest_complete, out, lead):
            self._next_point = self._point_after(reach)  # else: try again with the next batch
        elif waiting and self._trial_starts_between_points(newest_complete, out):
            self._next_point = self._point_after(reach)
        return out

    def _note_epoch_start(self, row: dict) -> None:
        epoch, step = row.get("epoch"), row.get("step")
        if epoch is None or step is None or epoch < 0:
            return
        self._epoch_starts[int(epoch)] = int(row["global_step"]) - int(step)
        while len(self._epoch_starts) > _EPOCHS_TRACKED:
            del self._epoch_starts[min(self._epoch_starts)]

    def _point_after(self, global_step: int) -> int:
        """The first rebalance point after ``global_step``."""
        return (global_step // self.rebalance_interval + 1) * self.rebalance_interval

    def _lead_steps(self, newest_complete: int, now: float) -> int:
        """Steps the workers will have run past ``newest_complete`` when the next batch arrives."""
        info = self._steps[newest_complete]
        recent = [i.step_time_s for i in list(self._steps.values())[-8:] if i.step_time_s > 0]
        if not recent:
            return 1
        step_s = statistics.median(recent)
        lag_s = now - info.wall_time
        lag_s = lag_s if 0.0 <= lag_s <= _MAX_LAG_S else 0.0  # unknown, or clocks that disagree
        return math.ceil(lag_s / step_s) + max(self._gap_steps, default=0) + 1

    def _on_complete_step(self, global_step: int, info: StepInfo, out: BalancerOutput) -> None:
        if self._is_full(info.local_batch_sizes.values()):  # a short last window is no plan's group
            self.comm.add([r for r, b in info.local_batch_sizes.items() if b > 0], info.comm_time_s)
        if self._awaiting_outcome is None:
            return
        row, proposed_under_version = self._awaiting_outcome
        if info.plan_version <= proposed_under_version:
            return  # the adopted plan is not in force yet
        self._achieved.append(info.cost_s)
        if len(self._achieved) >= self._check_steps and self._rolled_back(global_step, info, out):
            return
        if len(self._achieved) >= self.achieved_window_steps:
            row["achieved_step_time_s"] = kept_mean_s(self._achieved)
            out.decision_rows.append(row)
            self._awaiting_outcome, self._achieved = None, []

    def _decide(self, newest_complete: int, out: BalancerOutput, lead: int) -> bool:
        """Decides on the plan the newest full step up to ``newest_complete`` ran; False
        when there is none. ``lead``: the steps the workers are ahead of the newest records."""
        global_step = self._newest_full_step(newest_complete)
        if global_step is None:
            return False
        info = self._steps[global_step]
        if self._waiting_since_version is not None and info.plan_version <= self._waiting_since_version:
            return False  # the last adopted plan is not in force yet: decide on what runs, not on the past
        self._waiting_since_version = None
        sizes = tuple(info.local_batch_sizes[r] for r in range(self.num_workers))
        current = Plan(info.plan_version, sizes)
        trial = self.feed_trial
        if trial is not None and trial.phase == FEEDING and self._trial_measures(global_step, current, out):
            return True
        # A decision can come before the check's half interval (records arrive late, the
        # next point is near): the outcome is judged first, on the steps there are, so that
        # going back is a rollback (with what it teaches), not just another move.
        if self._predecessor is not None:
            if len(self._achieved) < _MIN_ROLLBACK_STEPS:
                return False  # too few steps of the new plan to judge it, or to decide on
            if self._rolled_back(global_step, info, out):
                return True
        elif self._in_force is not None and self._reverted(global_step, info, out):
            return True
        if self._holds_left > 0:
            self._holds_left -= 1
            decision = Decision(False, current, "hold: the shares were just restored by a rollback; measuring "
                                "them before moving again", self.policy.name, global_step)
        elif trial is not None and trial.phase == WAITING and self._trial_starts(global_step, current, out):
            return True
        else:
            decision = self._policy_decides(current, global_step)
            if not decision.adopt:
                self._settled_version = current.version
        row = {**decision.to_record(), "achieved_step_time_s": None, "wall_time": time.time(),
               "rest_of_step_s": self._rest_of_step_s(info.plan_version)}
        if decision.adopt:
            row["plan_version"] = None  # the planner's to give (Proposal.numbered)
            # A trial (shares beyond those the curves know: planning/moves.py) is checked
            # sooner, and the ranks ask again once its check can have reached the planner:
            # its steps, then the records' lag behind the workers.
            trial = self._measured.beyond(decision.plan.local_batch_sizes, decision.estimates)
            self._check_steps = min(self.rollback_check_steps, TRIAL_CHECK_STEPS) if trial else \
                self.rollback_check_steps
            out.new_plans.append(Proposal(decision.plan.local_batch_sizes, decision.plan.reason, row,
                                          decision.plan.probe_sizes,
                                          self._check_steps + lead if trial else 0))
            self._waiting_since_version = current.version
            out.decision_rows.extend(self.flush())  # a previous adoption, superseded: what was measured
            self._awaiting_outcome, self._achieved = (row, current.version), []
            self._predecessor = Predecessor(sizes, current.version)
            self._in_force = None
        else:
            out.decision_rows.append(row)
        return True

    # ------------------------------------------------------------------ the feeding trial
    def _trial_batch(self) -> int:
        return self.global_batch_size or self._full_window

    def _row(self, global_step: int, adopted: bool, reason: str, version: Optional[int], sizes, *,
             rest_of: int, **measured) -> dict:
        """A decision row made here rather than by the policy (trials, rollbacks): every
        column of the policy's rows, ``measured`` filling those it has."""
        row = {"global_step": int(global_step), "policy": self.policy.name, "adopted": adopted, "reason": reason,
               "plan_version": None if version is None else int(version),
               "local_batch_sizes": [int(b) for b in sizes],
               "predicted_step_time_s": None, "current_predicted_step_time_s": None, "predicted_gain": None,
               "achieved_step_time_s": None, "wall_time": time.time(),
               "left_out_ranks": [r for r, b in enumerate(sizes) if b == 0],
               "all_ranks_predicted_step_time_s": None,
               # what the plan's own steps took beyond max t_i + c, as every decision row carries
               "rest_of_step_s": self._rest_of_step_s(rest_of),
               "feeding_ranks": [], "samples_per_s_training": None, "samples_per_s_feeding": None}
        row.update(measured)
        return row

    def _newest_full_step(self, newest_complete: int) -> Optional[int]:
        """The newest complete step up to ``newest_complete`` that ran the whole plan. An
        epoch's short last step is no plan (its sizes sum to less than the global batch), and
        workers often send their records at an epoch's end, so the newest step of a batch is
        often short: the decision looks past it rather than wait for a batch that ends on a
        full step (with epochs shorter than the send interval, none would)."""
        for step in sorted(self._steps, reverse=True):
            info = self._steps[step]
            if step > newest_complete or len(info.ranks) < self.num_workers:
                continue
            sizes = info.local_batch_sizes.values()
            if self._is_full(sizes):
                return step
        return None

    def _is_full(self, sizes) -> bool:
        """Whether a step's sizes are a whole plan's, not an epoch's short last window's."""
        sizes = list(sizes)
        if self.global_batch_size is not None:
            return sum(sizes) == self.global_batch_size
        return sum(sizes) >= self._full_window and all(b > 0 for b in sizes)

    def _policy_decides(self, current: Plan, global_step: int) -> Decision:
        """The policy's decision, within the memory caps, the caps rollbacks taught, the
        CPU quotas' caps and the bounds on a move beyond the known shares (planning/moves.py).

        A quota's room is reckoned at a step time: first the plan in force's; but a move
        that shortens the step leaves a quota-bound node less CPU per step, so a move is
        decided again with the caps reckoned at the step time it predicts — the plan's
        measured step time scaled by the predicted change (they only tighten)."""
        policy_state = self.policy.state_dict()
        estimates = self.estimates.estimates(global_step)
        bounded = self._measured.caps(current.local_batch_sizes, estimates)
        quota_caps = self._quota_caps.caps(current.version, current.local_batch_sizes)
        move_caps, lifted = self._moves_that_hold(bounded, quota_caps)
        decision = self._decide_within(current, global_step, estimates, quota_caps, move_caps)
        predicted, now = decision.predicted_step_time_s, decision.current_predicted_step_time_s
        if decision.adopt and all(math.isfinite(t) and t > 0 for t in (predicted, now)):
            at_predicted = self._quota_caps.caps(current.version, current.local_batch_sizes,
                                                 step_scale=predicted / now)
            if any(c is not None and (q is None or c < q) for c, q in zip(at_predicted, quota_caps)):
                self.policy.load_state_dict(policy_state)  # the first decision was not made
                quota_caps = at_predicted
                move_caps, lifted = self._moves_that_hold(bounded, quota_caps)
                decision = self._decide_within(current, global_step, estimates, quota_caps, move_caps)
        proposed = decision.proposed_local_batch_sizes or current.local_batch_sizes
        lifted_by = f"move bounds ×{lifted:.2f}, else no split within the caps holds the batch" if lifted > 1 else ""
        met = "; ".join(m for m in (self._quota_caps.describe(quota_caps, proposed),
                                    self._measured.describe(move_caps, proposed, estimates), lifted_by) if m)
        return dataclasses.replace(decision, reason=f"{decision.reason} ({met})") if met else decision

    def _moves_that_hold(self, move_caps: list[Optional[int]],
                         quota_caps: list[Optional[int]]) -> tuple[list[Optional[int]], float]:
        """The bounds on a move, lifted where with the hard caps they would hold no split of
        the global batch, and the factor (planning/moves.py: lift_to_hold)."""
        hard = [tighter(tighter(m, learned), q) for m, learned, q in
                zip(self._memory_caps() or [None] * self.num_workers, self._learned_caps, quota_caps)]
        return lift_to_hold(move_caps, hard, self._trial_batch())

    def _decide_within(self, current: Plan, global_step: int, estimates: Estimates,
                       *cap_lists: list[Optional[int]]) -> Decision:
        caps = self._memory_caps()
        if any(c is not None for c in (*self._learned_caps, *(c for caps in cap_lists for c in caps))):
            caps = [tighter(m, learned) for m, learned in zip(caps or [None] * self.num_workers, self._learned_caps)]
            for more in cap_lists:
                caps = [tighter(c, other) for c, other in zip(caps, more)]
        return self.policy.decide(current, estimates, global_step, self.comm.cost_s, caps=caps,
                                  held_out=self._held_out())

    def _held_out(self) -> frozenset:
        """The ranks a feeding trial keeps out for the pipeline."""
        return self.feed_trial.held_out if self.feed_trial is not None else frozenset()

    def _complete_steps_of(self, version: int) -> list[StepInfo]:
        """The complete steps run under ``version`` that have a busy time, oldest first."""
        return [i for i in self._steps.values()
                if i.plan_version == version and len(i.ranks) == self.num_workers and i.max_busy_time_s > 0]

    def _step_time_of(self, version: int, num_steps: int) -> Optional[float]:
        """Slowest-rank busy time plus all-reduce (kept mean) of the newest ``num_steps`` complete steps run
        under ``version`` (as many as the new plan is judged on; None: fewer were seen)."""
        times = [i.cost_s for i in self._complete_steps_of(version)][-num_steps:]
        return kept_mean_s(times) if len(times) == num_steps else None

    def _rest_of_step_s(self, version: int) -> Optional[float]:
        """The mean step time of ``version``'s newest complete steps (at most
        ``window_steps``) beyond its slowest rank's mean busy time and the mean all-reduce:
        what a prediction from mean curves leaves out (None: fewer than 3 steps)."""
        infos = [i for i in self._complete_steps_of(version)
                 if math.isfinite(i.step_time_s) and self._is_full(i.local_batch_sizes.values())]
        infos = infos[-self.window_steps:]
        if len(infos) < 3:
            return None
        busy_s = self._mean_busy_times(infos)
        slowest_busy_s = max(busy_s[r] for r, b in infos[-1].local_batch_sizes.items() if b > 0)
        comm = [i.comm_time_s for i in infos if math.isfinite(i.comm_time_s)]
        comm_s = statistics.fmean(comm) if comm else 0.0
        return max(0.0, statistics.fmean(i.step_time_s for i in infos) - slowest_busy_s - comm_s)

    def _rolled_back(self, global_step: int, info: StepInfo, out: BalancerOutput) -> bool:
        """Judges the adopted plan against its predecessor once (see the module docstring);
        True when it was rolled back."""
        if self._predecessor is None or self._awaiting_outcome is None:
            return False
        predecessor, self._predecessor = self._predecessor, None
        achieved = kept_mean_s(self._achieved)
        before = self._step_time_of(predecessor.version, len(self._achieved))
        if before is None:
            return False
        if not achieved > before * (1 + ROLLBACK_MARGIN):
            predicted = self._awaiting_outcome[0].get("predicted_step_time_s")
            self._in_force = PlanInForce(info.plan_version, predecessor, before,
                                      self._busy_times_of(predecessor.version, len(self._achieved)), predicted,
                                      self.estimates.speed_changes())
            return False
        reason = (f"rollback: plan v{info.plan_version} made the step slower ({before * 1e3:.1f} ms → "
                  f"{achieved * 1e3:.1f} ms, over {len(self._achieved)} steps); back to the shares before it")
        self._roll_back(global_step, info, predecessor, before, achieved, reason, out)
        return True

    def _reverted(self, global_step: int, info: StepInfo, out: BalancerOutput) -> bool:
        """Judges the plan in force again (see the module docstring); True when it was reverted."""
        judged = self._in_force
        if info.plan_version != judged.version:
            self._in_force = None  # another plan is in force: nothing left to judge
            return False
        # its newest steps, as many as the first check's: a plan that turned worse half an
        # interval before a point is reverted there
        num_steps = self.rollback_check_steps
        achieved = self._step_time_of(judged.version, num_steps)
        if achieved is None:
            return False  # too few steps to judge: nothing passed, nothing learned
        speed_changes = self.estimates.speed_changes()
        if not achieved > judged.before_s * (1 + REVERT_MARGIN):
            self._in_force = dataclasses.replace(judged, speed_changes=speed_changes, held=True)
            return False
        if judged.held and speed_changes > judged.speed_changes:
            # A rank changed speed after the plan held: its predecessor's step, measured
            # before, no longer says what the old shares would run at, and the policy
            # re-plans from estimates that forgot the records before the change.
            self._in_force = None
            return False
        busy_now = self._busy_times_of(judged.version, num_steps)
        sizes = [info.local_batch_sizes[r] for r in range(self.num_workers)]
        if outside_slowdown(judged.predecessor.local_batch_sizes, sizes, judged.before_busy_s, busy_now,
                            REVERT_MARGIN):
            return False
        self._in_force = None
        reason = (f"revert: plan v{judged.version} runs {achieved * 1e3:.1f} ms a step over its last {num_steps} "
                  f"steps, {achieved / judged.before_s - 1:.0%} slower than the {judged.before_s * 1e3:.1f} ms of "
                  f"the plan before it (v{judged.predecessor.version}; more than {REVERT_MARGIN:.0%}); back to "
                  "the shares before it")
        self._roll_back(global_step, info, judged.predecessor, judged.before_s, achieved, reason, out,
                        predicted_s=judged.predicted_s)
        return True

    def _busy_times_of(self, version: int, num_steps: int) -> tuple[float, ...]:
        """Each rank's mean busy time over the newest ``num_steps`` complete steps of ``version``."""
        return self._mean_busy_times(self._complete_steps_of(version)[-num_steps:])

    def _mean_busy_times(self, infos: list[StepInfo]) -> tuple[float, ...]:
        """Each rank's mean busy time over ``infos`` (0 where it was out; NaN: no steps)."""
        return tuple(statistics.fmean(i.busy_time_s.get(r, 0.0) for i in infos) if infos else math.nan
                     for r in range(self.num_workers))

    def _roll_back(self, global_step: int, info: StepInfo, predecessor: Predecessor, before_s: float,
                   achieved_s: float, reason: str, out: BalancerOutput, predicted_s: Optional[float] = None) -> None:
        """The plan in force made the step slower: its shares go back to its predecessor's."""
        predicted = predicted_s
        if self._awaiting_outcome is not None:
            row, _ = self._awaiting_outcome
            row["achieved_step_time_s"] = achieved_s  # the worse plan's outcome, as far as it ran
            out.decision_rows.append(row)
            predicted = row.get("predicted_step_time_s")
        worse = Plan(info.plan_version, tuple(info.local_batch_sizes[r] for r in range(self.num_workers)))
        cliff = predicted is not None and predicted > 0 and achieved_s > CLIFF_FACTOR * predicted
        for rank, (before, after) in enumerate(zip(predecessor.local_batch_sizes, worse.local_batch_sizes)):
            if after > before:  # its line was trusted too far: half the way at most next time, or no further
                cap = before if cliff else before + (after - before) // 2
                self._learned_caps[rank] = tighter(self._learned_caps[rank], cap)
        # its prediction (the restored plan's measured step) plus its rest of step is the step it will take
        rollback_row = self._row(global_step, True, reason, None, predecessor.local_batch_sizes,
                                 rest_of=predecessor.version, predicted_step_time_s=before_s,
                                 current_predicted_step_time_s=achieved_s,
                                 predicted_gain=(achieved_s - before_s) / achieved_s)
        out.new_plans.append(Proposal(predecessor.local_batch_sizes, reason, rollback_row,
                                      self.policy.probes_of(predecessor.local_batch_sizes,
                                                            self.estimates.estimates(global_step), before_s,
                                                            self._held_out())))
        self._awaiting_outcome, self._achieved = (rollback_row, worse.version), []
        self._waiting_since_version = worse.version
        self._holds_left = 1

    def flush(self) -> list[dict]:
        """Rows still waiting for their outcome (at the end of a run)."""
        trial = self.feed_trial
        if trial is not None and trial.phase == FEEDING and self._newest_complete >= 0:
            trial.abandon()  # the run ended before its feeding window was measured: said once, at the end
            info = self._steps.get(self._newest_complete)
            sizes = [] if info is None else [info.local_batch_sizes.get(r, 0) for r in range(self.num_workers)]
            periods = [] if info is None else self._trial_periods(info.plan_version)
            so_far = self._trial_window(info.plan_version) if periods else None
            measured = (f"{len(periods)} steps with {trial.words} out measured ({so_far.samples_per_s:,.0f} samples/s "
                        f"so far), the windows still within their noise" if so_far is not None else
                        f"{len(periods)} steps with {trial.words} out measured, fewer than a window of whole epochs")
            row = self._trial_row(self._newest_complete, False, f"feeding trial unfinished: the run ended with "
                                  f"{measured}", -1 if info is None else info.plan_version, sizes)
            row["plan_version"] = None if info is None else info.plan_version
            if trial.training is not None:
                row["samples_per_s_training"] = trial.training.samples_per_s
            return [row, *self.flush()]
        if self._awaiting_outcome is None:
            return []
        row = self._awaiting_outcome[0]
        if self._achieved:
            row["achieved_step_time_s"] = kept_mean_s(self._achieved)
        self._awaiting_outcome, self._achieved = None, []
        return [row]

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        return {
            "num_workers": self.num_workers,
            "estimates": None if self.estimates is None else self.estimates.state_dict(),
            "comm": self.comm.state_dict(),
            "policy": self.policy.state_dict(),
        }

    def decision_state(self) -> dict:
        """The decision still waiting for its outcome and what rollbacks taught, JSON-safe:
        what the planner's restart must not lose (its row would never reach the decisions
        table). The outcome's steps are measured again after a restart, from the records
        that arrive then; so is the plan it replaced, which a rollback check then lacks."""
        awaiting = self._awaiting_outcome
        return {
            "awaiting_outcome": None if awaiting is None else {"row": awaiting[0], "proposed_under_version": awaiting[1]},
            "waiting_since_version": self._waiting_since_version,
            "predecessor": None if self._predecessor is None else dataclasses.asdict(self._predecessor),
            "holds_left": self._holds_left,
            "learned_caps": list(self._learned_caps),
            "feed_trial": None if self.feed_trial is None else self.feed_trial.state_dict(),
        }

    def load_decision_state(self, state: "DecisionState") -> None:
        """Continues from a saved :meth:`decision_state` (read by :meth:`DecisionState.from_dict`),
        after :meth:`begin_attempt` of the same worker group."""
        self._awaiting_outcome, self._achieved = state.awaiting_outcome, []
        self._waiting_since_version, self._predecessor = state.waiting_since_version, state.predecessor
        self._holds_left = state.holds_left
        self._learned_caps = list(state.learned_caps) or [None] * self.num_workers
        if state.feed_trial is not None:
            self.feed_trial = state.feed_trial

    def load_state_dict(self, state: dict) -> None:
        self.num_workers = int(state.get("num_workers") or 0)
        if state.get("estimates") and self.num_workers:
            self.estimates = ClusterEstimates(self.num_workers, window_steps=self.window_steps)
            self.estimates.load_state_dict(state["estimates"])
        self.comm = CommEstimates()
        self.comm.load_state_dict(state.get("comm") or {})
        self.policy.load_state_dict(state.get("policy") or {})


def outside_slowdown(sizes_before, sizes_now, busy_before_s, busy_now_s, margin: float) -> bool:
    """True when a rank the new plan gave no more samples got slower by more than
    ``margin``: the step slowed for a reason outside the plan (the machine, a device), and
    the old shares would be no faster. Ranks whose busy time is unknown (NaN) say nothing."""
    return any(now <= before and t_now > t_before * (1 + margin)
               for before, now, t_before, t_now in zip(sizes_before, sizes_now, busy_before_s, busy_now_s))
