"""Where a Lightning Trainer finds its rank and world: hetero_ray's worker (Ray Train's
context), not Lightning's environment variables."""

from __future__ import annotations

from lightning.pytorch.plugins.environments import LightningEnvironment

from hetero_ray.train.worker import get_context


class HeteroLightningEnvironment(LightningEnvironment):
    """``ray.train.lightning.RayLightningEnvironment`` for hetero_ray (also exported under
    that name): world size and ranks from the worker's context. The processes and their
    process group exist before the Trainer (Ray Train made them), so Lightning launches
    nothing and initialises no group."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        context = get_context()
        return context.get_node_rank() if hasattr(context, "get_node_rank") else 0

    def set_world_size(self, size: int) -> None:
        pass  # read from the context

    def set_global_rank(self, rank: int) -> None:
        pass  # read from the context

    def teardown(self) -> None:
        pass  # the environment variables belong to Ray Train
