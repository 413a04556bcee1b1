"""The promise matrix's cases: a user's loop on the public worker-side API, and the same
loop on one device over the same global batches.

Every case runs the loop with everything a loop does besides training switched on at
once — an evaluation in the middle of an epoch and at its end, a checkpoint from every
rank, its own count of the samples it trained on (``len(x)`` of the steps that are not
probes), a learning-rate scheduler stepped each step, SGD with momentum and weight decay
(which move a left-out rank's weights) — under one combination of

    loss       mean over the local batch | token_weighted_loss
    model      with BatchNorm | without
    precision  fp32 | bf16 | fp16 with a GradScaler (an overflow on the ranks in at step 3)
    plan       a change mid-epoch | a rank left out and brought back | a rank left out from
               the first plan | a short last window | shares past the memory cap in
               micro-batches | a rollback to a plan that leaves ranks out | a resume from a
               checkpoint taken while a rank is out

The model is smooth (tanh), so float32 results do not depend on the CPU's kernels, and
the reference is torch's own BatchNorm on the whole global batch.
"""

from __future__ import annotations

import itertools
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

import hetero_ray.train
from hetero_ray.sampler import GlobalSampler
from hetero_ray.training.gradients.precision import Precision

NUM_WORKERS = 3
FEATURES, CLASSES = 6, 3
GLOBAL_BATCH = 12
EPOCHS = 2
SEED = 0
LEARNING_RATE = 0.05
MID_EPOCH_EVALUATION_STEP = 3  # the global step after whose training the loop evaluates (a rank is out there in most plans)
OVERFLOW_STEP = 3  # fp16: one sample of this step's window blows its gradient past fp16's range

LOSSES = ("mean", "token")
MODELS = ("batchnorm", "plain")
PRECISIONS = ("fp32", "bf16", "fp16")
# {first global step: shares, or (shares, probe sizes)}; 5 steps an epoch (60 samples) unless said
PLANS = {
    "change": {0: (4, 4, 4), 2: (6, 2, 4), 7: (2, 5, 5)},
    "out_and_back": {0: (4, 4, 4), 2: (8, 0, 4), 4: (6, 0, 6), 7: (4, 4, 4)},
    "out_from_first": {0: (8, 4, 0), 3: (4, 4, 4), 8: (10, 2, 0)},
    # 51 samples: the 5th window holds 3 (rank 2 out at step 4; rank 0 runs one sample of weight 0 at step 9).
    # Not 2: BatchNorm over 2 samples makes one device's own float rounding 30× larger.
    "short_window": {0: (4, 4, 4), 2: (6, 6, 0), 5: (1, 3, 8)},
    "micro_batches": {0: (8, 2, 2), 3: (2, 8, 2), 6: (2, 2, 8)},  # caps of 5: shares past them are cut
    "rollback": {0: (4, 4, 4), 2: ((12, 0, 0), (0, 2, 3)), 4: (4, 4, 4), 5: ((12, 0, 0), (0, 1, 2))},
    "resume": {0: (4, 4, 4), 2: (8, 0, 4), 6: (4, 4, 4)},  # stopped after epoch 0 (rank 1 out), resumed
}
MEMORY_CAP = 5
NUM_SAMPLES = {"short_window": 51}
DEFAULT_NUM_SAMPLES = 60
EVAL_SAMPLES = 20


def all_cases() -> list[dict]:
    """The full product of the factors (7 × 3 × 2 × 2 = 84 cases)."""
    return [{"loss": loss, "model": model, "precision": precision, "plan": plan}
            for plan, precision, model, loss in itertools.product(PLANS, PRECISIONS, MODELS, LOSSES)]


def case_name(case: dict) -> str:
    return "-".join(case[k] for k in ("plan", "precision", "model", "loss"))


def refused(case: dict) -> bool:
    """token_weighted_loss runs a collective per call, which ranks cut into different
    numbers of micro-batches cannot match: refused at the first step, with a message.
    A BatchNorm model is never cut, so it trains."""
    return case["plan"] == "micro_batches" and case["loss"] == "token" and case["model"] == "plain"


