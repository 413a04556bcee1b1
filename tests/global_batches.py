"""The global batches of hetero_ray's global sampler, as a batch sampler for a one-device
reference (a Trainer's DataLoader): each ``iter()`` runs the next epoch's windows."""

from __future__ import annotations

from hetero_ray.sampler import GlobalSampler


class GlobalBatches:
    def __init__(self, sampler: GlobalSampler):
        self.sampler = sampler
        self.epoch = 0

    def __iter__(self):
        permutation = self.sampler.permutation(self.epoch)
        self.epoch += 1
        for step in range(self.sampler.steps_per_epoch):
            begin, stop = self.sampler.window(step)
            yield permutation[begin:stop].tolist()

    def __len__(self):
        return self.sampler.steps_per_epoch
