"""Models build, run forward and backward, are deterministic, and share one loss interface."""

import pytest
import torch
from torch import nn

from hetero_ray.builtin import config
from hetero_ray.builtin.data import DataSpec, load_dataset
from hetero_ray.builtin.models import MODEL_NAMES, build_model, compute_loss, eval_batch_stats
from hetero_ray.errors import ConfigError

IMAGE_SPEC = DataSpec("image", 10, (3, 32, 32))
TEXT_SPEC = DataSpec("text", 256, (64,))


def _spec(name: str) -> DataSpec:
    return TEXT_SPEC if name in config.TEXT_MODELS else IMAGE_SPEC


def _dataset(name: str) -> str:
    return "synthetic_text" if name in config.TEXT_MODELS else "synthetic_image"


def test_model_names_are_the_configs():
    assert tuple(MODEL_NAMES) == config.MODELS


@pytest.mark.parametrize("name", config.MODELS)
def test_forward_backward_on_its_dataset(name):
    bundle = load_dataset(_dataset(name), num_samples=16, eval_samples=4)
    torch.manual_seed(0)
    model = build_model(name, bundle.spec)
    inputs, targets = bundle.train.batch(torch.tensor([3, 0, 7]))
    output = model(inputs)
    assert output.shape == targets.shape + (bundle.spec.num_classes,)
    loss = compute_loss(output, targets)
    loss.backward()
    assert torch.isfinite(loss)
    for param_name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name


@pytest.mark.parametrize("name", config.MODELS)
def test_same_seed_same_weights_other_seed_other_weights(name):
    def weights(seed):
        torch.manual_seed(seed)
        return build_model(name, _spec(name)).state_dict()

    first, again, other = weights(0), weights(0), weights(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point())


@pytest.mark.parametrize("name", ["mlp", "simple_cnn"])
def test_gradient_equivalence_models_have_no_batch_coupling(name):
    model = build_model(name, IMAGE_SPEC)
    coupling = (nn.modules.batchnorm._NormBase, nn.modules.dropout._DropoutNd, nn.GroupNorm, nn.LayerNorm)
    assert not [m for m in model.modules() if isinstance(m, coupling)]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_keep_resolution_for_cifar(name):
    model = build_model(name, DataSpec("image", 100, (3, 32, 32)))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 100
    model.eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 100)


def test_gpt_tiny_size_and_causality():
    torch.manual_seed(0)
    model = build_model("gpt_tiny", TEXT_SPEC)
    assert 100_000 <= sum(p.numel() for p in model.parameters()) <= 1_000_000
    tokens = torch.randint(0, 256, (2, 64))
    changed = tokens.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % 256  # the future of position 39
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :40], after[:, :40])
    assert not torch.allclose(before[:, 40:], after[:, 40:])


def test_gpt_tiny_rejects_longer_sequences():
    model = build_model("gpt_tiny", TEXT_SPEC)
    with pytest.raises(ValueError, match="at most 64 tokens"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_unknown_model_and_wrong_data_kind_are_config_errors():
    with pytest.raises(ConfigError, match="--model must be one of"):
        build_model("vgg", IMAGE_SPEC)
    with pytest.raises(ConfigError, match="gpt_tiny needs text data"):
        build_model("gpt_tiny", IMAGE_SPEC)
    with pytest.raises(ConfigError, match="mlp needs image data"):
        build_model("mlp", TEXT_SPEC)


def test_lm_loss_is_the_mean_over_samples_of_per_sample_means():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 8, 11, generator=generator)
    targets = torch.randint(0, 11, (5, 8), generator=generator)
    per_sample = torch.stack([compute_loss(logits[i], targets[i]) for i in range(5)])
    torch.testing.assert_close(compute_loss(logits, targets), per_sample.mean())


@pytest.mark.parametrize("seed", range(5))
def test_weighted_local_losses_give_the_global_loss(seed):
    # The invariant the gradient weighting relies on: Σ_i (b_i / B) · loss_i = loss(global batch).
    generator = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(3, 40, (1,), generator=generator))
    logits = torch.randn(batch, 10, generator=generator)
    targets = torch.randint(0, 10, (batch,), generator=generator)
    cuts = sorted(torch.randperm(batch - 1, generator=generator)[:2].add(1).tolist())
    bounds = [0, *cuts, batch]
    weighted = sum(
        (stop - start) / batch * compute_loss(logits[start:stop], targets[start:stop])
        for start, stop in zip(bounds, bounds[1:])
    )
    torch.testing.assert_close(weighted, compute_loss(logits, targets))


def test_eval_batch_stats_classification():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 5.0], [0.0, 0.0, 1.0]])
    targets = torch.tensor([0, 1, 0, 2])
    stats = eval_batch_stats(logits, targets)
    assert stats["correct"] == 3 and stats["count"] == 4
    assert isinstance(stats["loss_sum"], float) and isinstance(stats["correct"], int)
    assert stats["loss_sum"] == pytest.approx(4 * float(compute_loss(logits, targets)), rel=1e-6)


def test_eval_batch_stats_language_model_counts_tokens():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 13, generator=generator, requires_grad=True)
    targets = logits.argmax(-1).detach()
    targets[0, 0] = (targets[0, 0] + 1) % 13  # one miss
    stats = eval_batch_stats(logits, targets)
    assert stats == {"loss_sum": pytest.approx(21 * float(compute_loss(logits.detach(), targets))), "correct": 20, "count": 21}


def test_mismatched_output_and_targets_are_refused():
    with pytest.raises(ValueError, match="does not match targets"):
        compute_loss(torch.zeros(4, 10), torch.zeros(4, 3, dtype=torch.long))