# ---- data and model -------------------------------------------------------------------------

class Samples(torch.utils.data.Dataset):
    """Features, a class, a token count (1–6: the per-token loss) and a loss factor per sample."""

    def __init__(self, num_samples: int, seed: int, boosted: int = -1):
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, FEATURES, generator=generator)
        self.y = torch.randint(0, CLASSES, (num_samples,), generator=generator)
        self.tokens = torch.randint(1, 7, (num_samples,), generator=generator).float()
        self.boost = torch.ones(num_samples)
        if boosted >= 0:
            self.boost[boosted] = 1e8  # fp16: the scaled gradient overflows, the step is skipped

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index], self.tokens[index], self.boost[index]


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(SEED)
    layers = [nn.Linear(FEATURES, 16)]
    if kind == "batchnorm":
        layers.append(nn.BatchNorm1d(16))
    layers += [nn.Tanh(), nn.Linear(16, CLASSES)]
    return nn.Sequential(*layers)


def boosted_sample(case: dict) -> int:
    """fp16: the last sample of the overflow step's window (a probe takes the window's first)."""
    if case["precision"] != "fp16":
        return -1
    num_samples = NUM_SAMPLES.get(case["plan"], DEFAULT_NUM_SAMPLES)
    sampler = GlobalSampler(num_samples, GLOBAL_BATCH, SEED)
    _, stop = sampler.window(OVERFLOW_STEP)
    return int(sampler.permutation(0)[stop - 1])


def step_loss(case: dict, logits, y, tokens, boost, token_weighted):
    per_sample = nn.functional.cross_entropy(logits.float(), y, reduction="none") * boost
    if case["loss"] == "mean":
        return per_sample.mean()
    return token_weighted((per_sample * tokens).sum(), tokens.sum())


def make_training(case: dict, model: nn.Module):
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    precision = Precision.named(case["precision"], torch.device("cpu"))
    # The scale grows every 2 steps (so a rank left out would drift), from 2**8: far enough below
    # fp16's range that only the boosted sample overflows. Near the edge a rank's own pass
    # can overflow where one device's does not (its per-sample gradients are B / b_i larger
    # before the hook weights them); every rank still skips together (CHANGELOG, docs/api.md).
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2) if case["precision"] == "fp16" \
        else None
    return optimizer, scheduler, precision, scaler


def state_of(model: nn.Module, optimizer, scheduler, scaler) -> dict:
    """What the comparison reads on every rank and on the one device."""
    module = getattr(model, "module", model)
    return {
        "params": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "momentum": [optimizer.state[p]["momentum_buffer"].clone() if "momentum_buffer" in optimizer.state[p]
                     else None for p in module.parameters()],
        "lr": optimizer.param_groups[0]["lr"],
        "scheduler_epoch": scheduler.last_epoch,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }


# ---- the user's loop, on every rank --------------------------------------------------------

