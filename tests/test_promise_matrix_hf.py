"""The promise matrix's Hugging Face rows: the ``transformers.Trainer`` through
``hetero_ray.train.prepare_trainer``, on three ranks of a real gloo group (without Ray:
tests/inprocess_session.py), against one Trainer on one device over the same global
batches — for each kind of loss a Trainer computes (a causal LM's, counted in tokens; a
plain model's local mean; a BERT classifier's plain mean behind a ``forward`` that takes
``**kwargs``) × precision (fp32; bf16) × what happens to the plan (a change; a rank left
out and brought back across an epoch's end; a rank left out from the first plan). The
Trainer evaluates every 2 steps (also while a rank is out) and logs every step; every
epoch ends with a short window. Every pair of values is covered (9 cases), and a
negative control: the Trainer's own DDP over unequal shares, unweighted, does not match. On every rank: one device's weights, learning rate,
scheduler position, evaluation losses and count of input tokens seen (a left-out rank's
probe tokens are none of it), and every sample once per epoch.
"""

from __future__ import annotations

import collections
import os

import pytest

transformers = pytest.importorskip("transformers")

from tests.hf_models import EPOCHS, SEED, make_dataset, make_model, one_device_trainer, training_args  # noqa: E402
from tests.inprocess_session import ScriptedPlanner, run_cases_on_ranks, run_in_session  # noqa: E402

pytestmark = pytest.mark.slow

NUM_WORKERS, NUM_SAMPLES, GLOBAL_BATCH = 3, 66, 24  # 3 steps an epoch, the last a window of 18
EVAL_SAMPLES, EVAL_STEPS = 24, 2
KINDS = ("token_loss", "mean_loss", "kwargs_mean_loss")
PRECISIONS = ("fp32", "bf16")
PLANS = {
    "change": {0: (8, 8, 8), 2: (12, 4, 8)},
    "out_and_back": {0: (8, 8, 8), 1: (16, 0, 8), 2: (12, 0, 12), 4: (8, 8, 8)},  # rank 1 out at steps 1–3
    "out_from_first": {0: (16, 8, 0), 2: (8, 8, 8), 5: (20, 4, 0)},
}
# Every pair of values (all-pairs): each kind under each plan, and each of them in both precisions.
CASES = [{"kind": kind, "plan": plan, "precision": PRECISIONS[(i + j) % 2]}
         for i, plan in enumerate(PLANS) for j, kind in enumerate(KINDS)]
# The negative control: the Trainer's own DDP (what Ray Train's prepare_trainer leaves: equal
# weights 1/n) over the same kind of unequal shares, which must not come out as one device.
PLAIN_DDP = {"kind": "mean_loss", "plan": "uneven", "precision": "fp32", "plain_ddp": True}
SCRIPTS = {**PLANS, "uneven": {0: (12, 4, 8)}}
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-3}  # bf16: each rank's own gradient sums are rounded
REPLICA_TOLERANCE = 1e-6


def case_name(case: dict) -> str:
    return "-".join(case[k] for k in ("plan", "precision", "kind"))


def _arguments(case: dict, output_dir: str):
    # One sample an evaluation batch: the Trainer's evaluation loss is the mean of its batches'
    # losses, which for a token-counted loss depends on how the samples are batched.
    return dict(output_dir=output_dir, save_strategy="no", eval_strategy="steps", eval_steps=EVAL_STEPS,
                per_device_eval_batch_size=1, bf16=case["precision"] == "bf16", lr_scheduler_type="linear",
                include_num_input_tokens_seen="non_padding")


def hf_loop(config: dict) -> dict:
    import hetero_ray.train
    from hetero_ray.train.huggingface import RayTrainReportCallback

    case = config["case"]
    args = training_args(**_arguments(case, config["output_dir"]))
    trainer = hetero_ray.train.prepare_trainer(transformers.Trainer(
        model=make_model(case["kind"]), args=args, train_dataset=make_dataset(case["kind"], NUM_SAMPLES),
        eval_dataset=make_dataset(case["kind"], EVAL_SAMPLES, seed=1), callbacks=[RayTrainReportCallback()]))
    trainer.train()
    return {"params": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "lr": trainer.optimizer.param_groups[0]["lr"], "scheduler_epoch": trainer.lr_scheduler.last_epoch,
            "evaluations": [log["eval_loss"] for log in trainer.state.log_history if "eval_loss" in log],
            "tokens_seen": trainer.state.num_input_tokens_seen}


def plain_ddp_loop(config: dict) -> dict:
    """The Trainer with its own DDP on hetero_ray's plan-following loader, unweighted."""
    import torch

    import hetero_ray.train

    case = config["case"]
    dataset = make_dataset(case["kind"], NUM_SAMPLES)

    class PlainTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            return hetero_ray.train.prepare_data_loader(torch.utils.data.DataLoader(
                dataset, batch_size=GLOBAL_BATCH // NUM_WORKERS, shuffle=True,
                collate_fn=transformers.default_data_collator))

    trainer = PlainTrainer(model=make_model(case["kind"]), args=training_args(config["output_dir"], save_strategy="no"),
                           train_dataset=dataset)
    trainer.train()
    return {"params": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}


