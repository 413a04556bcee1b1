"""A small LightningModule with BatchNorm and a smooth activation (tanh: one device's math
is compared at 1e-5 in float32, which a ReLU's kink would not allow on every CPU: its
result moves with the CPU's kernels), its data (nothing downloaded), and one Lightning Trainer on one device over
hetero_ray's global batches: the reference every run is held to."""

from __future__ import annotations

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

from hetero_ray.sampler import GlobalSampler
from tests.global_batches import GlobalBatches

FEATURES, HIDDEN, CLASSES = 8, 16, 3
SEED = 0
EPOCHS = 2


def make_dataset(num_samples: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, FEATURES, generator=generator)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 1).long()
    return TensorDataset(x, y)


class BatchNormClassifier(lightning.LightningModule):
    """Linear → BatchNorm → tanh → Linear, SGD with momentum and a step scheduler. Logs the
    training loss (sync_dist, on the progress bar, per step and per epoch) and the
    validation and test losses; keeps every logged training loss in ``logged_losses``."""

    def __init__(self, num_samples: int = 66, eval_samples: int = 24, batch_size: int = 8):
        super().__init__()
        torch.manual_seed(SEED)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.BatchNorm1d(HIDDEN),
                                       torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))
        self.num_samples, self.eval_samples, self.batch_size = num_samples, eval_samples, batch_size
        self.logged_losses: list[float] = []
        self.val_losses: list[float] = []  # each epoch's validation during fit

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)  # the mean over the local batch
        self.log("loss", loss, sync_dist=True, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.logged_losses.append(float(self.trainer.callback_metrics["loss_step"]))

    def on_train_epoch_end(self):
        # After the epoch's validation (Lightning validates before the epoch's end hooks).
        self.val_losses.append(float(self.trainer.callback_metrics["val_loss"]))

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.cross_entropy(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.3, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]

    def train_dataloader(self):
        # The per-worker batch size of a Ray Train job; hetero_ray takes shares of the global batch.
        return DataLoader(make_dataset(self.num_samples), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(make_dataset(self.eval_samples, seed=1), batch_size=self.batch_size)

    def test_dataloader(self):
        return self.val_dataloader()


def one_device_trainer(num_samples: int, global_batch_size: int, epochs: int = EPOCHS, precision: str = "32-true",
                       eval_samples: int = 24):
    """One Trainer on one device on the whole global batch of every step, in the order of
    hetero_ray's global sampler, fitted: the reference (returns the module)."""
    sampler = GlobalSampler(num_samples, global_batch_size, SEED, False, True)

    batches = GlobalBatches(sampler)

    class OneDevice(BatchNormClassifier):
        def train_dataloader(self):
            return DataLoader(make_dataset(num_samples), batch_sampler=batches)

    module = OneDevice(num_samples, eval_samples)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, precision=precision,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module)
    module.loss_epoch = float(trainer.callback_metrics["loss_epoch"])  # the last epoch's, before test() resets it
    module.test_loss = trainer.test(module, verbose=False)[0]["test_loss"]
    return module
