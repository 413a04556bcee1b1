"""Rebalance policies: from estimates to a decision (keep the plan, or adopt a new one).

A policy changes nothing itself: :meth:`Policy.initial_plan` and :meth:`Policy.decide` return
a plan or a :class:`~hetero_ray.planning.decision.Decision`, and the planner acts on them.
Each is one class, made known by :func:`register_policy`: ``static`` (equal shares),
``proportional`` (profiled throughput), ``dynamic`` (measured throughput) and ``optimal``,
the ranks in ``G`` and split minimising ``max_{i∈G} t_i(b_i) + c(G)``
(:func:`~hetero_ray.planning.subset.solve_subset_split`; rank 0 always in). The adaptive
ones adopt a proposal whose gain clears ``threshold + k·se·sqrt(2 ln n)``, ``n`` the
*contenders* (within :data:`CONTENDER_SIGMAS` standard errors of the slowest), twice when
under ``confirm_below``× that, and at once when a rank is over its cap.
Why: docs/profiling-and-planning.md#the-bar-a-new-plan-must-clear
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from hetero_ray import validate
from hetero_ray.errors import ConfigError
from hetero_ray.formatting import format_list
from hetero_ray.planning.alike import alike_note, pool_alike
from hetero_ray.planning.capacity import RankCapacity
from hetero_ray.planning.cost_model import curve_busy_time_s
from hetero_ray.planning.decision import Decision, PolicyConfig
from hetero_ray.planning.estimates import Estimates
from hetero_ray.planning.forecast import LevelForecastNoise
from hetero_ray.planning.plan import Plan, equal_split
from hetero_ray.planning.probes import probe_sizes
from hetero_ray.planning.solver import proportional_split, solve_split
from hetero_ray.planning.subset import CommCost, solve_subset_split

DEFAULT_POLICY = "optimal"
# A rank this many standard errors (of the difference of the two levels) faster than the
# slowest is not what made the slowest one the largest: it is no contender (see above).
CONTENDER_SIGMAS = 3.0
# A first plan's lines come from a few seconds of timing (a warm-up, a node profile): the
# lines of two identical ranks differ by up to ~10 % there (make demo's warm-ups: 1.07 and
# 1.18 ms a sample for two ranks at one emulated speed, where the threshold split them
# 38/35). Ranks this close start as one speed; the decisions that follow, on steady steps
# and their noise, split them again where a move gains what a move must.
FIRST_PLAN_ALIKE_SPREAD = 0.15


Capacities = Optional[Sequence[RankCapacity]]
Caps = Optional[Sequence[Optional[int]]]


class Policy(Protocol):
    """The interface every policy implements (plain classes; state: last adoption only).

    What bounds a plan comes with each call, from the planner that owns it: ``caps``
    (per-rank caps: memory, quotas, rollbacks; None entries: no cap; None: the caps the
    policy was made with, :attr:`caps`) and ``held_out`` (ranks that stay out: they feed the
    Ray Data pipeline, planning/feed_trial.py).
    """

    name: str
    caps: Optional[list[Optional[int]]]  # the caps it was made with (read-only)

    def initial_plan(self, global_batch_size: int, num_workers: int, capacities: Capacities = None,
                     caps: Caps = None) -> Plan: ...

    def decide(self, current: Plan, estimates: Optional[Estimates], global_step: int,
               comm_cost_s: Optional[CommCost] = None, caps: Caps = None,
               held_out: frozenset = frozenset()) -> Decision: ...

    def probes_of(self, local_batch_sizes: Sequence[int], estimates: Estimates,
                  step_time_s: float, held_out: frozenset = frozenset()) -> tuple[int, ...]: ...


_REGISTERED: dict[str, type] = {}


def register_policy(cls: type) -> type:
    """Makes a policy class known by its ``name``: to :func:`make_policy`, so to the planner,
    ``--policy`` and ``HeteroConfig(policy=)``, ``hetero-ray plan`` and the docs' lists
    (:func:`policy_names`). A class decorator; the built-in four are registered below."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or name in _REGISTERED and _REGISTERED[name] is not cls:
        raise ValueError(f"a policy needs a name of its own; got {name!r} for {cls.__name__}")
    _REGISTERED[name] = cls
    return cls


