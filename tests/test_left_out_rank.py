"""A rank left out, the parts that need no process group: its BatchNorm, which ranks fall
behind, and the training state (optimisers, schedulers, scalers) they receive from rank 0."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch
from torch import nn

from hetero_ray.errors import UserError

from hetero_ray.training.gradients.batchnorm import convert_batchnorm
from hetero_ray.training.gradients.weighting import WeightedAllReduceState
from hetero_ray.training.rank.replica_state import StaleRanks, find_training_state


def test_a_rank_left_out_normalises_its_probe_with_its_running_statistics_and_changes_nothing():
    state = WeightedAllReduceState(num_workers=3)
    layer = convert_batchnorm(nn.BatchNorm1d(4), state)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        layer.running_var.copy_(torch.tensor([4.0, 1.0, 1.0, 0.25]))
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    state.use_group(None, 1, takes_part=False)
    state.weight = 0.0
    x = torch.randn(1, 4)  # one sample: a BatchNorm in training would refuse it
    y = layer.train()(x)
    expected = (x - layer.running_mean) / torch.sqrt(layer.running_var + layer.eps)
    assert torch.allclose(y, expected, atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())  # no statistics, no count


def test_stale_ranks_are_those_left_out_since_their_last_copy():
    stale = StaleRanks()
    stale.note_plan((4, 4, 4))
    assert not stale
    stale.note_plan((8, 0, 4))
    stale.note_plan((12, 0, 0))
    assert stale.ranks == {1, 2}
    stale.copied()
    assert not stale  # a copy brings every rank level, also one still out (it falls behind at its next step)
    stale.note_plan((12, 0, 0))
    assert stale.ranks == {1, 2}


def test_the_training_state_is_found_by_type_and_keyed_alike_on_every_rank():
    model, other = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2)
    head = torch.optim.Adam(model[1].parameters())
    body = torch.optim.SGD(model[0].parameters(), lr=0.1)
    unrelated = torch.optim.SGD(other.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(body, step_size=2)
    unrelated_schedule = torch.optim.lr_scheduler.StepLR(unrelated, step_size=2)
    scaler, disabled = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu", enabled=False)
    found = find_training_state(model)
    # an optimiser by the positions of its parameters in the model, whatever order it was made in
    assert found.optimizers == {((0, 1),): body, ((2, 3),): head}
    assert found.schedulers == {(((0, 1),), "StepLR", 0): schedule}
    assert list(found.scalers.values()) == [scaler]
    del unrelated_schedule, disabled


def test_state_that_died_while_the_heap_was_frozen_is_not_found():
    """A loop that replaces its optimiser and scaler (an epoch's start froze the old ones
    alive; they died in cycles since, which only a full walk frees): only the new ones."""
    from hetero_ray.training.rank import heap

    model = nn.Linear(2, 2)
    old_optimizer, old_scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    old_optimizer.me, old_scaler.me = old_optimizer, old_scaler  # cycles: only the collector frees them
    heap._calls = itertools.count(1)  # an epoch start that walks only what is not frozen
    try:
        heap.freeze_heap()
        del old_optimizer, old_scaler
        optimizer, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
        found = find_training_state(model)
        assert list(found.optimizers.values()) == [optimizer] and list(found.scalers.values()) == [scaler]
        assert gc.get_freeze_count() > 0, "the frozen heap stays frozen"
    finally:
        gc.unfreeze()


def test_after_the_first_lookup_a_lookup_lists_only_what_is_not_frozen(monkeypatch):
    """The first lookup after a full walk lists the heap whole and remembers what it froze
    again; the next epoch start adds what it freezes; a lookup then finds all of it, and
    what was made since, without unfreezing the heap (listing it whole cost ~0.3 s a rank
    at every copy)."""
    from hetero_ray.training.rank import heap

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    body = torch.optim.SGD(model[0].parameters(), lr=0.1)
    schedule, scaler = torch.optim.lr_scheduler.StepLR(body, step_size=2), torch.amp.GradScaler("cpu")
    heap._calls = itertools.count()
    try:
        heap.freeze_heap()  # the first epoch's start: a full walk
        assert list(find_training_state(model).optimizers.values()) == [body]
        head = torch.optim.Adam(model[1].parameters())  # made during the first epoch
        heap.freeze_heap()  # the next epoch's start freezes it
        tail = torch.optim.SGD(model[2].parameters(), lr=0.1)  # made during the next epoch
        unfreezes = []
        monkeypatch.setattr(gc, "unfreeze", lambda: unfreezes.append(1))
        found = find_training_state(model)
        assert found.optimizers == {((0, 1),): body, ((2, 3),): head, ((4, 5),): tail}
        assert list(found.schedulers.values()) == [schedule] and list(found.scalers.values()) == [scaler]
        assert unfreezes == [], "the lookup unfroze the heap to list it whole"
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_state_frozen_by_someone_else_is_still_found():
    """A gc.freeze() the heap module did not make (a library's) freezes what the module never
    saw: the lookup notices and lists the whole heap."""
    from hetero_ray.training.rank import heap

    model = nn.Linear(2, 2)
    heap._calls = itertools.count()
    try:
        heap.freeze_heap()
        find_training_state(model)  # the lookup that remembers what is frozen
        optimizer, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
        gc.freeze()  # not the module's
        found = find_training_state(model)
        assert list(found.optimizers.values()) == [optimizer] and list(found.scalers.values()) == [scaler]
        assert gc.get_freeze_count() > 0, "the frozen heap stays frozen"
    finally:
        gc.unfreeze()


def test_a_rank_holding_other_optimisers_than_rank_0_is_told_so():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sent = find_training_state(model).state_dicts()
    sent["optimizers"] = {}
    with pytest.raises(UserError, match="rank 1 holds other optimizers than rank 0"):
        find_training_state(model).load(sent, rank=1)
    del optimizer


def test_two_live_scalers_are_both_found():
    """Two of a kind make the search collect the whole heap first; if both are alive, both are kept."""
    model = nn.Linear(2, 2)
    optimizer, first, second = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu"), \
        torch.amp.GradScaler("cpu")
    found = find_training_state(model)
    assert list(found.optimizers.values()) == [optimizer]
    assert {id(s) for s in found.scalers.values()} == {id(first), id(second)}
