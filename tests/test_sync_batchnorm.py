"""HeteroSyncBatchNorm on a real 3-process gloo group: the same math as one device.

Three processes with local batches 7/3/2 (or 5/0/3 with a dummy sample on rank 1), DDP
and the weighted hook must give the gradients, the loss and the running statistics that
one process computes with torch's own BatchNorm on the whole global batch; torch's local
BatchNorm under the same hook must not. All distributed scenarios run in one spawn (a
spawn costs seconds here); the tests below compare its results with one device.
"""

import inspect
import logging
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hetero_ray.training.gradients.batchnorm import HeteroSyncBatchNorm, convert_batchnorm, has_batchnorm
from hetero_ray.training.gradients.model_prep import prepare_model
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, rank_weight, weighted_allreduce_hook
from hetero_ray.training.rank.current_step import CurrentStep
from hetero_ray.training.rank.session import LoopParts
from tests.batchnorm_cases import (
    CONV_INPUT_SHAPE, LEARNING_RATE, MODELS, make_batches, make_conv_model, perturb_batchnorm, statistics,
    train_on_one_device,
)
from tests.helpers import on_gloo_ranks

WORLD_SIZE = 3
LOCAL_BATCH_SIZES = [7, 3, 2]
ZERO_PIECE_SIZES = [5, 0, 3]  # rank 1's piece of a short window is empty: it runs one dummy sample
STEP_SPLITS = [[7, 3, 2], [2, 6, 4], [4, 0, 8], [3, 5, 4]]  # a new split each step, as a rebalance makes

# float32 throughout: the tolerances of tests/test_gradients.py.
RTOL, ATOL = 1e-5, 1e-6


def _rank_piece(rank: int, split: list[int]) -> tuple[slice, float]:
    """This rank's samples of the global batch and its w_i; a dummy sample when the piece is empty."""
    size = split[rank]
    if size == 0:
        return slice(0, 1), 0.0
    start = sum(split[:rank])
    return slice(start, start + size), rank_weight(size, sum(split))


# --- three ranks: DDP, the weighted hook, and (converted) BatchNorm -------------------

def train_on_ranks(rank: int, model_name: str, splits: list[list[int]], convert: bool = True,
                   lr: float = 0.0) -> dict:
    make_model, input_shape = MODELS[model_name]
    state = WeightedAllReduceState()
    model = make_model()
    if convert:
        model = convert_batchnorm(model, state)
    ddp_model = DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets, as with a real model
    ddp_model.register_comm_hook(state, weighted_allreduce_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    record = {"grads": [], "losses": []}
    for split, (inputs, targets) in zip(splits, make_batches(input_shape, splits)):
        piece, state.weight = _rank_piece(rank, split)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp_model(inputs[piece]), targets[piece])
        loss.backward()
        # The global batch's loss: L = Σ_i w_i · L_i.
        global_loss = loss.detach() * state.weight
        dist.all_reduce(global_loss)
        record["grads"].append([p.grad.clone() for p in model.parameters()])
        record["losses"].append(global_loss)
        optimizer.step()
    record["params"] = [p.detach().clone() for p in model.parameters()]
    record["statistics"] = statistics(model)
    return record


# --- one layer on its own, for every input rank ---------------------------------------

LAYER_CASES = {
    "(N,C)": dict(feature_shape=(4,), split=[7, 3, 2], momentum=0.1, affine=True),
    "(N,C,L) momentum=None": dict(feature_shape=(3, 5), split=[7, 3, 2], momentum=None, affine=True),
    "(N,C,H,W) dummy on rank 1": dict(feature_shape=(3, 4, 4), split=[5, 0, 3], momentum=0.1, affine=True),
    "(N,C,D,H,W) no affine": dict(feature_shape=(2, 3, 3, 2), split=[7, 3, 2], momentum=0.1, affine=False),
    # |mean| ≫ std: a Σx² − N·mean² in float32 (or a float32 mean subtracted) loses every digit.
    "(N,C) mean 1000 std 0.01": dict(feature_shape=(3,), split=[7, 3, 2], momentum=0.1, affine=True,
                                     offset=1000.0, spread=0.01),
}
TORCH_BATCHNORM = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}