def policy_names() -> tuple[str, ...]:
    """Every registered policy's name, the built-in ones first."""
    return tuple(_REGISTERED)


def policy_class(name: str) -> type:
    """The registered policy class called ``name``.

    Raises:
        ConfigError: no policy has that name.
    """
    if name not in _REGISTERED:
        raise ConfigError(f"{validate.named('policy')} must be one of {', '.join(_REGISTERED)}; got {name!r}")
    return _REGISTERED[name]


class _BasePolicy:
    name = "base"
    # Whether the first plan reads the ranks' profiled capacities and memory caps (an equal
    # split reads neither); whether later decisions follow what the steps measure; whether a
    # plan weighs the all-reduce of the ranks in against their compute (and may leave some out).
    uses_capabilities = True
    adapts = False
    weighs_communication = False

    def __init__(self, config: Optional[PolicyConfig] = None, caps: Optional[Sequence[Optional[int]]] = None):
        self.config = config or PolicyConfig()
        self._caps = None if caps is None else list(caps)
        self._last_adopted_step: Optional[int] = None

    @property
    def caps(self) -> Optional[list[Optional[int]]]:
        """The caps it was made with: what bounds a call that brings none."""
        return self._caps

    def _caps_or_own(self, caps: Caps) -> Optional[list[Optional[int]]]:
        return self._caps if caps is None else list(caps)

    # -- plans
    def initial_plan(self, global_batch_size: int, num_workers: int, capacities: Capacities = None,
                     caps: Caps = None) -> Plan:
        """The first plan of ``num_workers`` ranks; ``capacities`` (each rank's profiled line
        and cap, one per rank) when every rank has one, else None. Here: equal shares."""
        self._check_room(global_batch_size, num_workers)
        return Plan(0, tuple(equal_split(global_batch_size, num_workers)), f"{self.name}: equal shares")

    def _throughputs(self, capacities: Capacities, global_batch_size: int, num_workers: int) -> Optional[list]:
        """Each rank's profiled throughput at the mean local batch ``b̄ = B/n``,
        ``b̄ / t_i(b̄)`` (None without capacities)."""
        if capacities is None:
            return None
        self._check_capacities(capacities, num_workers)
        mean_local_batch_size = global_batch_size / num_workers
        return [c.samples_per_s_at(mean_local_batch_size) for c in capacities]

    def _check_capacities(self, capacities: Sequence[RankCapacity], num_workers: int) -> None:
        if len(capacities) != num_workers:
            raise ConfigError(f"{self.name} policy got {len(capacities)} capacities but there are {num_workers} "
                              "ranks; give one per rank")

    def _check_room(self, global_batch_size: int, num_workers: int) -> None:
        if num_workers < 1 or global_batch_size < num_workers * self.config.min_local_batch_size:
            raise ConfigError(
                f"global batch {global_batch_size} cannot give {num_workers} ranks at least "
                f"{self.config.min_local_batch_size} samples each"
            )

    # -- decisions
    def decide(self, current: Plan, estimates: Optional[Estimates], global_step: int,
               comm_cost_s: Optional[CommCost] = None, caps: Caps = None,
               held_out: frozenset = frozenset()) -> Decision:
        """Keeps the plan; reports its predicted step time when there are estimates."""
        est = estimates
        predicted = math.nan
        if est is not None and len(est) == current.num_workers:
            usable = (est.fresh & np.isfinite(est.alpha_s) & np.isfinite(est.beta_s_per_sample)
                      & (np.asarray(current.local_batch_sizes) > 0))
            if usable.any():
                sizes = np.asarray(current.local_batch_sizes)[usable]
                predicted = float(np.max(curve_busy_time_s(est.alpha_s[usable], est.beta_s_per_sample[usable],
                                                           est.floor_s[usable], sizes)))
                predicted += _comm_s(comm_cost_s, current.local_batch_sizes)
        return self._keep(current, f"{self.name}: the plan never changes after start", est, global_step,
                          current_predicted_step_time_s=predicted)

    def _keep(self, current, reason, estimates, global_step, **predictions) -> Decision:
        return Decision(False, current, reason, self.name, global_step, estimates=estimates, **predictions)

    # -- checkpointing
    def state_dict(self) -> dict:
        return {"last_adopted_step": self._last_adopted_step}

    def load_state_dict(self, state: dict) -> None:
        self._last_adopted_step = state.get("last_adopted_step")


