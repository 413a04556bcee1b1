"""Small Hugging Face models and data for the Trainer's tests (nothing downloaded): a
causal LM whose loss the Trainer counts in tokens, a plain torch classifier whose loss is
the local mean, and a BERT classifier whose ``forward`` takes ``**kwargs`` but whose loss is
the plain mean; token sequences of different lengths; and one ``Trainer`` on one device
over hetero_ray's global batches, the reference every run is held to."""

from __future__ import annotations

import os
import tempfile

import torch
import transformers

from hetero_ray.sampler import GlobalSampler
from tests.global_batches import GlobalBatches

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach a hub

VOCAB, SEQ, CLASSES = 32, 12, 4
EPOCHS = 2
SEED = 0


class TokenSequences(torch.utils.data.Dataset):
    """Random token sequences of 3 to SEQ tokens, padded; labels -100 on the padding, so
    the ranks' token counts differ from their sample counts."""

    def __init__(self, num_samples: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (num_samples, SEQ), generator=generator)
        self.lengths = torch.randint(3, SEQ + 1, (num_samples,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        mask = (torch.arange(SEQ) < self.lengths[index]).long()
        ids = self.ids[index]
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


class ClassifiedSequences(TokenSequences):
    """The same sequences, each labelled with one class: its first token mod CLASSES."""

    def __getitem__(self, index: int) -> dict:
        sample = super().__getitem__(index)
        return {**sample, "labels": sample["input_ids"][0] % CLASSES}


class MeanLossClassifier(torch.nn.Module):
    """A plain torch model in a Trainer: its ``forward`` takes no ``**kwargs``, so the
    Trainer counts no items and the loss is the mean over the local batch (the class of a
    sequence is its first token mod 4)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, input_ids, attention_mask, labels):
        mask = attention_mask.unsqueeze(-1).float()
        logits = self.head((self.embed(input_ids) * mask).sum(1) / mask.sum(1))
        return {"loss": torch.nn.functional.cross_entropy(logits, input_ids[:, 0] % CLASSES), "logits": logits}


def make_model(kind: str = "token_loss"):
    """``token_loss``: a GPT-2 causal LM; ``mean_loss``: :class:`MeanLossClassifier`;
    ``kwargs_mean_loss``: a BERT sequence classifier, whose ``forward`` takes ``**kwargs``
    (the Trainer's sign of a loss counted in items) but whose loss is the plain mean."""
    if kind == "mean_loss":
        return MeanLossClassifier()
    if kind == "kwargs_mean_loss":
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=SEQ, num_labels=CLASSES,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        torch.manual_seed(SEED)
        return transformers.BertForSequenceClassification(config)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    torch.manual_seed(SEED)
    return transformers.GPT2LMHeadModel(config)


def make_dataset(kind: str, num_samples: int, seed: int = 0) -> TokenSequences:
    return (ClassifiedSequences if kind == "kwargs_mean_loss" else TokenSequences)(num_samples, seed)


def training_args(output_dir: str, **overrides):
    values = dict(output_dir=output_dir, per_device_train_batch_size=8, num_train_epochs=EPOCHS,
                  optim="sgd", learning_rate=0.5, logging_steps=1, save_strategy="steps", save_steps=3,
                  report_to="none", disable_tqdm=True, seed=SEED, use_cpu=True, dataloader_num_workers=0)
    values.update(overrides)
    return transformers.TrainingArguments(**values)


def one_device_trainer(kind: str, num_samples: int, global_batch_size: int, eval_dataset=None, **args_overrides):
    """One Trainer in this process on the whole global batch of every step, in the order
    of hetero_ray's global sampler, trained: the reference."""
    sampler = GlobalSampler(num_samples, global_batch_size, SEED, False, True)

    dataset = make_dataset(kind, num_samples)

    class OneDeviceTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            return torch.utils.data.DataLoader(dataset, batch_sampler=GlobalBatches(sampler),
                                               collate_fn=transformers.default_data_collator)

    with tempfile.TemporaryDirectory() as directory:
        trainer = OneDeviceTrainer(model=make_model(kind),
                                   args=training_args(directory, **{"save_strategy": "no", **args_overrides}),
                                   train_dataset=dataset, eval_dataset=eval_dataset)
        trainer.train()
    return trainer