def make_layer(case: dict) -> nn.Module:
    num_dims = 1 + len(case["feature_shape"])
    layer = TORCH_BATCHNORM[num_dims](case["feature_shape"][0], momentum=case["momentum"], affine=case["affine"])
    return perturb_batchnorm(layer)


def make_layer_data(case: dict) -> dict[str, torch.Tensor]:
    """Two global batches (the second only updates running stats) and upstream weights R."""
    generator = torch.Generator().manual_seed(3)
    shape = (sum(case["split"]), *case["feature_shape"])
    offset, spread = case.get("offset", 0.5), case.get("spread", 2.0)
    return {"x": offset + spread * torch.randn(shape, generator=generator),
            "x_second": offset + spread * torch.randn(shape, generator=generator),
            "upstream": torch.randn(shape, generator=generator)}


def _local_loss(y: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    # Mean over this batch's samples, as every rank's loss is: Σ_i w_i · L_i = (1/B) Σ_s ℓ_s.
    return (y * upstream).flatten(1).sum(1).mean()


def layer_on_one_device(case: dict) -> dict:
    """torch's BatchNorm in float64 on the whole batch: the exact answer for float32 inputs."""
    data = {k: v.double() for k, v in make_layer_data(case).items()}
    layer = make_layer(case).double()
    x = data["x"].clone().requires_grad_()
    y = layer(x)
    _local_loss(y, data["upstream"]).backward()
    with torch.no_grad():
        layer(data["x_second"])
    return {"y": y.detach(), "dx": x.grad, "dgamma": None if layer.weight is None else layer.weight.grad,
            "dbeta": None if layer.bias is None else layer.bias.grad, "statistics": statistics(layer)}


def layer_on_ranks(rank: int, case: dict) -> dict:
    data = make_layer_data(case)
    state = WeightedAllReduceState()
    layer = convert_batchnorm(make_layer(case), state)
    piece, state.weight = _rank_piece(rank, case["split"])
    x = data["x"][piece].clone().requires_grad_()
    y = layer(x)
    _local_loss(y, data["upstream"][piece]).backward()
    with torch.no_grad():
        layer(data["x_second"][piece])
    return {"y": y.detach(), "dx": x.grad, "dgamma": None if layer.weight is None else layer.weight.grad,
            "dbeta": None if layer.bias is None else layer.bias.grad, "statistics": statistics(layer),
            "piece": piece, "weight": state.weight}


# --- the spawn: every distributed scenario in one process group -----------------------

SCENARIOS = {
    "conv": lambda rank: train_on_ranks(rank, "conv", [LOCAL_BATCH_SIZES]),
    "linear": lambda rank: train_on_ranks(rank, "linear", [LOCAL_BATCH_SIZES]),
    "conv unconverted": lambda rank: train_on_ranks(rank, "conv", [LOCAL_BATCH_SIZES], convert=False),
    "linear unconverted": lambda rank: train_on_ranks(rank, "linear", [LOCAL_BATCH_SIZES], convert=False),
    "conv zero weight": lambda rank: train_on_ranks(rank, "conv", [ZERO_PIECE_SIZES]),
    "linear zero weight": lambda rank: train_on_ranks(rank, "linear", [ZERO_PIECE_SIZES]),
    "conv steps": lambda rank: train_on_ranks(rank, "conv", STEP_SPLITS, lr=LEARNING_RATE),
    "linear steps": lambda rank: train_on_ranks(rank, "linear", STEP_SPLITS, lr=LEARNING_RATE),
    **{f"layer {name}": (lambda rank, case=case: layer_on_ranks(rank, case)) for name, case in LAYER_CASES.items()},
}


def _scenarios(rank: int, world_size: int) -> dict:
    return {name: scenario(rank) for name, scenario in SCENARIOS.items()}


@pytest.fixture(scope="module")
def per_rank() -> list[dict]:
    return on_gloo_ranks(_scenarios, WORLD_SIZE)


def _max_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max((g - w).abs().max().item() for g, w in zip(got, want))


def _assert_same_statistics_on_every_rank(per_rank: list[dict], scenario: str) -> None:
    first = per_rank[0][scenario]["statistics"]
    for results in per_rank[1:]:
        for name, buffer in results[scenario]["statistics"].items():
            assert torch.equal(buffer, first[name]), f"{scenario}: {name} differs between ranks"


# --- a. the global batch's gradients, loss and running statistics ---------------------

@pytest.mark.parametrize("model_name", ["conv", "linear"])
def test_every_rank_gets_one_devices_gradients_loss_andstatistics(per_rank, model_name):
    expected = train_on_one_device(model_name, [LOCAL_BATCH_SIZES])

    for results in per_rank:
        got = results[model_name]
        for grad, want in zip(got["grads"][0], expected["grads"][0]):
            torch.testing.assert_close(grad, want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got["losses"][0], expected["losses"][0], rtol=RTOL, atol=ATOL)
        for name, want in expected["statistics"].items():
            torch.testing.assert_close(got["statistics"][name], want, rtol=RTOL, atol=ATOL)
    _assert_same_statistics_on_every_rank(per_rank, model_name)
    assert _max_error(per_rank[0][model_name]["grads"][0], expected["grads"][0]) < 1e-6


@pytest.mark.parametrize("model_name", ["conv", "linear"])
def test_local_batchnorm_under_the_weighted_hook_is_not_the_global_batch(per_rank, model_name):
    # torch.nn.SyncBatchNorm refuses CPU inputs, so the control is torch's local BatchNorm:
    # each rank normalises with its own 7, 3 or 2 samples.
    expected = train_on_one_device(model_name, [LOCAL_BATCH_SIZES])
    got = per_rank[0][f"{model_name} unconverted"]

    assert _max_error(got["grads"][0], expected["grads"][0]) > 1e-3
    assert (got["losses"][0] - expected["losses"][0]).abs().item() > 1e-3
    running_means = [results[f"{model_name} unconverted"]["statistics"]["1.running_mean"] for results in per_rank]
    assert (running_means[0] - running_means[1]).abs().max().item() > 1e-3, "local statistics drift apart"


# --- b. a rank with an empty piece runs a dummy sample with w = 0 ---------------------

@pytest.mark.parametrize("model_name", ["conv", "linear"])
def test_zero_weight_rank_counts_for_nothing(per_rank, model_name):
    expected = train_on_one_device(model_name, [ZERO_PIECE_SIZES])  # the 8 real samples

    for results in per_rank:
        got = results[f"{model_name} zero weight"]
        for grad, want in zip(got["grads"][0], expected["grads"][0]):
            assert torch.isfinite(grad).all()
            torch.testing.assert_close(grad, want, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got["losses"][0], expected["losses"][0], rtol=RTOL, atol=ATOL)
        for name, want in expected["statistics"].items():
            torch.testing.assert_close(got["statistics"][name], want, rtol=RTOL, atol=ATOL)
    _assert_same_statistics_on_every_rank(per_rank, f"{model_name} zero weight")


# --- c. training: several SGD steps over changing splits -------------------------------

@pytest.mark.parametrize("model_name", ["conv", "linear"])
def test_sgd_steps_on_three_ranks_match_one_device(per_rank, model_name):
    expected = train_on_one_device(model_name, STEP_SPLITS, lr=LEARNING_RATE)

    for results in per_rank:
        got = results[f"{model_name} steps"]
        for param, want in zip(got["params"], expected["params"]):
            torch.testing.assert_close(param, want, rtol=1e-5, atol=1e-5)
        for got_loss, want_loss in zip(got["losses"], expected["losses"]):
            torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=ATOL)
        for name, want in expected["statistics"].items():
            torch.testing.assert_close(got["statistics"][name], want, rtol=1e-5, atol=1e-5)
    _assert_same_statistics_on_every_rank(per_rank, f"{model_name} steps")
    moved = _max_error(expected["params"], [p.detach() for p in MODELS[model_name][0]().parameters()])
    assert moved > 1e-2, "the steps must change the weights, or equal weights prove nothing"