@register_policy
class StaticPolicy(_BasePolicy):
    """Equal shares (the first ``B mod n`` ranks one more); never changes."""

    name = "static"
    uses_capabilities = False


@register_policy
class ProportionalPolicy(_BasePolicy):
    """Shares proportional to profiled throughput at the mean local batch (equal without
    profiles), within the caps; fixed after the first plan."""

    name = "proportional"

    def initial_plan(self, global_batch_size: int, num_workers: int, capacities: Capacities = None,
                     caps: Caps = None) -> Plan:
        self._check_room(global_batch_size, num_workers)
        weights = self._throughputs(capacities, global_batch_size, num_workers) or [1.0] * num_workers
        sizes = proportional_split(global_batch_size, weights, self.config.min_local_batch_size,
                                   self._caps_or_own(caps))
        return Plan(0, tuple(sizes), "proportional: shares by profiled capability")


class _AdaptivePolicy(_BasePolicy):
    """Proposes the split that minimises the predicted step time under its cost model."""

    adapts = True

    def __init__(self, config: Optional[PolicyConfig] = None, caps: Optional[Sequence[Optional[int]]] = None):
        super().__init__(config, caps)
        self._level_forecast = LevelForecastNoise()
        self._lead_under_version: Optional[int] = None  # a small gain seen under this plan (confirm_below)

    def _noise_margin(self, est: Estimates, usable: np.ndarray, level_forecast_se: float) -> float:
        """``k·se·sqrt(2 ln n)`` over the contenders (module docstring); each rank's relative
        standard error is its window's, or the levels' measured drift between decisions
        where that is larger (planning/forecast.py)."""
        rel_se = est.busy_time_rel_se[usable]
        se = float(np.median(rel_se[np.isfinite(rel_se)])) if np.isfinite(rel_se).any() else 0.0
        drift = level_forecast_se if level_forecast_se > se else 0.0  # NaN (not measured yet): none
        if drift:
            rel_se, se = np.fmax(rel_se, drift), max(se, drift)
        contenders = _contenders(est.busy_time_s[usable], rel_se)
        selection = se * math.sqrt(2.0 * math.log(contenders)) if contenders > 1 else 0.0
        # Where the levels drift, however clear the slowest rank's lead, the plan meets its
        # level at the next decision, ± drift from today's: a gain within that is no gain.
        return self.config.noise_margin * max(selection, drift)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "level_forecast": self._level_forecast.state_dict(),
                "lead_under_version": self._lead_under_version}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._level_forecast.load_state_dict(state.get("level_forecast"))
        lead = state.get("lead_under_version")
        self._lead_under_version = None if lead is None else int(lead)

    def initial_plan(self, global_batch_size: int, num_workers: int, capacities: Capacities = None,
                     caps: Caps = None) -> Plan:
        """Shares by profiled throughput when there are capacities, else equal (within the caps)."""
        self._check_room(global_batch_size, num_workers)
        caps = self._caps_or_own(caps)
        weights = self._throughputs(capacities, global_batch_size, num_workers)
        if weights is not None:
            sizes = proportional_split(global_batch_size, weights, self.config.min_local_batch_size, caps)
            return Plan(0, tuple(sizes), f"{self.name}: shares by profiled capability")
        sizes = proportional_split(global_batch_size, [1.0] * num_workers, self.config.min_local_batch_size, caps)
        return Plan(0, tuple(sizes), f"{self.name}: equal shares until measured")

    def _cost_model(self, est: Estimates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-rank (α_i, β_i, τ_i) of this policy's cost model; NaN where unknown. Here:
        the fitted curves ``t_i(b) = max(τ_i, α_i + β_i·b)``."""
        return est.alpha_s, est.beta_s_per_sample, est.floor_s

    def probes_of(self, local_batch_sizes: Sequence[int], estimates: Estimates,
                  step_time_s: float, held_out: frozenset = frozenset()) -> tuple[int, ...]:
        """The probe sizes a plan with these shares carries (planning/probes.py), from this
        policy's cost model and the plan's predicted ``step_time_s``; () when every rank is in.
        For a plan it adopts, and for one the balancer restores (its step rows carry none)."""
        if 0 not in local_batch_sizes:
            return ()
        alphas, betas, floors = self._cost_model(estimates)
        sizes = probe_sizes(local_batch_sizes, alphas, betas, floors, step_time_s)
        # a rank that feeds the pipeline leaves it its cores: one sample a step
        return tuple(1 if r in held_out and p else p for r, p in enumerate(sizes))

    def _propose(self, current: Plan, alphas: np.ndarray, betas: np.ndarray, floors: np.ndarray,
                 usable: np.ndarray, lo: np.ndarray, hi: list, comm_cost_s: Optional[CommCost]):
        """The split to propose, and (left out ranks, predicted step time with every rank in)
        — here every rank is in. Raises ValueError when no split is feasible."""
        # A stale rank that is out stays out (its size, 0, is kept like any stale rank's).
        idx = np.flatnonzero(usable | (np.asarray(current.local_batch_sizes) > 0))
        part = solve_split(np.where(usable, alphas, 0.0)[idx], np.where(usable, betas, 1.0)[idx],
                           current.global_batch_size, lo[idx], [hi[r] for r in idx], np.where(usable, floors, 0.0)[idx])
        sizes = [0] * current.num_workers
        for r, b in zip(idx, part):
            sizes[r] = int(b)
        return sizes, (), math.nan

    def decide(self, current: Plan, estimates: Optional[Estimates], global_step: int,
               comm_cost_s: Optional[CommCost] = None, caps: Caps = None,
               held_out: frozenset = frozenset()) -> Decision:
        """Called by the balancer every rebalance interval with a snapshot of the estimates,
        the learned all-reduce time ``comm_cost_s`` of a group of ranks (None: compute only),
        the caps in force and the ranks held out to feed the pipeline; never raises on odd
        estimates (wrong rank count, none fresh, infeasible around stale ranks): it keeps the
        plan and says why."""
        cfg, est, n = self.config, estimates, current.num_workers
        if est is None or len(est) != n:
            got = 0 if est is None else len(est)
            return self._keep(current, f"estimates for {got} ranks but the plan has {n}: keep the plan", est, global_step)
        view = self._view(current, est, comm_cost_s, caps, held_out)
        if not view.usable.any():
            return self._keep(current, "no fresh estimate yet: keep the plan", est, global_step)
        level_forecast_se = self._level_forecast.observe(est)  # every decision's levels count
        current_pred = view.predicted(view.b_now)
        if self._last_adopted_step is not None and global_step - self._last_adopted_step < cfg.rebalance_cooldown:
            return self._keep(
                current,
                f"cooldown: {global_step - self._last_adopted_step} of {cfg.rebalance_cooldown} steps since "
                f"the last change at step {self._last_adopted_step}",
                est, global_step, current_predicted_step_time_s=current_pred,
            )
        margin = self._noise_margin(est, view.usable, level_forecast_se)
        required = cfg.rebalance_threshold + margin  # gain > threshold + se·sqrt(2 ln n)
        try:
            proposal, left_out, all_ranks_s, pooled, alike = self._pooled_proposal(current, est, view, required,
                                                                                  level_forecast_se)
        except ValueError as e:
            around = "within the caps and around the stale ranks" if (~view.usable).any() else "within the caps"
            return self._keep(current, f"no feasible split {around} ({e}): keep the plan",
                              est, global_step, current_predicted_step_time_s=current_pred)
        proposal, left_out, kept_in_note = self._left_out_only_where_it_pays(current, view, pooled, proposal, left_out,
                                                                             all_ranks_s, required)
        proposed_pred = view.predicted(np.asarray(proposal))
        gain = (current_pred - proposed_pred) / current_pred  # (P_cur − P_new)/P_cur
        predictions = dict(
            proposed_local_batch_sizes=tuple(proposal),
            predicted_step_time_s=proposed_pred,
            current_predicted_step_time_s=current_pred,
            predicted_gain=gain,
            required_gain=required,
            left_out=tuple(left_out),
            all_ranks_step_time_s=all_ranks_s,
        )
        notes = (_membership_notes(view.b_now, proposal, left_out, proposed_pred, all_ranks_s) + kept_in_note
                 + alike_note(alike, (view.alphas, view.betas, view.floors), f"{required:.1%} or their noise")
                 + _stale_notes(view))
        if tuple(proposal) == current.local_batch_sizes:
            self._lead_under_version = None
            return self._keep(current, f"the current plan is already the best split{notes}",
                              est, global_step, **predictions)
        summary = (f"predicted step time {current_pred * 1e3:.2f} ms → {proposed_pred * 1e3:.2f} ms "
                   f"({gain:+.1%}; required {required:.1%} = threshold {cfg.rebalance_threshold:.1%} "
                   f"+ noise {margin:.1%})")
        return self._adopt_or_keep(current, est, global_step, view, proposal, summary, notes, held_out, predictions)

    def _view(self, current: Plan, est: Estimates, comm_cost_s: Optional[CommCost], caps: Caps,
              held_out: frozenset) -> "_DecisionView":
        """What a decision works from: this policy's curves, the ranks it may move (fresh
        ones not held out) and each rank's bounds."""
        n = current.num_workers
        alphas, betas, floors = self._cost_model(est)
        usable = (est.fresh & np.isfinite(alphas) & np.isfinite(betas) & np.isfinite(floors) & (betas >= 0)
                  & (curve_busy_time_s(alphas, betas, floors, 1.0) > 0))
        # Ranks held out to feed the pipeline keep their size, 0, as a stale rank out would.
        held = np.isin(np.arange(n), sorted(held_out))
        usable &= ~held
        b_now = np.asarray(current.local_batch_sizes, dtype=np.int64)
        # Stale ranks keep their size: lo_i = hi_i = b_i; fresh ones range over [b_min, cap_i].
        lo = np.where(usable, self.config.min_local_batch_size, b_now)
        hi = [c if u else int(b) for c, u, b in zip(self._caps_or_own(caps) or [None] * n, usable, b_now)]
        return _DecisionView(alphas, betas, floors, usable, held, b_now, lo, hi, comm_cost_s)

    def _pooled_proposal(self, current: Plan, est: Estimates, view: "_DecisionView", required: float,
                         level_forecast_se: float):
        """The proposal, with ranks that differ by less than a move must clear split as one
        speed (alike.py): solved again with their group's curve (the predictions keep every
        rank's own). Returns (proposal, left out, all ranks' step time, the curves solved
        with, the alike groups). Raises ValueError when no split is feasible."""
        proposal, left_out, all_ranks_s = self._propose(current, view.alphas, view.betas, view.floors, view.usable,
                                                        view.lo, view.hi, view.comm_cost_s)
        rel_se = est.busy_time_rel_se
        if level_forecast_se > 0:  # the levels' drift between decisions (NaN: not measured yet)
            rel_se = np.fmax(rel_se, level_forecast_se)
        shares = np.asarray(proposal, dtype=np.float64)
        shares = np.where(shares > 0, shares, current.global_batch_size / int(view.usable.sum()))
        solve_a, solve_b, solve_f, alike = pool_alike(view.alphas, view.betas, view.floors, shares, required, rel_se,
                                                      view.usable)
        if alike:
            proposal, left_out, all_ranks_s = self._propose(current, solve_a, solve_b, solve_f, view.usable, view.lo,
                                                            view.hi, view.comm_cost_s)
        return proposal, left_out, all_ranks_s, (solve_a, solve_b, solve_f), alike

    def _left_out_only_where_it_pays(self, current: Plan, view: "_DecisionView", pooled, proposal, left_out,
                                     all_ranks_s: float, required: float):
        """Leaving a rank out must pay on its own: against the best split with every rank in,
        its gain clears the same bar as any move (else a move that pays for its other changes
        would also leave out a rank whose gain is noise). Returns (proposal, left out, note)."""
        proposed_pred = view.predicted(np.asarray(proposal))
        newly_out = [r for r in left_out if view.b_now[r] > 0]
        if not (newly_out and math.isfinite(all_ranks_s) and not (all_ranks_s - proposed_pred) / all_ranks_s > required):
            return proposal, left_out, ""
        own_gain = (all_ranks_s - proposed_pred) / all_ranks_s
        note = (f"; ranks {format_list(newly_out)} kept in: leaving them out would gain "
                f"{own_gain:+.1%} ({all_ranks_s * 1e3:.2f} → {proposed_pred * 1e3:.2f} ms), within the "
                f"required {required:.1%}")
        proposal, left_out, _ = _AdaptivePolicy._propose(self, current, *pooled, view.usable, view.lo, view.hi,
                                                         view.comm_cost_s)
        return proposal, left_out, note

    def _adopt_or_keep(self, current: Plan, est: Estimates, global_step: int, view: "_DecisionView", proposal,
                       summary: str, notes: str, held_out: frozenset, predictions: dict) -> Decision:
        """The verdict on a proposal that differs from the plan: adopted when its gain clears
        the bar (a second time, when it clears it by less than ``confirm_below``×), or at once
        when a rank is over its cap; else kept, with the reason."""
        cfg = self.config
        gain, required = predictions["predicted_gain"], predictions["required_gain"]
        over = [r for r in np.flatnonzero(view.usable) if view.hi[r] is not None and view.b_now[r] > view.hi[r]]
        if over:  # no gain to weigh: a plan over its caps cannot stay in force (e.g. a CPU quota it stalls on)
            summary = (f"ranks {format_list(int(r) for r in over)} over their caps "
                       f"({', '.join(f'{int(view.b_now[r])} > {view.hi[r]}' for r in over[:8])}); {summary}")
        elif not gain > required:
            self._lead_under_version = None
            return self._keep(current, f"keep: {summary}{notes}", est, global_step, **predictions)
        elif gain < cfg.confirm_below * required and self._lead_under_version != current.version:
            self._lead_under_version = current.version
            return self._keep(current, f"keep until the next decision confirms it: {summary}, below "
                              f"{cfg.confirm_below:g}× the required gain{notes}", est, global_step, **predictions)
        probes = self.probes_of(proposal, est, predictions["predicted_step_time_s"], held_out)
        probe_note = (f"; probes of {'/'.join(str(p) for p in probes if p)} samples while out (within half the "
                      f"predicted step)" if probes else "")
        reason = f"{self.name}: {summary}{notes}{probe_note}"
        self._last_adopted_step, self._lead_under_version = global_step, None
        return Decision(True, current.with_sizes(proposal, reason, probes), reason, self.name, global_step,
                        estimates=est, **predictions)


