"""Soak (shortened): a long run keeps the metrics store's memory flat and its files complete.

1,500 steps of mlp on 2 workers with the store's in-memory window at 250 rows (full
after a sixth of the run). The store reports its own RSS every second. Once the window is
full, memory must stay flat: less than 50 MiB between the 40 % and 100 % marks (a store
that kept every row would grow by ~1 KiB a row, i.e. ~2 MiB here; the bound is for
allocator noise on a shared machine, not for a leak). The full 5,000-step soak is
`python jobs/soak.py`.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS, WORKERS, WINDOW_ROWS = 1500, 2, 250
GROWTH_BOUND_MIB = 50


def test_a_long_run_keeps_the_store_bounded_and_its_files_complete(ray_session, tmp_path):
    from benchmarks.soak import format_report, run_soak

    # 4,096 samples: 128 steps an epoch, so 11 epoch ends (evaluation, checkpoint) in the run.
    result = run_soak(steps=STEPS, num_workers=WORKERS, max_recent_steps=WINDOW_ROWS, interval_s=1.0,
                      output_dir=str(tmp_path), experiment_name="soak", num_samples=4096, emit=lambda line: None)
    print("\n" + format_report(result))
    figures = result.figures()
    assert result.status == "finished"
    # The files are complete: every step of every rank exactly once.
    assert figures["parquet_rows"] == STEPS * WORKERS
    assert figures["parquet_global_steps"] == STEPS
    assert figures["duplicated_rows"] == 0
    # The window is bounded and was actually filled.
    assert figures["rows_held_max"] == WINDOW_ROWS
    assert all(s.steps_held <= WINDOW_ROWS for s in result.samples)
    late = [s for s in result.samples if s.cursor >= 0.4 * STEPS * WORKERS]
    assert len(late) >= 5, f"too few samples after the 40 % mark to judge growth: {len(late)}"
    assert figures["growth_40_to_100_mib"] < GROWTH_BOUND_MIB, figures
    assert figures["max_excursion_after_40_mib"] < GROWTH_BOUND_MIB, figures