# --- the layer alone: every input rank, momentum=None, no affine, |mean| ≫ std ---------

@pytest.mark.parametrize("case_name", list(LAYER_CASES))
def test_layer_matches_one_device_for_every_input_shape(per_rank, case_name):
    case = LAYER_CASES[case_name]
    expected = layer_on_one_device(case)
    ranks = [results[f"layer {case_name}"] for results in per_rank]

    real = [r for r in ranks if r["weight"] > 0]
    # Σ_i w_i · (rank i's local ∂L_i/∂γ) is what the hook would make of them.
    for key in ("dgamma", "dbeta"):
        if expected[key] is None:
            assert all(r[key] is None for r in ranks)
            continue
        combined = sum(r["weight"] * r[key].double() for r in ranks)
        torch.testing.assert_close(combined, expected[key], rtol=RTOL, atol=ATOL)
    for r in real:
        torch.testing.assert_close(r["y"].double(), expected["y"][r["piece"]], rtol=RTOL, atol=ATOL)
        # Unscaled units: dx'_i = dx_i / w_i.
        # In float32, dx = γ·invstd·(w·dy' − S1/N − x̂·S2/N) keeps ~1e-7 of its largest term;
        # with std 0.01 (invstd 100) those terms are large, so the bound scales with them.
        want = expected["dx"][r["piece"]]
        torch.testing.assert_close(r["dx"].double() * r["weight"], want, rtol=RTOL,
                                   atol=ATOL * max(1.0, expected["dx"].abs().max().item()))
    for r in ranks:
        for name, want in expected["statistics"].items():
            torch.testing.assert_close(r["statistics"][name].to(want.dtype), want, rtol=RTOL, atol=ATOL)
    for dummy in (r for r in ranks if r["weight"] == 0):
        assert torch.isfinite(dummy["y"]).all()
        assert torch.equal(dummy["dx"], torch.zeros_like(dummy["dx"]))
        assert not dummy["dgamma"].any() and not dummy["dbeta"].any()
    _assert_same_statistics_on_every_rank(per_rank, f"layer {case_name}")