@dataclass(frozen=True)
class _DecisionView:
    """What one decision of an adaptive policy sees (:meth:`_AdaptivePolicy._view`)."""

    alphas: np.ndarray
    betas: np.ndarray
    floors: np.ndarray
    usable: np.ndarray  # the ranks it may move: fresh, not held out
    held: np.ndarray  # held out to feed the pipeline
    b_now: np.ndarray
    lo: np.ndarray
    hi: list
    comm_cost_s: Optional[CommCost]

    def predicted(self, sizes: np.ndarray) -> float:
        """P = max over fresh ranks in of t_i(b_i) + c(ranks in) (stale ranks: unknown, not counted)."""
        counted = self.usable & (sizes > 0)
        compute = float(np.max(curve_busy_time_s(self.alphas[counted], self.betas[counted], self.floors[counted],
                                                 sizes[counted]))) if counted.any() else 0.0
        return compute + _comm_s(self.comm_cost_s, sizes)


def _membership_notes(b_now: np.ndarray, proposal, left_out, proposed_pred: float, all_ranks_s: float) -> str:
    """The reason's words on ranks the proposal leaves out or brings back."""
    note = f"; {_left_out_words(left_out, proposed_pred, all_ranks_s)}" if left_out else ""
    back = [r for r in range(len(b_now)) if b_now[r] == 0 and proposal[r] > 0]
    if back:
        note += f"; ranks {format_list(back)} brought back: predicted faster with them"
    return note


