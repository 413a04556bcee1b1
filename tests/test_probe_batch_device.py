"""The model probe makes its batches on the device where the recipe allows, on the host where
it does not (a recipe with its own CPU torch.Generator, as examples/lightning_module.py has:
on a GPU its probe failed with "Expected a 'cuda' device type for generator")."""

import torch

from hetero_ray.profiling.model_probe import batch_on_device


def _with_cpu_generator(batch_size: int) -> torch.Tensor:
    """Made on the host only: on CUDA its generator refuses the device; on the meta device
    (which ignores the generator) its labels, read back in Python, cannot be."""
    x = torch.randn(batch_size, 3, generator=torch.Generator().manual_seed(0))
    return x, torch.tensor([value > 0 for value in x[:, 0].tolist()])


def test_a_recipe_with_its_own_cpu_generator_is_made_on_the_host():
    x, y = batch_on_device(_with_cpu_generator, 4, torch.device("meta"))
    assert x.device.type == "cpu" and x.shape == (4, 3) and y.shape == (4,)
    assert torch.equal(x, _with_cpu_generator(4)[0])


def test_a_plain_recipe_is_made_on_the_device():
    batch = batch_on_device(lambda b: torch.zeros(b, 2), 4, torch.device("meta"))
    assert batch.device.type == "meta"


def test_an_allocation_failure_is_the_memory_searchs_answer_not_retried_on_the_host():
    from hetero_ray.profiling.model_probe import OOM_MESSAGES

    calls = []

    def fails_to_allocate(batch_size):
        calls.append(batch_size)
        raise RuntimeError(f"{OOM_MESSAGES[0]} while making the batch")

    try:
        batch_on_device(fails_to_allocate, 4, torch.device("meta"))
    except RuntimeError as e:
        assert OOM_MESSAGES[0] in str(e)
    else:
        raise AssertionError("the allocation failure was swallowed")
    assert calls == [4]
