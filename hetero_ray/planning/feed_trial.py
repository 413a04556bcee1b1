"""Feeding or training: whether CPU-only ranks help more by leaving their nodes' CPUs to
the Ray Data pipeline than by training, measured in the run itself.

Once per run the balancer (planning/balancer.py) measures a *training window*, a kept plan
with every candidate in, and a *feeding window*, the candidates left out: samples per
second of wall-clock over whole epochs of rank 0's step periods. Feeding stays when it beats
training by more than the policies' threshold plus the windows' noise; training, when it
falls short of the threshold even one noise margin up; else the feeding window measures on,
and at its longest the rates decide against the threshold alone. Candidates
(:func:`feed_candidates`): beside GPU ranks, every CPU rank; among CPU ranks alone, those off
rank 0's node (with ``same_node``, all but rank 0). Plain Python; nothing here knows Ray.
Why and how: docs/profiling-and-planning.md#feeding-or-training
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from hetero_ray.planning.solver import proportional_split

DEFAULT_WINDOW_STEPS = 20  # steps each window measures: a few hundred ms on a fast step, noise within a few %
SETTLE_STEPS = 2  # steps of a new plan not measured: the switch and the pipeline's change of pace
NOISE_SIGMAS = 2.0  # standard errors of the windows' difference a gain must clear (times noise_margin)
MAX_WINDOWS = 4  # a window measures at most this many times window_steps (a verdict within the noise waits)

WAITING, FEEDING, DONE = "waiting", "feeding", "done"


def feed_candidates(node_ids: Sequence[str], device_kinds: Optional[Sequence[str]],
                    same_node: bool = False) -> tuple[int, ...]:
    """The ranks a feeding trial leaves out together (see the module); () when none.

    Args:
        node_ids: each rank's Ray node.
        device_kinds: each rank's ``"gpu"`` or ``"cpu"`` (None: unknown, taken as CPUs).
        same_node: on a cluster of CPU ranks alone, every rank but 0 (also on rank 0's node).
    """
    n = len(node_ids)
    kinds = list(device_kinds) if device_kinds is not None and len(device_kinds) == n else ["cpu"] * n
    if "gpu" in kinds:
        return tuple(r for r in range(1, n) if kinds[r] == "cpu")
    if same_node:
        return tuple(range(1, n))
    return tuple(r for r in range(1, n) if node_ids[r] != node_ids[0])


def step_periods(steps: Sequence[tuple[int, float, int]], settle_steps: int = SETTLE_STEPS) -> list[tuple[float, int]]:
    """Rank 0's periods ``(p_k, b_k)`` over ``(global_step, wall_time, samples)`` of one
    plan's steps: consecutive steps, across an epoch's end too, after the plan's first
    ``settle_steps`` steps."""
    steps = sorted(steps)
    if not steps:
        return []
    first = steps[0][0]
    periods = []
    for (step_a, wall_a, _), (step_b, wall_b, samples_b) in zip(steps, steps[1:]):
        if step_b == step_a + 1 and step_a >= first + settle_steps - 1 \
                and math.isfinite(wall_b - wall_a) and wall_b > wall_a:
            periods.append((wall_b - wall_a, int(samples_b)))
    return periods


def steps_per_epoch(epoch_starts: dict[int, int]) -> Optional[int]:
    """``S`` from the first global step of each epoch seen (``{epoch: first step}``): the
    newest difference of two consecutive epochs' (None: no two seen)."""
    known = [(epoch_starts[e + 1] - epoch_starts[e]) for e in sorted(epoch_starts, reverse=True)
             if e + 1 in epoch_starts]
    return known[0] if known and known[0] > 0 else None


@dataclass(frozen=True)
class TrialWindow:
    """One window's measured rate: ``samples_per_s = Σ b / Σ p`` over ``steps`` periods (a
    step that waited for the pipeline counts in full)."""

    samples_per_s: float
    steps: int
    rel_se: float  # of the mean period (0 with a single period: its noise is unknown)

    @classmethod
    def of(cls, periods_s: Sequence[float], samples: Sequence[int]) -> "TrialWindow":
        """``samples``: each period's ``b_k``."""
        mean_s = statistics.fmean(periods_s)
        n = len(periods_s)
        rel_se = statistics.stdev(periods_s) / (mean_s * math.sqrt(n)) if n > 1 and mean_s > 0 else 0.0
        return cls(sum(samples) / math.fsum(periods_s), n, rel_se)

    def to_dict(self) -> dict:
        return {"samples_per_s": self.samples_per_s, "steps": self.steps, "rel_se": self.rel_se}

    @classmethod
    def from_dict(cls, state: dict) -> "TrialWindow":
        return cls(float(state["samples_per_s"]), int(state["steps"]), float(state["rel_se"]))


@dataclass(frozen=True)
class FeedVerdict:
    """The trial's outcome: ``feed`` when the candidates stay out for the pipeline."""

    feed: bool
    training: TrialWindow
    feeding: TrialWindow
    gain: float  # r_feed / r_train − 1
    required_gain: float  # threshold + noise
    reason: str


def judge(ranks_words: str, training: TrialWindow, feeding: TrialWindow, threshold: float,
          noise_margin: float = 1.0, plural: bool = False, final: bool = False) -> FeedVerdict:
    """Feeding or training, from the two windows (the rule in the module docstring).
    ``ranks_words``: how the reason names the candidates ("CPU-only rank 1"); ``plural``:
    several of them; ``final``: the windows are as long as they get and the two are within
    their noise, so the measured rates decide against the threshold alone."""
    gain = feeding.samples_per_s / training.samples_per_s - 1.0
    noise = noise_margin * NOISE_SIGMAS * math.hypot(training.rel_se, feeding.rel_se)
    required = threshold if final else threshold + noise
    feed = gain > required
    steps = (f"{training.steps} steps each" if training.steps == feeding.steps
             else f"{training.steps} and {feeding.steps} steps")
    bar = f"feeding {gain:+.1%}; required {required:.1%} = threshold {threshold:.1%} + noise {noise:.1%}"
    if final:
        bar = (f"feeding {gain:+.1%}, within the windows' noise of {noise:.1%} after the longest windows: the "
               f"measured rates decide, against the threshold {threshold:.1%}")
    it = "them" if plural else "it"
    if feed:
        reason = (f"{ranks_words} {'feed' if plural else 'feeds'} the pipeline: {_rate(feeding)} samples/s with "
                  f"{it} out vs {_rate(training)} with {it} training ({steps}; {bar})")
    else:
        reason = (f"{ranks_words} {'train' if plural else 'trains'}: {_rate(training)} samples/s with {it} "
                  f"training vs {_rate(feeding)} with {it} out feeding the pipeline ({steps}; {bar})")
    return FeedVerdict(feed, training, feeding, gain, required, reason)


def shares_without(local_batch_sizes: Sequence[int], left_out: Sequence[int], min_local_batch_size: int = 1,
                   caps: Optional[Sequence[Optional[int]]] = None) -> tuple[int, ...]:
    """The shares with ``left_out`` at 0: their samples go to the other ranks in, in
    proportion to the shares those have (the policy's split of them), within ``caps``.

    Raises:
        ValueError: no rank would be left in, or the caps cannot hold the global batch.
    """
    n = len(local_batch_sizes)
    keep = [r for r in range(n) if r not in set(left_out) and local_batch_sizes[r] > 0]
    if not keep:
        raise ValueError("leaving them out leaves no rank in")
    sizes = [0] * n
    kept_caps = None if caps is None else [caps[r] for r in keep]
    split = proportional_split(sum(local_batch_sizes), [local_batch_sizes[r] for r in keep], min_local_batch_size,
                               kept_caps)
    for r, b in zip(keep, split):
        sizes[r] = int(b)
    return tuple(sizes)


def ranks_words(ranks: Sequence[int], device_kinds: Optional[Sequence[str]]) -> str:
    """How a reason names the candidates: "CPU-only rank 1", "ranks 2, 3"."""
    cpu = device_kinds is not None and all(device_kinds[r] == "cpu" for r in ranks)
    ranks = list(ranks)
    words = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(str(r) for r in ranks)}"
    return ("CPU-only " if cpu else "") + words


