"""The promise in every combination (DESIGN.md, "Every combination, not every feature"):
a user's loop on the public worker-side API, three ranks of a real gloo group, in every
case of :mod:`tests.promise_matrix` — the full product of loss × model × precision × what
happens to the plan, each with evaluation, checkpoints from every rank, its own sample
count and a scheduler in the loop. On **every** rank, each case ends with:

- one device's weights (fp32: within 1e-5; bf16/fp16: within the precision's own
  rounding of the gradient sums, and equal on every rank), momentum, learning rate,
  scheduler position and GradScaler state;
- one device's evaluations, in the middle of an epoch (while a rank is out) and at its end;
- the loop's own count of trained samples equal to one device's;
- every sample once per epoch (the step rows' sample ids);
- every checkpoint upload of a name holding the same state (whichever Ray Train keeps).

The ranks run in one set of processes for all cases (spawning costs more than the cases).
"""

from __future__ import annotations

import collections
import os

import pytest
import torch
import torch.distributed as dist

from hetero_ray.errors import UserError
from tests import promise_matrix as matrix
from tests.inprocess_session import ScriptedPlanner, run_cases_on_ranks, run_in_session

pytestmark = pytest.mark.slow

# PROMISE_MATRIX_CASES=out_and_back-fp16 runs the cases whose name holds that text (inner loop).
CASES = [c for c in matrix.all_cases() if os.environ.get("PROMISE_MATRIX_CASES", "") in matrix.case_name(c)]
# fp32 through a smooth model: one device's float rounding only. Under autocast the ranks'
# gradient sums are rounded to bf16/fp16 over their own samples, one device's over all.
# (largest seen: bf16 5e-4, fp16 5e-5 on the weights)
WEIGHT_TOLERANCE = {"fp32": 1e-5, "bf16": 2e-3, "fp16": 4e-4}
EVALUATION_TOLERANCE = {"fp32": 1e-5, "bf16": 2e-3, "fp16": 4e-4}
REPLICA_TOLERANCE = 1e-6  # the ranks among themselves, in every precision


def _run_case(case: dict, rank: int, storage: str) -> dict:
    plans = matrix.PLANS[case["plan"]]
    caps = [matrix.MEMORY_CAP] * matrix.NUM_WORKERS if case["plan"] == "micro_batches" else None
    common = dict(rank=rank, num_workers=matrix.NUM_WORKERS, global_batch_size=matrix.GLOBAL_BATCH,
                  planner=ScriptedPlanner(plans, caps), storage=storage, seed=matrix.SEED)
    try:
        if case["plan"] != "resume":
            result, store, ray_train = run_in_session(matrix.user_loop, {"case": case}, **common)
            reports = ray_train.reports
            sample_ids = store.sample_ids
        else:  # epoch 0, then a new session from its checkpoint (rank 0's upload, as Ray Train keeps one)
            first, store, ray_train = run_in_session(matrix.user_loop, {"case": case, "stop_after_epoch": 0},
                                                     **common)
            dist.barrier()
            restored = os.path.join(storage, ray_train.reports[-1]["name"], "rank0")
            result, store2, ray_train2 = run_in_session(matrix.user_loop, {"case": case}, **common,
                                                        restored_checkpoint=restored)
            result["evaluations"] = first["evaluations"] + result["evaluations"]
            result["counted"] += first["counted"]
            reports = ray_train.reports + ray_train2.reports
            sample_ids = store.sample_ids + store2.sample_ids
    except UserError as e:
        return {"refused": str(e)}
    return {**result, "sample_ids": [(r["epoch"], r["sample_indices"]) for r in sample_ids],
            "uploads": [r["checkpoint"] for r in reports if r["checkpoint"]]}


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("promise_matrix")
    return run_cases_on_ranks(_run_case, CASES, matrix.case_name, matrix.NUM_WORKERS, str(out_dir))


def _largest_difference(a, b) -> float:
    if isinstance(a, dict):
        return max((_largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        return max((_largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if a is None or b is None:
        assert a is None and b is None, "one side has state the other lacks"
        return 0.0
    if isinstance(a, torch.Tensor):
        return (a.double() - b.double()).abs().max().item()
    return abs(float(a) - float(b))


@pytest.mark.parametrize("case", CASES, ids=matrix.case_name)
def test_every_rank_is_one_device(per_rank, case):
    name = matrix.case_name(case)
    results = [ranks[name] for ranks in per_rank]
    if matrix.refused(case):
        assert all("token_weighted_loss inside hetero_ray.train.micro_batches" in r.get("refused", "")
                   for r in results), results
        return
    for rank, result in enumerate(results):
        assert "error" not in result and "refused" not in result, f"rank {rank}: {result}"
    reference = matrix.one_device(case)
    precision = case["precision"]
    print(f"{matrix.case_name(case)}: weights {max(_largest_difference(r['params'], reference['params']) for r in results):.2e}"
          f" evaluations {max(_largest_difference(r['evaluations'], reference['evaluations']) for r in results):.2e}"
          f" scaler {[r['scaler'] for r in results]} vs {reference['scaler']}")
    for rank, result in enumerate(results):
        assert _largest_difference(result["params"], reference["params"]) < WEIGHT_TOLERANCE[precision], \
            f"rank {rank}: weights"
        assert _largest_difference(result["momentum"], reference["momentum"]) < WEIGHT_TOLERANCE[precision] * 10, \
            f"rank {rank}: momentum"
        assert result["lr"] == pytest.approx(reference["lr"], rel=1e-12), f"rank {rank}: learning rate"
        assert result["scheduler_epoch"] == reference["scheduler_epoch"], f"rank {rank}: scheduler"
        assert result["scaler"] == reference["scaler"], f"rank {rank}: GradScaler"
        assert _largest_difference(result["evaluations"], reference["evaluations"]) \
            < EVALUATION_TOLERANCE[precision], f"rank {rank}: evaluations"
        assert result["counted"] == reference["counted"], f"rank {rank}: the loop's own sample count"
        # the replicas among themselves: rank 0's state exactly, in every precision
        assert _largest_difference(result["params"], results[0]["params"]) < REPLICA_TOLERANCE, f"rank {rank}"
        assert _largest_difference(result["momentum"], results[0]["momentum"]) < REPLICA_TOLERANCE, f"rank {rank}"


@pytest.mark.parametrize("case", [c for c in CASES if not matrix.refused(c)], ids=matrix.case_name)
def test_every_sample_once_per_epoch_and_every_upload_the_same(per_rank, case):
    name = matrix.case_name(case)
    seen = collections.defaultdict(list)
    for ranks in per_rank:
        for epoch, indices in ranks[name]["sample_ids"]:
            seen[epoch].extend(indices)
    num_samples = matrix.NUM_SAMPLES.get(case["plan"], matrix.DEFAULT_NUM_SAMPLES)
    assert sorted(seen) == list(range(matrix.EPOCHS))
    for epoch, indices in seen.items():
        assert sorted(indices) == list(range(num_samples)), f"epoch {epoch}"
    uploads = collections.defaultdict(list)
    for ranks in per_rank:
        for path in ranks[name]["uploads"]:
            uploads[os.path.dirname(path)].append(torch.load(os.path.join(path, "model.pt"), weights_only=False))
    assert uploads
    for name_dir, saved in uploads.items():
        for other in saved[1:]:
            assert _largest_difference(other["model"], saved[0]["model"]) < REPLICA_TOLERANCE, name_dir
            assert other["scaler"] == saved[0]["scaler"], name_dir
            assert other["scheduler"] == saved[0]["scheduler"], name_dir