def _run_case(case: dict, rank: int, case_dir: str) -> dict:
    result, store, _ = run_in_session(
        plain_ddp_loop if case.get("plain_ddp") else hf_loop, {"case": case, "output_dir": os.path.join(case_dir, f"rank{rank}")}, rank=rank,
        num_workers=NUM_WORKERS, global_batch_size=GLOBAL_BATCH, planner=ScriptedPlanner(SCRIPTS[case["plan"]]),
        storage=os.path.join(case_dir, "storage"), seed=SEED)
    return {**result, "sample_ids": [(r["epoch"], r["sample_indices"]) for r in store.sample_ids]}


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("promise_matrix_hf")
    return run_cases_on_ranks(_run_case, [*CASES, PLAIN_DDP], case_name, NUM_WORKERS, str(out_dir))


def _largest(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_every_rank_is_one_trainer_on_one_device(per_rank, case, tmp_path):
    name = case_name(case)
    results = [ranks[name] for ranks in per_rank]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
    arguments = _arguments(case, str(tmp_path))
    del arguments["output_dir"]
    reference = one_device_trainer(case["kind"], NUM_SAMPLES, GLOBAL_BATCH,
                                   eval_dataset=make_dataset(case["kind"], EVAL_SAMPLES, seed=1), **arguments)
    want = {k: v.detach() for k, v in reference.model.state_dict().items()}
    want_evaluations = [log["eval_loss"] for log in reference.state.log_history if "eval_loss" in log]
    tolerance = TOLERANCE[case["precision"]]
    print(f"{name}: weights {max(_largest(r['params'], want) for r in results):.2e}, evaluations "
          f"{max(max(abs(a - b) for a, b in zip(r['evaluations'], want_evaluations)) for r in results):.2e}")
    for rank, result in enumerate(results):
        assert _largest(result["params"], want) < tolerance, f"rank {rank}: weights"
        assert _largest(result["params"], results[0]["params"]) < REPLICA_TOLERANCE, f"rank {rank}: replicas"
        assert result["lr"] == pytest.approx(reference.optimizer.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
        assert result["scheduler_epoch"] == reference.lr_scheduler.last_epoch
        assert result["tokens_seen"] == reference.state.num_input_tokens_seen, f"rank {rank}: the Trainer's count"
        assert len(result["evaluations"]) == len(want_evaluations) > 0
        if case["kind"] != "token_loss":
            assert max(abs(a - b) for a, b in zip(result["evaluations"], want_evaluations)) < tolerance * 10, \
                f"rank {rank}: evaluations {result['evaluations']} vs {want_evaluations}"
    seen = collections.defaultdict(list)
    for result in results:
        for epoch, indices in result["sample_ids"]:
            seen[epoch].extend(indices)
    assert sorted(seen) == list(range(EPOCHS))
    assert all(sorted(indices) == list(range(NUM_SAMPLES)) for indices in seen.values())


def test_a_token_counted_evaluation_does_not_depend_on_the_plan(per_rank):
    """The Trainer's distributed evaluation of a token-counted loss weighs each step's samples
    by their tokens across the ranks, one device's by batch: the two differ by design, even
    on equal shares. What must hold is that the plan — a change, a rank left out while it
    evaluates — does not move it: the fp32 cases of that kind evaluate alike."""
    runs = {name: [ranks[name]["evaluations"] for ranks in per_rank] for name in
            (case_name(c) for c in CASES if c["kind"] == "token_loss" and c["precision"] == "fp32")}
    assert len(runs) >= 2
    first = next(iter(runs.values()))[0]
    for name, evaluations in runs.items():
        for rank, values in enumerate(evaluations):
            assert max(abs(a - b) for a, b in zip(values, first)) < 1e-5, f"{name}, rank {rank}"


def test_without_the_weighting_the_same_run_does_not_match(per_rank):
    """The Trainer's own DDP averages the ranks' local means with equal weights. (A loss
    the Trainer counts in tokens across ranks would come out right that way: the Trainer
    scales it for DDP's equal average itself, which is why hetero_ray rescales it.)"""
    results = [ranks[case_name(PLAIN_DDP)] for ranks in per_rank]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result.get('error')}"
    reference = one_device_trainer(PLAIN_DDP["kind"], NUM_SAMPLES, GLOBAL_BATCH)
    want = {k: v.detach() for k, v in reference.model.state_dict().items()}
    worst = _largest(results[0]["params"], want)
    print(f"equal-weight DDP over shares 12/4/8 vs one device: largest weight difference {worst:.2e}")
    assert worst > 20 * TOLERANCE["fp32"], f"equal-weight DDP over unequal shares matched one device ({worst:g})"