# --- d. conversion, and one process without a process group ---------------------------

def _batchnorm2d_without_beta(num_features: int, **kwargs) -> nn.Module:
    """``nn.BatchNorm2d(..., bias=False)``; torch before 2.14 has no ``bias`` argument,
    and a layer whose β was removed is what such a model holds."""
    if "bias" in inspect.signature(nn.BatchNorm2d.__init__).parameters:
        return nn.BatchNorm2d(num_features, bias=False, **kwargs)
    layer = nn.BatchNorm2d(num_features, **kwargs)
    layer.register_parameter("bias", None)
    return layer


def _model_with_every_batchnorm() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(2, 3, 1), nn.BatchNorm3d(3, momentum=None),
        nn.Flatten(2),  # (N, 3, D·H·W)
        nn.BatchNorm1d(3, eps=1e-3, affine=False),
        nn.Sequential(nn.Unflatten(2, (2, 2, 2)), nn.Flatten(3), nn.SyncBatchNorm(3, track_running_stats=False)),
        _batchnorm2d_without_beta(3, momentum=0.3),
    )
    model[5].weight.requires_grad_(False)  # a frozen γ stays frozen
    perturb_batchnorm(model)
    for layer in model.modules():
        if getattr(layer, "num_batches_tracked", None) is not None:
            layer.num_batches_tracked.fill_(7)
    return model


