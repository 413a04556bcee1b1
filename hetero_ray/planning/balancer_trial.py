"""The balancer's feeding trial (planning/feed_trial.py holds its rules): when it starts,
how its windows are measured from the step records, and its verdict as a decision row and,
where training wins, the shares restored. A part of :class:`~hetero_ray.planning.balancer.Balancer`
(a base class of it), apart so that each file holds one job; it reads the balancer's
records of steps and epochs and its state of adoptions."""

from __future__ import annotations

import math

from hetero_ray.planning.balancer_state import BalancerOutput, Proposal
from hetero_ray.planning.feed_trial import shares_without, step_periods, steps_per_epoch
from hetero_ray.planning.plan import Plan


class FeedTrialSteps:
    """The feeding trial's steps of the balancer (its attributes: see ``Balancer.__init__``)."""

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


def _one_sample_probes(sizes) -> tuple[int, ...]:
    """One sample a step for each rank left out: its cores go to the pipeline, not to probes."""
    return tuple(1 if b == 0 else 0 for b in sizes)
