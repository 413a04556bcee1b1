"""The allocator setting: a step's freed activations are reused, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")

# A "step" allocates and frees 64 MiB (an activation), as a training step does; the
# minor page faults of steps 20–29 (once the heap has settled) say whether the memory
# was kept.
_STEPS = """
import resource, sys, torch
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    from hetero_ray.training.rank.allocator import keep_freed_memory
    assert keep_freed_memory() and keep_freed_memory()  # and it can be called again
for step in range(30):
    if step == 20:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 << 20).sum()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


def faults_per_step(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def test_freed_activations_are_reused_without_page_faults():
    assert faults_per_step("default") > 10_000  # 64 MiB of 4 KiB pages, mapped again every step
    assert faults_per_step("keep") < 100


def test_the_benchmark_compares_both_sides(tmp_path, capsys):
    import json

    from benchmarks.allocator import SIDES, main

    out = tmp_path / "allocator.json"
    assert main(["--batch-sizes", "16", "--steps", "3", "--rounds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["batch_sizes"][0]
    assert set(figures["summary"]) == set(SIDES) and figures["step_time_ratio"] > 0
    # Which side faults less is the benchmark's figure, not this test's: a small model's
    # activations stay under glibc's mmap threshold, so both sides fault a page or none
    # at random. The allocator's effect is checked above on a step that does fault.
    assert all(side["faults_per_step"] >= 0 for side in figures["summary"].values())
    assert "page faults/step" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--batch-sizes", "x,1"], ["--batch-sizes", "0"], ["--steps", "0"]])
def test_the_benchmark_refuses_bad_flags(argv, capsys):
    from benchmarks.allocator import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "--batch-sizes wants positive integers" in capsys.readouterr().err