class FeedTrial:
    """The trial's state, phase by phase (the balancer acts on it).

    ``waiting``: for a plan the policy kept once, with every candidate in, and
    ``window_steps`` periods of it; ``feeding``: the plan with them out runs (in place of
    ``training_from_version``), measured once it has as many — from the steps of the worker
    group that runs it, after a restart too; ``done``: ``verdict`` says which stayed (None:
    the trial was abandoned, the candidates train).
    """

    def __init__(self, candidates: Sequence[int], words: str, window_steps: int = DEFAULT_WINDOW_STEPS,
                 settle_steps: int = SETTLE_STEPS):
        if not candidates:
            raise ValueError("a feeding trial needs at least one candidate rank")
        if 0 in candidates:
            raise ValueError("rank 0 holds the run's state: it is never left out to feed")
        if window_steps < 2:
            raise ValueError(f"feed_trial_steps must be at least 2 (periods to compare), got {window_steps}")
        self.candidates = tuple(int(r) for r in candidates)
        self.words = words
        self.window_steps = int(window_steps)
        self.settle_steps = int(settle_steps)
        self.phase = WAITING
        self.training: Optional[TrialWindow] = None
        self.training_sizes: Optional[tuple[int, ...]] = None
        self.training_from_version: Optional[int] = None
        self.verdict: Optional[FeedVerdict] = None

    @property
    def held_out(self) -> frozenset:
        """The ranks the policy must keep out: the candidates once the trial chose feeding."""
        return frozenset(self.candidates) if self.verdict is not None and self.verdict.feed else frozenset()

    def all_in(self, local_batch_sizes: Sequence[int]) -> bool:
        return all(local_batch_sizes[r] > 0 for r in self.candidates)

    def all_out(self, local_batch_sizes: Sequence[int]) -> bool:
        return all(local_batch_sizes[r] == 0 for r in self.candidates)

    def shortest(self, steps_per_epoch: int = 1) -> int:
        """A window's fewest periods: ``window_steps``, up to whole epochs of ``S`` steps."""
        return steps_per_epoch * math.ceil(self.window_steps / steps_per_epoch)

    def longest(self, steps_per_epoch: int = 1) -> int:
        """A window's most periods: ``MAX_WINDOWS`` times ``window_steps``, up to whole epochs."""
        return steps_per_epoch * math.ceil(MAX_WINDOWS * self.window_steps / steps_per_epoch)

    def window(self, periods: Sequence[tuple[float, int]], steps_per_epoch: int = 1) -> Optional[TrialWindow]:
        """The newest periods ``(p_k, b_k)`` over whole epochs of ``steps_per_epoch`` steps,
        at most :meth:`longest`, as a window (None: fewer than :meth:`shortest`)."""
        n = min(len(periods), self.longest(steps_per_epoch))
        n -= n % steps_per_epoch  # whole epochs: each window holds as many epochs' ends as steps say
        if n < self.shortest(steps_per_epoch):
            return None
        newest = list(periods)[-n:]
        return TrialWindow.of([p for p, _ in newest], [b for _, b in newest])

    def clear(self, feeding: TrialWindow, threshold: float, noise_margin: float, steps_per_epoch: int = 1) -> bool:
        """Whether ``feeding`` settles the verdict against the training window: feeding
        beats training beyond the bar, or falls short of the threshold even one noise
        margin up, or the feeding window is as long as it gets."""
        verdict = judge(self.words, self.training, feeding, threshold, noise_margin)
        noise = verdict.required_gain - threshold
        return verdict.feed or verdict.gain + noise <= threshold or feeding.steps >= self.longest(steps_per_epoch)

    def start(self, training: TrialWindow, local_batch_sizes: Sequence[int], version: int) -> None:
        self.training, self.training_sizes = training, tuple(int(b) for b in local_batch_sizes)
        self.phase, self.training_from_version = FEEDING, int(version)

    def conclude(self, feeding: TrialWindow, threshold: float, noise_margin: float) -> FeedVerdict:
        """The verdict on a feeding window :meth:`clear` settled: by the noise rule, or, at
        the longest windows with the two still within their noise, by the measured rates."""
        plural = len(self.candidates) > 1
        verdict = judge(self.words, self.training, feeding, threshold, noise_margin, plural)
        noise = verdict.required_gain - threshold
        if not verdict.feed and verdict.gain + noise > threshold:  # neither clear: the windows are all there is
            verdict = judge(self.words, self.training, feeding, threshold, noise_margin, plural, final=True)
        self.verdict, self.phase = verdict, DONE
        return verdict

    def abandon(self) -> None:
        self.phase = DONE

    # -- state (the planner's restart keeps it: planning/planner.py)
    def state_dict(self) -> dict:
        v = self.verdict
        return {
            "candidates": list(self.candidates), "words": self.words, "window_steps": self.window_steps,
            "settle_steps": self.settle_steps, "phase": self.phase,
            "training": None if self.training is None else self.training.to_dict(),
            "training_sizes": None if self.training_sizes is None else list(self.training_sizes),
            "training_from_version": self.training_from_version,
            "verdict": None if v is None else {"feed": v.feed, "training": v.training.to_dict(),
                                               "feeding": v.feeding.to_dict(), "gain": v.gain,
                                               "required_gain": v.required_gain, "reason": v.reason},
        }

    @classmethod
    def from_dict(cls, state: dict) -> "FeedTrial":
        trial = cls(state["candidates"], str(state["words"]), int(state["window_steps"]), int(state["settle_steps"]))
        if state["phase"] not in (WAITING, FEEDING, DONE):
            raise ValueError(f"feeding trial phase {state['phase']!r}")
        trial.phase = state["phase"]
        trial.training = None if state.get("training") is None else TrialWindow.from_dict(state["training"])
        sizes = state.get("training_sizes")
        trial.training_sizes = None if sizes is None else tuple(int(b) for b in sizes)
        version = state.get("training_from_version")
        trial.training_from_version = None if version is None else int(version)
        v = state.get("verdict")
        trial.verdict = None if v is None else FeedVerdict(
            bool(v["feed"]), TrialWindow.from_dict(v["training"]), TrialWindow.from_dict(v["feeding"]),
            float(v["gain"]), float(v["required_gain"]), str(v["reason"]))
        return trial


def _rate(window: TrialWindow) -> str:
    return f"{window.samples_per_s:,.0f}"