def _left_out_words(left_out, without_s: float, with_every_rank_s: float) -> str:
    """Why ranks are out of a plan, as a decision's reason and a first plan's say it."""
    return (f"ranks {format_list(left_out)} left out: their all-reduce costs more than they add (predicted "
            f"{without_s * 1e3:.2f} ms without them, {with_every_rank_s * 1e3:.2f} ms with every rank in)")


def _stale_notes(view: _DecisionView) -> str:
    """The reason's words on ranks the decision could not move: stale, or held out."""
    stale = np.flatnonzero(~view.usable & ~view.held)
    note = f"; ranks {format_list(int(r) for r in stale)} stale, kept at their size" if stale.size else ""
    if view.held.any():
        note += f"; ranks {format_list(int(r) for r in np.flatnonzero(view.held))} kept out: they feed the pipeline"
    return note


@register_policy
class DynamicPolicy(_AdaptivePolicy):
    """Shares proportional to measured throughput: the cost model with ``α_i = 0``,
    ``t_i(b) = b / samples_per_s_i`` (so the split equalises ``b_i / samples_per_s_i``)."""

    name = "dynamic"

    def _cost_model(self, est: Estimates):
        with np.errstate(divide="ignore", invalid="ignore"):
            zeros = np.zeros(len(est))
            return zeros, 1.0 / est.samples_per_s, zeros  # α = τ = 0, β = 1/samples_per_s


