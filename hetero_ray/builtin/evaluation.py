"""End-of-epoch evaluation and the epoch's training loss, agreed across ranks.

Each rank evaluates a contiguous piece of the held-out split sized by the plan's shares,
so a slow rank is not asked for as much as a fast one; one SUM all-reduce of
``[eval loss sum, correct, count, train loss sum, train samples]`` gives every rank the
cluster totals.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from hetero_ray.builtin.models import eval_batch_stats
from hetero_ray.planning.plan import Plan, largest_remainder

EVAL_BATCH_SIZE = 256  # memory bound for evaluation only; does not affect results


@torch.no_grad()
def evaluate(model, eval_split, plan: Plan, rank: int, device: torch.device,
             train_loss_sum: float, train_samples: int, is_text: bool) -> dict:
    sizes = largest_remainder(plan.local_batch_sizes, len(eval_split))
    start = sum(sizes[:rank])
    indices = torch.arange(start, start + sizes[rank])
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for chunk in indices.split(EVAL_BATCH_SIZE):
        inputs, targets = eval_split.batch(chunk)
        stats = eval_batch_stats(model(inputs.to(device)), targets.to(device))
        loss_sum += stats["loss_sum"]
        correct += stats["correct"]
        count += stats["count"]
    model.train(was_training)
    totals = torch.tensor([loss_sum, correct, count, train_loss_sum, train_samples],
                          dtype=torch.float64, device=device)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    loss_sum, correct, count, train_loss_sum, train_samples = totals.tolist()
    eval_loss = loss_sum / count if count else float("nan")
    if is_text:
        metric_name, metric = "perplexity", math.exp(min(eval_loss, 50.0))
    else:
        metric_name, metric = "accuracy", correct / count if count else float("nan")
    return {
        "eval_loss": eval_loss,
        "eval_metric": metric,
        "eval_metric_name": metric_name,
        "train_loss": train_loss_sum / train_samples if train_samples else float("nan"),
        "samples": int(train_samples),
    }