def user_loop(config: dict) -> dict:
    case = config["case"]
    num_samples = NUM_SAMPLES.get(case["plan"], DEFAULT_NUM_SAMPLES)
    model = hetero_ray.train.prepare_model(make_model(case["model"]))
    loader = hetero_ray.train.prepare_data_loader(Samples(num_samples, SEED, boosted_sample(case)))
    eval_loader = hetero_ray.train.prepare_data_loader(Samples(EVAL_SAMPLES, SEED + 1), evaluation=True)
    optimizer, scheduler, precision, scaler = make_training(case, model)
    checkpoint = hetero_ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            load_checkpoint(os.path.join(directory, "model.pt"), model, optimizer, scheduler, scaler)
    evaluations, counted = [], torch.zeros(1, dtype=torch.float64)
    for epoch in range(loader.epoch, config.get("stop_after_epoch", EPOCHS - 1) + 1):
        for x, y, tokens, boost in loader:
            pieces = hetero_ray.train.micro_batches((x, y, tokens, boost)) if case["plan"] == "micro_batches" \
                else [(x, y, tokens, boost)]
            for mx, my, mt, mb in pieces:
                with precision.autocast():
                    loss = step_loss(case, model(mx), my, mt, mb, hetero_ray.train.token_weighted_loss)
                (loss if scaler is None else scaler.scale(loss)).backward()
            _step(optimizer, scheduler, scaler)
            if not hetero_ray.train.is_probe_step():
                counted += len(x)
            if loader.position.global_step == MID_EPOCH_EVALUATION_STEP and not evaluations:  # the step in hand
                evaluations.append(evaluate(model, eval_loader))
        evaluations.append(evaluate(model, eval_loader))
        with tempfile.TemporaryDirectory() as directory:  # from every rank, as docs/api.md allows
            save_checkpoint(os.path.join(directory, "model.pt"), model, optimizer, scheduler, scaler)
            hetero_ray.train.report({"epoch": epoch}, checkpoint=_checkpoint(directory))
    dist.all_reduce(counted)
    return {**state_of(model, optimizer, scheduler, scaler), "evaluations": evaluations,
            "counted": int(counted.item())}


def _step(optimizer, scheduler, scaler) -> None:
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad()
    scheduler.step()


def _checkpoint(directory: str):
    import ray.train

    return ray.train.Checkpoint.from_directory(directory)


def save_checkpoint(path: str, model, optimizer, scheduler, scaler) -> None:
    torch.save({"model": getattr(model, "module", model).state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler else None}, path)


def load_checkpoint(path: str, model, optimizer, scheduler, scaler) -> None:
    saved = torch.load(path, weights_only=False)
    getattr(model, "module", model).load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if scaler is not None:
        scaler.load_state_dict(saved["scaler"])


@torch.no_grad()
def evaluate(model, eval_loader) -> list[float]:
    """Loss and accuracy over every evaluation sample once: each rank its share, summed."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    for x, y, _, _ in eval_loader:
        logits = model(x)
        sums += torch.tensor([nn.functional.cross_entropy(logits, y, reduction="sum").item(),
                              (logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    model.train()
    dist.all_reduce(sums)
    return [sums[0].item() / sums[2].item(), sums[1].item() / sums[2].item()]


# ---- one device ----------------------------------------------------------------------------

def one_device(case: dict) -> dict:
    """The same loop on one process over the same global batches, in the same order."""
    num_samples = NUM_SAMPLES.get(case["plan"], DEFAULT_NUM_SAMPLES)
    data = Samples(num_samples, SEED, boosted_sample(case))
    eval_data = Samples(EVAL_SAMPLES, SEED + 1)
    model = make_model(case["model"])
    optimizer, scheduler, precision, scaler = make_training(case, model)
    sampler = GlobalSampler(num_samples, GLOBAL_BATCH, SEED)
    evaluations, counted, global_step = [], 0, 0

    def token_weighted(loss_sum, num_tokens):
        return loss_sum / num_tokens

    def evaluate_here() -> list[float]:
        model.eval()
        with torch.no_grad():
            logits = model(eval_data.x)
            result = [nn.functional.cross_entropy(logits, eval_data.y).item(),
                      (logits.argmax(1) == eval_data.y).double().mean().item()]
        model.train()
        return result

    for epoch in range(EPOCHS):
        order = sampler.permutation(epoch)
        for step in range(sampler.steps_per_epoch):
            start, stop = sampler.window(step)
            x, y, tokens, boost = data[order[start:stop]]
            with precision.autocast():
                loss = step_loss(case, model(x), y, tokens, boost, token_weighted)
            (loss if scaler is None else scaler.scale(loss)).backward()
            _step(optimizer, scheduler, scaler)
            counted += len(x)
            global_step += 1
            if global_step == MID_EPOCH_EVALUATION_STEP + 1 and not evaluations:
                evaluations.append(evaluate_here())
        evaluations.append(evaluate_here())
    return {**state_of(model, optimizer, scheduler, scaler), "evaluations": evaluations, "counted": counted}