@register_policy
class OptimalPolicy(_AdaptivePolicy):
    """Minimises the predicted step time with the fitted ``t_i(b) = max(τ_i, α_i + β_i·b)``;
    with profiled capacities, the first plan is already optimal for their curves."""

    name = "optimal"
    weighs_communication = True

    def initial_plan(self, global_batch_size: int, num_workers: int, capacities: Capacities = None,
                     caps: Caps = None, comm_cost_s: Optional[CommCost] = None) -> Plan:
        """As every policy's; ``comm_cost_s``: the all-reduce ``c(G)`` of a group of ranks where
        it is known before any step (``hetero-ray plan --allreduce-ms``): the plan is then the
        one later decisions reach once they have measured it, ranks left out included."""
        if capacities is None:
            return super().initial_plan(global_batch_size, num_workers, caps=caps)
        caps = self._caps_or_own(caps)
        self._check_room(global_batch_size, num_workers)
        self._check_capacities(capacities, num_workers)
        alphas, betas, floors = ([c.alpha_s for c in capacities], [c.beta_s_per_sample for c in capacities],
                                 [c.floor_s for c in capacities])
        if comm_cost_s is not None:
            return self._first_plan_with_communication(alphas, betas, floors, global_batch_size, caps, comm_cost_s)
        # Ranks within the threshold of each other are split as one speed (alike.py): a later
        # decision could not move their shares apart for that difference either.
        sizes = solve_split(alphas, betas, global_batch_size, self.config.min_local_batch_size, caps, floors)
        pooled_a, pooled_b, pooled_f, alike = pool_alike(alphas, betas, floors, sizes, FIRST_PLAN_ALIKE_SPREAD)
        if alike:
            sizes = solve_split(pooled_a, pooled_b, global_batch_size, self.config.min_local_batch_size, caps,
                                pooled_f)
        note = alike_note(alike, (alphas, betas, floors), f"{FIRST_PLAN_ALIKE_SPREAD:.0%}, a first plan's noise")
        return Plan(0, tuple(sizes), f"optimal: split for the profiled cost model{note}")

    def _first_plan_with_communication(self, alphas, betas, floors, global_batch_size: int, caps,
                                       comm_cost_s: CommCost) -> Plan:
        """The group and split minimising ``max t_i(b_i) + c(G)``, rank 0 always in
        (:func:`subset.solve_subset_split`, as :meth:`_propose`)."""
        result = solve_subset_split(alphas, betas, global_batch_size, comm_cost_s, self.config.min_local_batch_size,
                                    caps, floors, must_include=[0])
        every_rank_s = comm_cost_s(frozenset(range(len(alphas))))
        out = (_left_out_words(result.left_out, result.predicted_step_time_s, result.all_ranks_step_time_s)
               if result.left_out else "every rank in")
        reason = f"optimal with an all-reduce of {every_rank_s * 1e3:.3g} ms for every rank: {out}"
        return Plan(0, tuple(result.local_batch_sizes), reason)

    def _propose(self, current: Plan, alphas, betas, floors, usable, lo, hi, comm_cost_s):
        """The best group and split of the fresh ranks (:func:`subset.solve_subset_split`);
        stale ranks keep their size (in or out) and count in every group's ``c``."""
        if comm_cost_s is None:
            return super()._propose(current, alphas, betas, floors, usable, lo, hi, comm_cost_s)
        b_now = np.asarray(current.local_batch_sizes, dtype=np.int64)
        idx = np.flatnonzero(usable)
        stale_in = frozenset(int(r) for r in np.flatnonzero(~usable & (b_now > 0)))
        remaining = current.global_batch_size - int(b_now[~usable].sum())
        if remaining < 1:
            raise ValueError("the stale ranks hold the whole global batch")
        must = [i for i, r in enumerate(idx) if r == 0]  # rank 0 is always in (see the module docstring)
        result = solve_subset_split(alphas[idx], betas[idx], remaining,
                                    lambda g: comm_cost_s(frozenset(int(idx[i]) for i in g) | stale_in),
                                    self.config.min_local_batch_size, [hi[r] for r in idx], floors[idx],
                                    must_include=must)
        sizes = b_now.copy()
        sizes[idx] = result.local_batch_sizes
        left_out = tuple(int(idx[i]) for i in result.left_out)
        return [int(b) for b in sizes], left_out, result.all_ranks_step_time_s


