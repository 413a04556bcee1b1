"""What prepare_data_loader makes of what it is given (no Ray): a torch DataLoader's
options, the loaders it refuses and why, evaluation loaders (every sample once across
ranks, DistributedSampler's split without its padding), the look-ahead the ranks agree
on, and a peeked step that is handed out again."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, WeightedRandomSampler

from hetero_ray.errors import UserError
from hetero_ray.training.data import loader_door
from hetero_ray.training.data.evaluation_loader import EvaluationLoader, RankShard
from hetero_ray.training.data.loader import lookahead_steps
from hetero_ray.training.rank.session import LoopParts

OPTIONS = dict(loader_door.DATA_OPTION_DEFAULTS)


def _session(rank=0, num_workers=2, global_batch_size=8, loader=None):
    said = []
    return SimpleNamespace(
        parts=LoopParts(loader=loader), said=said, log=said.append,
        identity=SimpleNamespace(rank=rank, num_workers=num_workers, device=torch.device("cpu")),
        settings=SimpleNamespace(global_batch_size=global_batch_size, seed=0))


def _data(n=20):
    return TensorDataset(torch.arange(n))


def _collate(batch):
    return torch.stack([sample[0] for sample in batch])


def _init(worker_id):
    pass


def test_a_dataloader_gives_its_dataset_and_options(monkeypatch):
    made = {}
    monkeypatch.setattr(loader_door, "make_loader", lambda session, data, **kw: made.update(data=data, **kw))
    dataset = _data()
    session = _session(num_workers=2, global_batch_size=8)
    source = DataLoader(dataset, batch_size=4, shuffle=False, collate_fn=_collate, num_workers=2, pin_memory=True,
                        prefetch_factor=3, worker_init_fn=_init, drop_last=True)

    loader_door.prepare(session, source, OPTIONS, move_to_device=False, evaluation=None)

    assert made == dict(data=dataset, collate_fn=_collate, num_workers=2, pin_memory=True, prefetch_factor=3,
                        shuffle=False, drop_last=True, worker_init_fn=_init, move_to_device=False)
    assert session.said == ["prepare_data_loader: the DataLoader's batch_size 4 per worker × 2 workers is "
                            "HeteroConfig.global_batch_size 8; each rank takes its share of every global batch, "
                            "sized to its device's speed"]


def test_a_shuffling_dataloader_shuffles_and_a_dataset_shuffles_by_default(monkeypatch):
    made = []
    monkeypatch.setattr(loader_door, "make_loader", lambda session, data, **kw: made.append(kw["shuffle"]))
    loader_door.prepare(_session(), DataLoader(_data(), batch_size=4, shuffle=True), OPTIONS, move_to_device=True,
                        evaluation=False)
    loader_door.prepare(_session(), DataLoader(_data(), sampler=DistributedSampler(_data(), 2, 0, shuffle=False),
                                               batch_size=4), OPTIONS, move_to_device=True, evaluation=False)
    loader_door.prepare(_session(), _data(), OPTIONS, move_to_device=True, evaluation=False)
    assert made == [True, False, True]


def test_a_batch_size_that_is_not_the_global_batch_is_a_warning_naming_the_setting(monkeypatch, caplog):
    monkeypatch.setattr(loader_door, "make_loader", lambda session, data, **kw: None)
    with caplog.at_level(logging.WARNING, logger="hetero_ray.worker"):
        loader_door.prepare(_session(num_workers=3, global_batch_size=32), DataLoader(_data(), batch_size=16),
                            OPTIONS, move_to_device=True, evaluation=None)
    assert "batch_size 16 per worker × 3 workers = 48, but HeteroConfig.global_batch_size is 32" in caplog.text
    assert "set HeteroConfig(global_batch_size=48)" in caplog.text


@pytest.mark.parametrize("make, options, message", [
    (lambda: DataLoader(_data(), batch_size=4), dict(num_workers=2, shuffle=True),
     r"prepare_data_loader\(DataLoader, num_workers=..., shuffle=...\): with a DataLoader these come from the "
     r"DataLoader itself; set them there"),
    (lambda: DataLoader(_data(), batch_size=4, sampler=WeightedRandomSampler([1.0] * 20, 20)), {},
     "cannot follow the DataLoader's WeightedRandomSampler"),
    (lambda: DataLoader(_data(), batch_size=None), {}, "needs a DataLoader with a batch_size"),
    (lambda: _data(), dict(shuffle=True), None),
], ids=["options-beside-it", "own-sampler", "no-batch-size", "dataset-with-options-is-fine"])
def test_what_a_dataloader_cannot_be_followed_in_is_refused(monkeypatch, make, options, message):
    monkeypatch.setattr(loader_door, "make_loader", lambda session, data, **kw: "made")
    call = lambda: loader_door.prepare(_session(), make(), {**OPTIONS, **options}, move_to_device=True,  # noqa: E731
                                       evaluation=None)
    if message is None:
        assert call() == "made"
        return
    with pytest.raises(UserError, match=message):
        call()


class _TrainingLoader:
    """The training loader as an evaluation loader sees it: asked to bring a rank left out
    level with rank 0 (a collective in a run; counted here) before each evaluation."""

    def __init__(self):
        self.copies_asked = 0

    def copy_state_to_left_out_ranks(self) -> None:
        self.copies_asked += 1


def test_the_second_loader_evaluates_and_says_so():
    training = _TrainingLoader()
    session = _session(rank=1, num_workers=2, loader=training)
    loader = loader_door.prepare(session, DataLoader(_data(10), batch_size=2), OPTIONS, move_to_device=True,
                                 evaluation=None)
    assert isinstance(loader, EvaluationLoader)
    assert [batch[0].tolist() for batch in loader] == [[1, 3], [5, 7], [9]]
    assert training.copies_asked == 1  # before the evaluation, not per batch
    assert len(loader) == 3
    assert session.said and "evaluation loader" in session.said[0]
    with pytest.raises(UserError, match=r"evaluation=False\) was called twice"):
        loader_door.prepare(session, _data(10), OPTIONS, move_to_device=True, evaluation=False)


def test_an_evaluation_loader_from_a_dataset_batches_an_equal_share_in_order():
    loader = loader_door.prepare(_session(rank=0, num_workers=3, global_batch_size=8), _data(10), OPTIONS,
                                 move_to_device=False, evaluation=True)
    assert [batch[0].tolist() for batch in loader] == [[0, 3, 6], [9]]


@pytest.mark.parametrize("num_samples, num_workers", [(20, 2), (21, 4), (3, 4), (64, 3)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_rank_shards_are_distributed_samplers_split_without_its_padding(num_samples, num_workers, shuffle):
    dataset = _data(num_samples)
    taken = []
    for rank in range(num_workers):
        shard = RankShard(num_samples, rank, num_workers, shuffle=shuffle, seed=0)
        reference = DistributedSampler(dataset, num_workers, rank, shuffle=shuffle, seed=0)
        for sampler in (shard, reference):
            sampler.set_epoch(3)
        ours, theirs = list(shard), list(reference)
        assert theirs[:len(ours)] == ours and len(ours) == len(shard)
        assert len(theirs) - len(ours) <= 1  # the padding, which would count samples twice
        taken += ours
    assert sorted(taken) == list(range(num_samples))


@pytest.mark.parametrize("num_workers, prefetch_factor, steps", [(0, None, 0), (2, None, 4), (3, 1, 3)])
def test_lookahead_is_the_batches_a_dataloader_keeps_in_flight(num_workers, prefetch_factor, steps):
    assert lookahead_steps(num_workers, prefetch_factor) == steps