def test_convert_batchnorm_takes_over_every_batchnorms_state():
    original = _model_with_every_batchnorm()
    originals = [m for m in original.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    before = {name: t.clone() for name, t in original.state_dict().items()}
    state = WeightedAllReduceState(weight=0.25)

    converted = convert_batchnorm(original, state)

    converted_layers = [m for m in converted.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert len(converted_layers) == len(originals) == 4
    for old, new in zip(originals, converted_layers):
        assert type(new) is HeteroSyncBatchNorm and new.weight_state is state
        for attribute in ("num_features", "eps", "momentum", "affine", "track_running_stats", "training"):
            assert getattr(new, attribute) == getattr(old, attribute), attribute
        assert new.weight is old.weight and new.bias is old.bias  # the same Parameters: optimisers keep them
        assert new.running_mean is old.running_mean and new.running_var is old.running_var
        assert new.num_batches_tracked is old.num_batches_tracked
    assert converted[5].bias is None and not converted[5].weight.requires_grad
    after = converted.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


def test_converted_model_in_eval_mode_gives_the_same_outputs():
    x = torch.randn(4, 2, 2, 2, 2, generator=torch.Generator().manual_seed(4))
    original = _model_with_every_batchnorm().eval()
    want = original(x)

    converted = convert_batchnorm(_model_with_every_batchnorm().eval(), WeightedAllReduceState())

    assert not converted[1].training
    assert torch.equal(converted(x), want)


def test_convert_batchnorm_replaces_a_root_batchnorm_and_leaves_other_models_alone():
    root = nn.BatchNorm2d(5)
    root.train(False)
    converted = convert_batchnorm(root, WeightedAllReduceState())
    assert type(converted) is HeteroSyncBatchNorm and not converted.training and converted.weight is root.weight

    plain = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
    assert convert_batchnorm(plain, WeightedAllReduceState()) is plain
    assert not has_batchnorm(plain)
    assert has_batchnorm(nn.Sequential(nn.Sequential(nn.BatchNorm1d(2))))
    assert has_batchnorm(converted)


def test_convert_batchnorm_rejects_a_lazy_batchnorm_before_its_first_batch():
    with pytest.raises(ValueError, match="first forward pass"):
        convert_batchnorm(nn.Sequential(nn.LazyBatchNorm1d()), WeightedAllReduceState())


def test_weight_state_without_a_weight_is_rejected():
    with pytest.raises(TypeError, match="weight_state must have a float attribute `weight`"):
        HeteroSyncBatchNorm(3, weight_state=object())


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_preparing_a_batchnorm_model_says_nothing_of_the_loader_until_a_gradient_is_taken(one_rank_group, caplog):
    """Checking that the layers' weight_state has a `weight` must not read it: outside a
    loader's step the read is what tells rank 0 it trains without prepare_data_loader, so
    every BatchNorm model was told so at preparation, loader or not. The first backward
    pass on a worker that never made the loader still says it, once."""
    session = SimpleNamespace(identity=SimpleNamespace(rank=0, num_workers=1, device=torch.device("cpu")),
                              parts=LoopParts(), current_step=CurrentStep(), emulator=None)
    said = "prepare_model without prepare_data_loader"
    with caplog.at_level(logging.WARNING, logger="hetero_ray.worker"):
        model = prepare_model(session, make_conv_model())
        assert said not in caplog.text
        for _ in range(2):
            model(torch.randn(4, *CONV_INPUT_SHAPE)).sum().backward()
    assert len([r for r in caplog.records if said in r.getMessage()]) == 1


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("feature_shape", [(4,), (4, 3, 3)])
def test_without_a_process_group_it_is_torchs_batchnorm(momentum, feature_shape):
    assert not dist.is_initialized()
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randn(6, *feature_shape, generator=generator) for _ in range(3)]
    upstream = torch.randn(6, *feature_shape, generator=generator)
    layer_type = nn.BatchNorm1d if len(feature_shape) == 1 else nn.BatchNorm2d
    reference = perturb_batchnorm(layer_type(4, momentum=momentum))
    layer = convert_batchnorm(perturb_batchnorm(layer_type(4, momentum=momentum)), WeightedAllReduceState())

    for x in batches:  # training mode: batch statistics, running statistics updated
        for module in (reference, layer):
            module.zero_grad()
        x_ref, x_own = x.clone().requires_grad_(), x.clone().requires_grad_()
        (reference(x_ref) * upstream).sum().backward()
        (layer(x_own) * upstream).sum().backward()
        assert torch.equal(x_own.grad, x_ref.grad)
        assert torch.equal(layer.weight.grad, reference.weight.grad)
        assert torch.equal(layer.bias.grad, reference.bias.grad)
    for name, buffer in reference.named_buffers():
        assert torch.equal(getattr(layer, name), buffer), name
    assert layer.num_batches_tracked.item() == 3
    reference.eval(), layer.eval()
    assert torch.equal(layer(batches[0]), reference(batches[0]))
