"""A Hugging Face ``transformers.Trainer`` on hetero_ray: a tiny GPT-2, built from a config
(nothing downloaded), learns generated sentences character by character; each worker
trains on a share of every global batch that follows its speed.

    pip install '.[hf]'                                          # in the checkout: transformers and accelerate
    python examples/hf_trainer.py                                # a local Ray, 3 workers
    python examples/hf_trainer.py --emulate-speeds 1,0.5,0.25    # one fast, two slow workers
    ray job submit --working-dir . -- python examples/hf_trainer.py
    # on a cluster add --storage-path /shared/runs: every node sees it (./runs: the job's working-dir copy)

Coming from Ray Train, the loop is Ray Train's ``prepare_trainer`` recipe with one import
changed (``hetero_ray.train.huggingface``) and ``HeteroTrainer`` for ``TorchTrainer``.
"""
import argparse
import os
import random
import tempfile
import time

import ray.train
import torch
import transformers

import hetero_ray.train
from hetero_ray import HeteroConfig, HeteroTrainer, ProfileModel
from hetero_ray.train.huggingface import RayTrainReportCallback

try:  # from the repository root, under `ray job submit --working-dir .`, and in the tests
    from examples.own_model import placement
except ModuleNotFoundError:  # `python examples/hf_trainer.py`: own_model.py sits beside it
    from own_model import placement

SUBJECTS = ("the cat", "a dog", "my friend", "the robot", "our teacher")
VERBS = ("sees", "likes", "finds", "paints", "follows")
OBJECTS = ("the moon", "a red ball", "the old tree", "some bread", "the river")
ALPHABET = sorted(set("".join(SUBJECTS + VERBS + OBJECTS) + " ."))
PAD = len(ALPHABET)  # one token past the characters; never a label
MAX_LENGTH = 40  # the longest sentence fits


class Sentences(torch.utils.data.Dataset):
    """Seeded random sentences from a tiny grammar, one character a token, padded to
    MAX_LENGTH; the padding is masked out of the attention and the loss. The same on every
    worker for a seed (each picks its share by index)."""

    def __init__(self, num_samples: int, seed: int = 0):
        pick = random.Random(seed).choice
        self.texts = [f"{pick(SUBJECTS)} {pick(VERBS)} {pick(OBJECTS)}." for _ in range(num_samples)]

    def __len__(self): return len(self.texts)

    def __getitem__(self, i):
        ids = [ALPHABET.index(c) for c in self.texts[i]]
        pad = MAX_LENGTH - len(ids)
        input_ids = torch.tensor(ids + [PAD] * pad)
        labels = torch.tensor(ids + [-100] * pad)  # -100: not a token the loss counts
        return {"input_ids": input_ids, "attention_mask": (labels != -100).long(), "labels": labels}


def make_model() -> transformers.GPT2LMHeadModel:
    config = transformers.GPT2Config(vocab_size=PAD + 1, n_positions=MAX_LENGTH, n_embd=64, n_layer=2, n_head=4,
                                     bos_token_id=PAD, eos_token_id=PAD)
    return transformers.GPT2LMHeadModel(config)  # random weights: a config, not a download


def sentence_batch(batch_size: int) -> dict:
    return transformers.default_data_collator([Sentences(batch_size, seed=1)[i] for i in range(batch_size)])


def language_model_loss(model, batch) -> torch.Tensor:
    return model(**batch).loss


# How to build the model and a batch of b samples: each node's devices are timed with it
# before the first step (and, under --emulate-speeds, each worker times itself), so the
# first plan already follows the speeds.
PROFILE = ProfileModel(build=make_model, make_batch=sentence_batch, compute_loss=language_model_loss,
                       name="tiny-gpt2")


def train_loop(config: dict) -> None:
    on_cpu = hetero_ray.train.get_device().type == "cpu"  # each rank its own kind under --worker-devices
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),  # rank 0's checkpoints go to the run through the callback
        per_device_train_batch_size=config["per_device_batch_size"],  # what hetero_ray replaces by the plan's share
        num_train_epochs=config["epochs"], learning_rate=config["lr"], warmup_steps=config["warmup_steps"],
        logging_steps=config["logging_steps"], save_strategy="steps", save_steps=config["save_steps"],
        save_total_limit=2, report_to="none", disable_tqdm=True, use_cpu=on_cpu,
        bf16=config["bf16"])
    trainer = transformers.Trainer(model=make_model(), args=args, train_dataset=Sentences(config["num_samples"]),
                                   callbacks=[RayTrainReportCallback()])
    trainer = hetero_ray.train.prepare_trainer(trainer)  # the plan's shares, b_i/B weighting, exactly-once data
    checkpoint = hetero_ray.train.get_checkpoint()  # a restart, or an old --name resumed
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as directory:
        trainer.train(resume_from_checkpoint=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-workers", type=int, default=3, help="training workers (Ray actors), one share each")
    p.add_argument("--global-batch-size", type=int, default=48, help="samples per optimiser step, all workers together")
    p.add_argument("--epochs", type=int, default=3, help="enough to see the loss fall, short enough for a laptop")
    p.add_argument("--num-samples", type=int, default=960, help="dataset size: 20 global steps an epoch at 48")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW (the Trainer's default); depends on the global batch alone")
    p.add_argument("--logging-steps", type=int, default=5, help="the Trainer logs (and hetero_ray reports) every N steps")
    p.add_argument("--save-steps", type=int, default=20, help="a checkpoint in Ray Train's Result every N steps")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPUs with bf16, or recent CPUs)")
    p.add_argument("--emulate-speeds", help="per-worker fraction of real speed, e.g. 1,0.5,0.25 (default: as is)")
    p.add_argument("--storage-path", type=os.path.abspath, default="./runs", help="runs go here (shared on a cluster)")
    p.add_argument("--name", default=time.strftime("hf-%Y%m%d-%H%M%S"), help="run folder; an old one resumes")
    p.add_argument("--use-gpu", action="store_true", help="every worker on a GPU of its own")
    p.add_argument("--worker-devices", help="a device per worker, e.g. gpu,cpu,cpu: GPU and CPU machines in one job "
                                            "(nodes labelled hetero-ray.io/device=gpu|cpu, see cluster_configs/)")
    return p


def main(argv=None) -> ray.train.Result:
    args = make_parser().parse_args(argv)
    where = placement(args)
    num_workers = where["scaling_config"].num_workers
    speeds = tuple(map(float, args.emulate_speeds.split(","))) if args.emulate_speeds else None
    trainer = HeteroTrainer(
        train_loop,
        train_loop_config={"num_samples": args.num_samples, "epochs": args.epochs, "lr": args.lr,
                           "warmup_steps": 5, "logging_steps": args.logging_steps, "save_steps": args.save_steps,
                           "per_device_batch_size": max(1, args.global_batch_size // num_workers), "bf16": args.bf16},
        scaling_config=where["scaling_config"],
        run_config=ray.train.RunConfig(name=args.name, storage_path=args.storage_path),
        hetero_config=HeteroConfig(global_batch_size=args.global_batch_size, emulate_speeds=speeds,
                                   profile_model=PROFILE, worker_devices=where["worker_devices"]))
    result = trainer.fit()
    print(f"run files: {os.path.join(args.storage_path, args.name)}\nfinal metrics: {result.metrics}")
    return result


if __name__ == "__main__":
    main()