def make_policy(
    name: str = DEFAULT_POLICY,
    config: Optional[PolicyConfig] = None,
    *,
    caps: Optional[Sequence[Optional[int]]] = None,
) -> Policy:
    """The registered policy called ``name`` (:func:`policy_names`); ``caps`` bound every
    rank's local batch (memory)."""
    return policy_class(name)(config, caps)


def _contenders(busy_time_s: np.ndarray, rel_se: np.ndarray) -> int:
    """Ranks whose busy time is within :data:`CONTENDER_SIGMAS` standard errors of the
    slowest one's (the slowest included); every rank where the noise is unknown."""
    if not (np.isfinite(busy_time_s).all() and np.isfinite(rel_se).all()) or busy_time_s.size == 0:
        return int(busy_time_s.size)
    slowest = int(np.argmax(busy_time_s))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(busy_time_s[slowest] / busy_time_s) / np.sqrt(rel_se[slowest] ** 2 + rel_se ** 2)
    return int(np.sum(~(z >= CONTENDER_SIGMAS)))  # NaN (0/0: identical, no noise) counts as a contender


def _comm_s(comm_cost_s: Optional[CommCost], sizes) -> float:
    """``c`` of the ranks a split puts in (0 without a communication model)."""
    if comm_cost_s is None:
        return 0.0
    return float(comm_cost_s(frozenset(int(r) for r, b in enumerate(sizes) if b > 0)))
