"""The balancer: per-step records in, decisions out, in time for each rebalance point.

Plain class, owned by the planner (:mod:`hetero_ray.planning.planner`), which acts on what
it returns. It learns the plan in force from the records themselves (each row carries its
``plan_version`` and ``local_batch_size``), so it never decides on a plan the workers are
not running.

Workers switch plans only at rebalance points (global steps that are multiples of the
interval), and records reach the balancer in batches, some steps after they ran. A
decision made when the records *reach* a rebalance point is a point late: the workers
have passed it and the plan waits a whole interval. So the balancer decides for the next
point ``B`` as soon as the records after this batch would arrive too late:

    g = newest step every rank has reported;  lead = ⌈lag / step time⌉ + gap + 1
    if g + lead ≥ B and the last adopted proposal is in force (or none is pending):
        decision = policy.decide(plan in force, estimates, g);  B = next point after g + lead

with ``lag`` how old step ``g`` already is (its wall time against the clock now) and
``gap`` the most steps the workers ran between two of the last few record batches.
Counted in steps, not seconds: a pause in which no step runs (an evaluation, a
checkpoint) would otherwise count as many steps and push the next decisions past several
points. Without step times it decides at ``g = B − 1``.

An adopted decision's row waits until the new plan has run ``achieved_window_steps``
complete steps; then its ``achieved_step_time_s`` (the slowest rank's busy time plus the
step's all-reduce time, ``max_{i∈G} t_i + c(G)`` over the ranks in, over those steps, as
their kept mean: :func:`~hetero_ray.planning.cost_model.kept_mean_s`, which rejects isolated spikes but, unlike a median, counts a slow mode that recurs — a
device stalling into its CPU quota's next period every other step) is filled in and the
row is emitted, prediction and outcome side by side.

Every decision row also carries ``rest_of_step_s``: how much longer the plan decided on
took a step, over its newest complete steps, than its slowest rank's mean busy time plus
the mean all-reduce — the optimizer, the loop, and the jitter of each step waiting for
its unluckiest rank, which curves of mean busy times leave out. No split changes it
much, so plans are compared without it; added to a prediction it gives the step time a
person measures.

A worse plan is never kept. A cost line fitted at one batch size can mislead at another
(under a CPU quota a device looks fast while its step fits in the quota's burst), so a
prediction can be wrong. After ``rollback_check_steps`` steps of an adopted plan, the
same quantity is compared with the plan it replaced over its last as many steps before
the switch (the newest: a device that slowed down just before is measured slow on both
sides, so adapting to it is not mistaken for a worse plan); if the step got slower by
more than :data:`ROLLBACK_MARGIN`, the old shares are proposed again at once — in force
from the next point, so the worse plan runs at most one interval — and the balancer
holds the restored plan for one more decision. It also stops trusting the extrapolation
that misled it: every rank the worse plan gave more samples may from then on be given at
most half that increase (a cap the policy respects, until the worker group restarts). A
second wrong move halves it again, so the shares approach the largest a rank really runs
at its predicted speed instead of swinging between two plans. When the step came out
more than :data:`CLIFF_FACTOR` times the prediction, the cost is no line near that size
but a cliff — a CPU quota the rank's step already fills, so every sample more stalls
into the next period, and halving would only bisect towards the cliff, a costly interval
per try — so those ranks may not grow at all.

A plan can also pass that check and turn worse later (its first steps ran within a CPU
quota's burst, or the check's few steps were lucky): as long as it is in force, every
later decision judges it again, over its newest ``rollback_check_steps`` steps, against
the same measurement of its predecessor. Worse by more than :data:`REVERT_MARGIN`, it is
*reverted* — the same as a rollback (the old shares at the next point, a hold, the caps
that stop the policy from proposing it again) under its own name in the decision row —
unless the ranks it gave no more samples slowed down as much: then the machine or a
device changed, not the plan, and the old shares would be no faster. Nor is a plan that
held through a decision after its check reverted once a rank's speed changes (the
estimates find it: a lasting shift, not a quota's alternating steps): its predecessor was
measured before the change, and the policy re-plans for the new speeds instead. A rank
given two samples more that then runs at half speed is a device that slowed down, not a
worse plan; reverting to the shares measured before would move nothing off it.

Before any of that, a move is bounded (:mod:`hetero_ray.planning.moves`): a rank may be
given only so much beyond the largest share its curve knows that, if it runs there at a
third of the speed it showed (a quota's burst), the step grows by at most a quarter. A move
beyond the known shares is a trial, checked after ``TRIAL_CHECK_STEPS`` steps instead of
``rollback_check_steps``; its plan carries a check point (``Plan.check_after_steps``: those
steps plus the records' lag) where the ranks ask again, so its rollback is in force there.

Where the cliff is a CPU quota it shows before any move: the ranks' step rows carry their
cgroup's quota and the CPU they use under it, and a node's ranks may grow only as far as
the quota carries at the plan's step time (:mod:`hetero_ray.planning.quota`).

A run that reads a Ray Data pipeline may also hold a *feeding trial*
(:mod:`hetero_ray.planning.feed_trial`): once a decision has kept a plan with every
candidate in and whole epochs of it are measured (looked for with every batch of records),
the candidates are left out for a window of whole epochs (longer while the two are within
their noise), and then keeps whichever of the two
measured faster — the candidates out for good (the policy holds them out), or their old
shares back. The policy
decides nothing while the trial runs; no rollback judges the trial's plans (the trial's
own measurement does, on rank 0's step periods: a plan that feeds the pipeline is judged
by what the ranks in wait for, which curves of busy time do not see). Its two rows in the
decisions table carry both measured rates.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from hetero_ray.planning.comm import CommEstimates
from hetero_ray.planning.cost_model import kept_mean_s
from hetero_ray.planning.estimates import ClusterEstimates, Estimates
from hetero_ray.planning.feed_trial import FEEDING, WAITING, FeedTrial, shares_without, step_periods, steps_per_epoch
from hetero_ray.planning.moves import TRIAL_CHECK_STEPS, MeasuredShares, lift_to_hold, tighter
from hetero_ray.planning.decision import Decision
from hetero_ray.planning.policies import Policy
from hetero_ray.planning.plan import Plan
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


@dataclass
class _Predecessor:
    """The plan an adoption replaced (for a rollback)."""

    local_batch_sizes: tuple[int, ...]
    version: int


@dataclass(frozen=True)
class _InForce:
    """A plan that passed its first check, judged again at every decision while in force."""

    version: int
    predecessor: _Predecessor
    before_s: float  # the predecessor's step time, as the first check measured it
    before_busy_s: tuple[float, ...]  # … and each rank's mean busy time over the same steps
    predicted_s: Optional[float]  # the plan's predicted step time (None: unknown)
    speed_changes: int  # the ranks' speed changes the estimates had found when it last passed
    held: bool = False  # it passed a judgement at a decision after its first check


@dataclass(frozen=True)
class DecisionState:
    """A saved :meth:`Balancer.decision_state`, read back and checked."""

    awaiting_outcome: Optional[tuple[dict, int]]
    waiting_since_version: Optional[int]
    predecessor: Optional[_Predecessor]
    holds_left: int
    learned_caps: tuple[Optional[int], ...]
    feed_trial: Optional[FeedTrial] = None

    @classmethod
    def from_dict(cls, state: dict, num_workers: int) -> "DecisionState":
        """Raises (KeyError, TypeError, ValueError) when ``state`` is not a saved one for
        ``num_workers`` ranks."""
        awaiting = state.get("awaiting_outcome")
        predecessor = state.get("predecessor")
        waiting = state.get("waiting_since_version")
        learned = tuple(None if c is None else int(c) for c in state.get("learned_caps") or ())
        if learned and len(learned) != num_workers:
            raise ValueError(f"{len(learned)} learned caps for {num_workers} ranks")
        return cls(
            awaiting_outcome=None if awaiting is None else (dict(awaiting["row"]), int(awaiting["proposed_under_version"])),
            waiting_since_version=None if waiting is None else int(waiting),
            predecessor=None if predecessor is None else _Predecessor(
                tuple(int(b) for b in predecessor["local_batch_sizes"]), int(predecessor["version"])),
            holds_left=int(state.get("holds_left") or 0),
            learned_caps=learned,
            feed_trial=None if not state.get("feed_trial") else FeedTrial.from_dict(state["feed_trial"]),
        )


@dataclass(frozen=True)
class Proposal:
    """Shares the balancer adopted, not yet a plan: the planner alone numbers plans."""

    local_batch_sizes: tuple[int, ...]
    reason: str
    row: dict = field(repr=False)  # its decision row, emitted once the outcome is measured
    probe_sizes: tuple[int, ...] = ()  # Plan.probe_sizes
    check_after_steps: int = 0  # Plan.check_after_steps

    def numbered(self, version: int) -> Plan:
        """The plan the shares become as ``version``, which their decision row records."""
        plan = Plan(version, self.local_batch_sizes, self.reason, self.probe_sizes, self.check_after_steps)
        self.row["plan_version"] = plan.version
        return plan


@dataclass
class BalancerOutput:
    """What the actor must do after a batch of records."""

    decision_rows: list[dict] = field(default_factory=list)  # for the metrics store
    new_plans: list[Proposal] = field(default_factory=list)  # for the planner to number, in order


@dataclass
class _StepInfo:
    ranks: set = field(default_factory=set)
    max_busy_time_s: float = 0.0  # of the ranks in (a rank left out times a probe of its own)
    comm_time_s: float = math.inf  # the all-reduce: the least wait of the ranks in (planning/comm.py)
    step_time_s: float = -math.inf  # the step's (the slowest rank's); -inf: not reported
    wall_time: float = -math.inf  # when the step ended (the latest rank's clock)
    rank0_wall_time: float = math.nan  # … on rank 0's clock (a feeding trial's step periods)
    epoch: int = -1
    plan_version: int = -1
    local_batch_sizes: dict = field(default_factory=dict)
    busy_time_s: dict = field(default_factory=dict)  # per rank

    @property
    def cost_s(self) -> float:
        """The step as the policies predict it: ``max_{i∈G} t_i + c(G)``."""
        return self.max_busy_time_s + (self.comm_time_s if math.isfinite(self.comm_time_s) else 0.0)


class Balancer:
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
        self._steps: collections.OrderedDict[int, _StepInfo] = collections.OrderedDict()
        self._next_point = 0  # the rebalance point the next decision is for
        self._gap_steps: collections.deque = collections.deque(maxlen=_GAPS_TRACKED)
        self._newest_complete = -1
        self._end_global_step: Optional[int] = None
        self._full_window = 0  # the largest batch of a complete step: the global batch
        self._waiting_since_version: Optional[int] = None  # a proposal made under this version
        self._awaiting_outcome: Optional[tuple[dict, int]] = None  # (row, version it was proposed under)
        self._achieved: list[float] = []
        self._predecessor: Optional[_Predecessor] = None  # of the adoption awaiting its check
        self._holds_left = 0  # decisions to skip after a rollback
        self._in_force: Optional[_InForce] = None  # the adopted plan judged again (module docstring)
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
                info = self._steps[row["global_step"]] = _StepInfo()
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

    def _on_complete_step(self, global_step: int, info: _StepInfo, out: BalancerOutput) -> None:
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
            self._predecessor = _Predecessor(sizes, current.version)
            self._in_force = None
        else:
            out.decision_rows.append(row)
        return True

    # ------------------------------------------------------------------ the feeding trial
    def _trial_periods(self, version: int) -> list[tuple[float, int]]:
        """Rank 0's step periods and samples over ``version``'s complete steps, an epoch's
        short last one included (feed_trial.step_periods)."""
        steps = [(step, info.rank0_wall_time, sum(info.local_batch_sizes.values()))
                 for step, info in self._steps.items()
                 if info.plan_version == version and len(info.ranks) == self.num_workers
                 and math.isfinite(info.rank0_wall_time)]
        return step_periods(steps, self.feed_trial.settle_steps)

    def _trial_window(self, version: int):
        """``version``'s window over whole epochs; None until an epoch's length is known
        (feed_trial: a window within an epoch leaves out what the epoch's end costs)."""
        epoch_steps = steps_per_epoch(self._epoch_starts)
        return None if epoch_steps is None else self.feed_trial.window(self._trial_periods(version), epoch_steps)

    def _trial_batch(self) -> int:
        return self.global_batch_size or self._full_window

    def _trial_starts_between_points(self, newest_complete: int, out: BalancerOutput) -> bool:
        """The trial's start, looked for with a batch that reaches no point (the policy does
        not decide there)."""
        global_step = self._newest_full_step(newest_complete)
        if global_step is None:
            return False
        info = self._steps[global_step]
        if self._waiting_since_version is not None and info.plan_version <= self._waiting_since_version:
            return False
        current = Plan(info.plan_version, tuple(info.local_batch_sizes[r] for r in range(self.num_workers)))
        return self._trial_starts(global_step, current, out)

    def _trial_starts(self, global_step: int, current: Plan, out: BalancerOutput) -> bool:
        """Leaves the candidates out from the next point, when the plan in force was kept by
        a decision, has every candidate in and a training window measured; False: not yet."""
        trial = self.feed_trial
        if (self._settled_version != current.version or self._awaiting_outcome is not None
                or self._predecessor is not None or not trial.all_in(current.local_batch_sizes)):
            return False
        training = self._trial_window(current.version)
        epoch_steps = steps_per_epoch(self._epoch_starts)
        if training is None or (self._end_global_step is not None and global_step + trial.settle_steps
                                + trial.shortest(epoch_steps) >= self._end_global_step):
            return False  # not measured yet, or too late to measure the feeding window before the run ends
        try:
            sizes = shares_without(current.local_batch_sizes, trial.candidates,
                                   self.policy.config.min_local_batch_size, self._memory_caps())
        except ValueError as e:
            trial.abandon()
            out.decision_rows.append(self._trial_row(global_step, False, f"feeding trial not run: {e}", current.version,
                                                     current.local_batch_sizes))
            return True
        trial.start(training, current.local_batch_sizes, current.version)
        them = "them" if len(trial.candidates) > 1 else "it"
        reason = (f"feeding trial: {trial.words} left out, the cores {them} trained on left to the Ray Data "
                  f"pipeline, to be measured over {trial.shortest(epoch_steps)} steps (whole "
                  f"epochs) against {training.samples_per_s:,.0f} "
                  f"samples/s with {them} training (the last {training.steps} steps)")
        row = self._trial_row(global_step, True, reason, current.version, sizes)
        row["plan_version"] = None  # the planner's to give (Proposal.numbered)
        row["samples_per_s_training"] = training.samples_per_s
        out.new_plans.append(Proposal(sizes, reason, row, _one_sample_probes(sizes)))
        out.decision_rows.append(row)
        self._waiting_since_version, self._in_force = current.version, None
        return True

    def _trial_measures(self, global_step: int, current: Plan, out: BalancerOutput) -> bool:
        """While the candidates are out: nothing changes until the feeding window is
        measured, then the faster stays. False: the trial was abandoned (another plan is in
        force: a scripted change), and the policy decides."""
        trial = self.feed_trial
        if not trial.all_out(current.local_batch_sizes):
            trial.abandon()
            out.decision_rows.append(self._trial_row(
                global_step, False, f"feeding trial abandoned: plan v{current.version} has {trial.words} in "
                "before the trial measured them out", current.version, current.local_batch_sizes))
            return False
        feeding = self._trial_window(current.version)
        config = self.policy.config
        if feeding is None or not trial.clear(feeding, config.rebalance_threshold, config.noise_margin,
                                              steps_per_epoch(self._epoch_starts)):
            return True  # this point passes: the trial's plan stays in force, measured longer
        verdict = trial.conclude(feeding, config.rebalance_threshold, config.noise_margin)
        if verdict.feed:
            row = self._trial_row(global_step, False, verdict.reason, current.version, current.local_batch_sizes)
            row["feeding_ranks"] = list(trial.candidates)
        else:
            restored = trial.training_sizes
            row = self._trial_row(global_step, True, verdict.reason, current.version, restored)
            row["plan_version"] = None  # the planner's to give (Proposal.numbered)
            out.new_plans.append(Proposal(restored, verdict.reason, row,
                                          _one_sample_probes(restored) if 0 in restored else ()))
            self._waiting_since_version = current.version
        row["samples_per_s_training"] = verdict.training.samples_per_s
        row["samples_per_s_feeding"] = verdict.feeding.samples_per_s
        out.decision_rows.append(row)
        return True

    def _trial_row(self, global_step: int, adopted: bool, reason: str, version: int, sizes) -> dict:
        """A decision row of the trial (``sizes``: the plan it proposes or keeps): measured
        rates, no prediction."""
        return self._row(global_step, adopted, reason, version, sizes, rest_of=version)

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

    def _complete_steps_of(self, version: int) -> list[_StepInfo]:
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

    def _rolled_back(self, global_step: int, info: _StepInfo, out: BalancerOutput) -> bool:
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
            self._in_force = _InForce(info.plan_version, predecessor, before,
                                      self._busy_times_of(predecessor.version, len(self._achieved)), predicted,
                                      self.estimates.speed_changes())
            return False
        reason = (f"rollback: plan v{info.plan_version} made the step slower ({before * 1e3:.1f} ms → "
                  f"{achieved * 1e3:.1f} ms, over {len(self._achieved)} steps); back to the shares before it")
        self._roll_back(global_step, info, predecessor, before, achieved, reason, out)
        return True

    def _reverted(self, global_step: int, info: _StepInfo, out: BalancerOutput) -> bool:
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

    def _mean_busy_times(self, infos: list[_StepInfo]) -> tuple[float, ...]:
        """Each rank's mean busy time over ``infos`` (0 where it was out; NaN: no steps)."""
        return tuple(statistics.fmean(i.busy_time_s.get(r, 0.0) for i in infos) if infos else math.nan
                     for r in range(self.num_workers))

    def _roll_back(self, global_step: int, info: _StepInfo, predecessor: _Predecessor, before_s: float,
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


def _one_sample_probes(sizes) -> tuple[int, ...]:
    """One sample a step for each rank left out: its cores go to the pipeline, not to probes."""
    return tuple(1 if b == 0 else 0 for b in sizes)


