"""The warm-up times every rank beside the others' load, as training will: two real gloo
processes, a full-speed rank and a quarter-speed one. The fast rank finishes measuring
first and keeps stepping (untimed, padded) until the slow one has measured, so the slow
rank's last blocks are not timed alone on cores the others left; a rank whose measurement
fails still releases the others (no hang)."""

from __future__ import annotations

import time

import torch

from hetero_ray.planning.cost_model import curve_busy_time_s
from hetero_ray.profiling.recipe import ProfileModel
from hetero_ray.training.timing.emulation import SpeedEmulator
from hetero_ray.training.timing.warmup import measure_rank, until_all_ranks_done
from tests.helpers import on_gloo_ranks

SPEEDS = (1.0, 0.25)


def _recipe() -> ProfileModel:
    return ProfileModel(build=lambda: torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                                         torch.nn.Linear(256, 1)),
                        make_batch=lambda b: torch.randn(b, 64), compute_loss=lambda m, x: m(x).square().mean())


def _broken(batch_size):
    raise ValueError("no data")


def _run(rank: int, world_size: int) -> dict:
    seen: dict = {"held_steps": 0}

    def hold(step):
        seen["measured_at"] = time.monotonic()

        def counted():
            step()
            seen["held_steps"] += 1
            seen["last_step_end"] = time.monotonic()

        until_all_ranks_done(counted)
        seen["released_at"] = time.monotonic()

    # blocks last ≥ 0.3 s each whatever the speed: rank 0 measures one round of two sizes
    # (its budget ends it, ~0.6 s), rank 1 two rounds of four (~2.4 s), so rank 1 finishes
    # well after rank 0 whatever the machine's load (with equal budgets, rank 1's slow
    # warm-up dropped its larger sizes and which rank finished first was a coin toss)
    sizes, budget_s = ([8, 32], 0.5) if rank == 0 else ([8, 16, 32, 64], 5.0)
    fit = measure_rank(_recipe(), torch.device("cpu"), sizes, SpeedEmulator(), SPEEDS[rank],
                       time_budget_s=budget_s, hold=hold)
    # rank 1's recipe fails: it still holds once, so rank 0 is released
    recipe = _recipe() if rank == 0 else ProfileModel(build=_recipe().build, make_batch=_broken)
    started = time.monotonic()
    second = measure_rank(recipe, torch.device("cpu"), [8, 32], SpeedEmulator(), SPEEDS[rank], time_budget_s=0.5,
                          hold=until_all_ranks_done)
    return dict(seen, fit=fit, second=second, second_s=time.monotonic() - started)


def _busy_s(fit: dict, batch_size: int) -> float:
    return float(curve_busy_time_s(fit["alpha_s"], fit["beta_s_per_sample"], fit["floor_s"], batch_size))


def test_a_fast_rank_keeps_the_slow_ranks_company_until_it_has_measured():
    fast, slow = on_gloo_ranks(_run, len(SPEEDS))
    assert fast["fit"] is not None and slow["fit"] is not None
    # A quarter of the speed shows in the step: at the largest size both measured, the slow
    # rank's curve is well above the fast one's. (Their slopes alone are a few microseconds a
    # sample beside a step's fixed cost, and a shared machine's noise can order them either way.)
    print(f"\nat 32 samples: fast rank {_busy_s(fast['fit'], 32) * 1e3:.2f} ms, "
          f"slow rank {_busy_s(slow['fit'], 32) * 1e3:.2f} ms")
    assert _busy_s(fast["fit"], 32) < 0.5 * _busy_s(slow["fit"], 32), (fast["fit"], slow["fit"])
    assert fast["measured_at"] < slow["measured_at"], "rank 1 measures more sizes: it finishes later"
    # the fast rank was stepping (not waiting idle) until the slow one's measurement ended
    assert fast["held_steps"] > 0
    # (its last step may end just before the other enters the barrier: one poll between them;
    # idle, the gap would be the ≥ 0.6 s by which rank 1 measures longer)
    assert slow["measured_at"] - fast["last_step_end"] < 0.1
    # the failed measurement gives no line, and the rank that measured was not left waiting
    assert slow["second"] is None and fast["second"] is not None
    assert fast["second_s"] < 30
