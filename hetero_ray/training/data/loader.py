"""The data loader behind ``hetero_ray.train.prepare_data_loader``: this rank's piece of every
global step, under the plan in force, loaded by real DataLoader worker processes.

Each ``iter(loader)`` runs the rest of one epoch of the global sampler
(:mod:`hetero_ray.sampler`): step ``s`` yields this rank's piece of the window
``[s·B, (s+1)·B)``, through a torch ``DataLoader`` whose batch sampler is
:meth:`PlanFollowingLoader._index_batches`. A plan is agreed by all ranks ``L`` steps
before its rebalance point and applied from it, ``L`` being the largest
``num_workers × prefetch_factor`` of all ranks (the indices the DataLoader asks for ahead).
A rank left out runs a probe with weight 0, in step with the others. How plans,
prefetching, finished steps and probes fit together: docs/worker-runtime.md#the-plan-following-loader
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator, Optional

import torch

from hetero_ray.errors import UserError
from hetero_ray.planning.plan import Plan, next_point
from hetero_ray.runs.records import DATA_LOADER_SOURCE
from hetero_ray.sampler import GlobalSampler
from hetero_ray.tensors import map_tensors
from hetero_ray.training.gradients.weighting import rank_weight
from hetero_ray.training.rank.heap import freeze_heap
from hetero_ray.training.rank.loop_report import check_data_matches
from hetero_ray.training.rank.replica_state import StaleRanks, copy_from_rank0
from hetero_ray.training.rank.session import WorkerSession
from hetero_ray.training.rank.step_record import HandedOutStep, sample_ids_row, step_row
from hetero_ray.training.timing import steps as timing

logger = logging.getLogger("hetero_ray.worker")

DEFAULT_PREFETCH_FACTOR = 2  # torch's default: batches each DataLoader worker keeps ready


def lookahead_steps(num_workers: int, prefetch_factor: Optional[int]) -> int:
    """Steps whose indices a DataLoader asks for beyond the one handed out: each of its
    ``num_workers`` processes keeps ``prefetch_factor`` batches in flight."""
    if num_workers == 0:
        return 0
    return num_workers * (DEFAULT_PREFETCH_FACTOR if prefetch_factor is None else prefetch_factor)


class PlanFollowingLoader:
    """Iterable over this rank's local batches, one epoch per ``iter()``.

    Attributes:
        epoch: the epoch the next ``iter()`` runs (after a restart, the checkpoint's).
        position: the next step to run.
    """

    def __init__(self, session: WorkerSession, dataset, *, collate_fn=None, num_workers: int = 0,
                 pin_memory: bool = False, prefetch_factor: Optional[int] = None, shuffle: bool = True,
                 drop_last: bool = False, move_to_device: bool = True, worker_init_fn=None,
                 plan_lookahead_steps: Optional[int] = None, order_facts: Optional[dict] = None,
                 data_source: str = DATA_LOADER_SOURCE):
        settings = session.settings
        self._session = session
        self._order_facts = order_facts or {}  # what else the order depends on (a Ray Data feed's settings)
        self.data_source = data_source  # each step row's data_source (runs/records.py)
        self.sampler = _LoaderSampler(self, len(dataset), settings.global_batch_size, settings.seed, drop_last,
                                      shuffle)
        check_data_matches(session.restored, self.data_order())
        self.position = session.restored_position
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = DEFAULT_PREFETCH_FACTOR
        # The steps ahead at which plans are agreed: every rank's (see the module docstring).
        own = lookahead_steps(num_workers, prefetch_factor)
        self.lookahead_steps = own if plan_lookahead_steps is None else plan_lookahead_steps
        if self.lookahead_steps < own:
            raise RuntimeError(f"plans agreed {self.lookahead_steps} steps ahead, but this rank's DataLoader "
                               f"asks for indices {own} steps ahead")
        self.move_to_device = move_to_device  # each batch's tensors to this rank's device
        self._plans: list[tuple[int, Plan]] = []  # (first global step, plan), in step order
        self._probe_sizes: dict[int, int] = {}  # first global step of a plan → this rank's probe under it (0: in)
        # Each rank's memory cap (largest batch its device holds; None: unknown), agreed with the plans.
        self.memory_caps: Optional[list[Optional[int]]] = None
        self._last_share = 0  # this rank's share under the last agreed plan that had it in
        self.stale = StaleRanks()  # ranks left out since their last copy of rank 0's state
        self._next_point: int = self.position.global_step  # the first unagreed rebalance point
        self._pending: Optional[HandedOutStep] = None  # the step handed out, not yet recorded
        self._iteration: Optional[object] = None  # the token of the iteration in progress
        self._dataloader = torch.utils.data.DataLoader(
            dataset, batch_sampler=_StepBatches(self), num_workers=num_workers, collate_fn=collate_fn,
            pin_memory=pin_memory and session.identity.device.type == "cuda", prefetch_factor=prefetch_factor,
            persistent_workers=num_workers > 0, worker_init_fn=worker_init_fn,
        )
        self._resources = _resource_sampler(session)
        self._gauges = _gauges(session)

    def data_order(self) -> dict:
        """What the order of samples depends on; a restored position needs the same."""
        s = self.sampler
        return {"num_samples": s.num_samples, "global_batch_size": s.global_batch_size, "seed": s.seed,
                "shuffle": s.shuffle, "drop_last": s.drop_last, **self._order_facts}

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def __len__(self) -> int:
        """Steps left in the epoch the next ``iter()`` runs."""
        return self.sampler.steps_per_epoch - self.position.step

    @property
    def local_batch_size(self) -> Optional[int]:
        """This rank's share of the step handed out last: 0 when the rank holds no sample
        of it (it then runs one sample of the window, or its probe when the plan leaves it
        out, with weight 0), None between steps."""
        return self._pending.local_batch_size if self._pending is not None else None

    @property
    def memory_cap(self) -> Optional[int]:
        """This rank's memory cap (None: unknown): the largest micro-batch it trains."""
        return None if self.memory_caps is None else self.memory_caps[self._session.identity.rank]

    @property
    def plan(self) -> Optional[Plan]:
        """The plan of the step handed out last (None before the first step)."""
        if self._pending is not None:
            return self._pending.plan
        return self._plans[-1][1] if self._plans else None

    def __iter__(self) -> Iterator[Any]:
        self._iteration = token = object()  # an older iteration's generator must no longer act
        self._leave_step()  # a step handed out by an iteration that was not closed (a held peek)
        start = self.position
        epoch_end = start.global_step - start.step + self.sampler.steps_per_epoch
        self._agree_through(start.global_step, epoch_end)
        freeze_heap()
        batches = iter(self._dataloader)  # primes the workers with the first L steps' indices
        try:
            while self.position.epoch == start.epoch:
                self._agree_through(self.position.global_step, epoch_end)
                yield self._begin_step(batches)
                if self._iteration is not token:
                    raise UserError("an iteration of the hetero_ray loader was resumed after a newer one began; "
                                    "iterate the loader once at a time (for batch in loader: ...)")
                self.finish_step()  # the user asked for the next batch: the step ran
            # The epoch's end, on every rank at once: what the loop evaluates or saves now is
            # rank 0's state on every rank, also on a rank left out during the epoch.
            self.copy_state_to_left_out_ranks()
        finally:
            if self._iteration is token:
                self._iteration = None
                self._leave_step()  # the user left the loop (break, exception) or dropped a peek
            del batches

    # --- one step ------------------------------------------------------------------------

    def _begin_step(self, batches) -> Any:
        session, identity = self._session, self._session.identity
        position = self.position
        first, plan = self._entry_at(position.global_step)
        model = session.parts.model
        if any(rank in self.stale.ranks for rank in plan.in_ranks):  # collective: all ranks know it
            self.copy_state_to_left_out_ranks()  # a rank brought back starts from rank 0's state
        self.stale.note_plan(plan.local_batch_sizes)
        timeline = timing.StepTimeline(identity.device)
        session.current_step.begin(timeline)
        timeline.mark(timing.STEP_START)
        step_start = time.perf_counter()
        window_size = self.sampler.window_size(position.step)
        begin, stop = self.sampler.piece(position.step, plan, identity.rank)
        local_batch_size = stop - begin
        takes_part = plan.local_batch_sizes[identity.rank] > 0
        probe_batch_size = 0 if takes_part else self._probe_size(first, position.step)
        if session.emulator is not None:  # pads to the samples it runs: its share, its probe, or one
            session.emulator.begin_step(session.speeds.speed(identity.rank, position.global_step), step_start,
                                        local_batch_size=local_batch_size or probe_batch_size or 1)
        if model is not None:
            model.weight_state.weight = rank_weight(local_batch_size, window_size)
            group = session.groups.of(plan) if session.groups is not None else None
            model.weight_state.use_group(group, len(plan.in_ranks), takes_part)
        batch = next(batches)
        if identity.device.type == "cuda":
            timeline.mark(timing.HOST_BATCH_READY)
        if self.move_to_device:
            # Asynchronously from pinned memory.
            batch = map_tensors(batch, lambda t: t.to(identity.device, non_blocking=True))
        timeline.mark(timing.DATA_READY)
        self._pending = HandedOutStep(position, plan, local_batch_size, window_size, timeline, probe_batch_size)
        return batch

    def finish_step(self) -> None:
        """Records the step handed out last (its optimiser step is done) and moves on.
        Called at the next step, at the end of the loop, and before a checkpoint."""
        step, self._pending = self._pending, None
        if step is None:
            return
        session = self._session
        step.timeline.end()
        notes = session.current_step.end()
        row = step_row(session.identity, step, notes, session.emulator.padded_s if session.emulator else 0.0,
                       self.data_source)
        row.update(self._resources.maybe_sample(step.position.global_step))
        self._gauges.update(row)
        session.recorder.record(row, self._sample_ids(step) if session.settings.record_sample_ids else None)
        self.position = self.sampler.next_position(step.position)

    @property
    def is_probe_step(self) -> bool:
        """Whether the step handed out last gives this rank no sample of the global batch:
        it runs a probe (the plan leaves it out) or the one sample of a short last window,
        with weight 0. False between steps."""
        return self._pending is not None and self._pending.local_batch_size == 0

    def copy_state_to_left_out_ranks(self) -> None:
        """Collective of all ranks when a rank was left out since its last copy (every rank
        knows it from the agreed plans; otherwise nothing to do): rank 0's model, optimisers,
        schedulers and scalers everywhere (:mod:`hetero_ray.training.rank.replica_state`)."""
        model = self._session.parts.model
        if not self.stale or model is None:
            return
        identity = self._session.identity
        copy_from_rank0(model.ddp.module, identity.rank, identity.collective_device)
        self.stale.copied()

    def _leave_step(self) -> None:
        """The iteration ends with a step handed out: it is done if it was trained, else it
        is handed out again by the next ``iter()``.

        Trained means the prepared model's backward pass reached the gradient hook during
        the step (its timeline has the last bucket's mark). A batch that was only looked at
        must not count: its samples would be recorded as used and never be trained. Without
        a prepared model nothing can tell, and the step counts as done, as it always has."""
        step = self._pending
        if step is None:
            return
        if self._session.parts.model is None or step.timeline.has(timing.LAST_BUCKET_READY):
            self.finish_step()
            return
        self._pending = None
        self._session.current_step.end()
        logger.info("global step %d was handed out but not trained (no backward pass through the prepared "
                    "model); the next iteration hands it out again", step.position.global_step)

    def _sample_ids(self, step: HandedOutStep) -> dict:
        position, identity = step.position, self._session.identity
        start, stop = self.sampler.piece(position.step, step.plan, identity.rank)
        return sample_ids_row(identity, position, self.sampler.permutation(position.epoch)[start:stop].tolist())

    def close(self) -> None:
        self._iteration = None
        self._leave_step()
        self._resources.close()

    # --- plans ---------------------------------------------------------------------------

    def _agree_through(self, global_step: int, epoch_end: int) -> None:
        """Collective at ``global_step``: agree on every plan whose rebalance point ``R``
        lies within this epoch and no more than L steps ahead (``R − L ≤ global_step``)."""
        # Plans before the one in force at this step are never asked for again.
        in_force = [i for i, (first, _) in enumerate(self._plans) if first <= global_step]
        if in_force:
            for first, _ in self._plans[:in_force[-1]]:
                self._probe_sizes.pop(first, None)
            del self._plans[:in_force[-1]]
        end = self._session.settings.end_global_step
        while self._next_point - self.lookahead_steps <= global_step and self._next_point < epoch_end \
                and (end is None or self._next_point < end):
            current = self._plans[-1][1] if self._plans else None
            point = self._next_point
            plan, self.memory_caps = self._session.agree_on_plan(current, self.sampler.position_of(point),
                                                                 self.memory_caps)
            self._plans.append((point, plan))
            share = plan.local_batch_sizes[self._session.identity.rank]
            self._last_share = share or self._last_share
            last = self._last_share or -(-plan.global_batch_size // plan.num_workers)
            # At most half its last share (the plan left this rank out because it was slow), and
            # no more than the plan says fits in its step (planning/probes.py): the probe must end
            # before the step of the ranks in, or it holds them up at the next plan's broadcast.
            probe = max(1, last // 2)
            rank = self._session.identity.rank
            if plan.probe_sizes:
                probe = min(probe, plan.probe_sizes[rank])
            if self.memory_caps is not None and self.memory_caps[rank]:
                # Half a share that fitted before may not fit now (a first plan that leaves the
                # rank out, a resume): a probe past the device's memory would fail at the same
                # step after every restart.
                probe = min(probe, self.memory_caps[rank])
            self._probe_sizes[point] = 0 if share else probe
            self._next_point = next_point(point, plan, current is None or plan.version != current.version,
                                          self._session.settings.rebalance_interval, self.lookahead_steps)

    def _entry_at(self, global_step: int) -> tuple[int, Plan]:
        """(first global step, plan) of the plan in force at ``global_step``."""
        if global_step >= self._next_point:
            raise RuntimeError(f"no agreed plan for global step {global_step} (agreed up to "
                               f"{self._next_point - 1}); the plan lookahead is wrong")
        for first, plan in reversed(self._plans):
            if first <= global_step:
                return first, plan
        raise RuntimeError(f"no plan in force at global step {global_step}")

    def _probe_size(self, first: int, step: int) -> int:
        """The probe of a rank left out by the plan that began at ``first``, within the window."""
        return min(self._probe_sizes[first], self.sampler.window_size(step))

    def _index_batches(self) -> Iterator[list[int]]:
        """The DataLoader's batch sampler: this rank's indices for the rest of the epoch,
        from the position the iteration started at."""
        start = self.position
        permutation = self.sampler.permutation(start.epoch)
        rank = self._session.identity.rank
        for step in range(start.step, self.sampler.steps_per_epoch):
            first, plan = self._entry_at(start.global_step - start.step + step)
            begin, stop = self.sampler.piece(step, plan, rank)
            if plan.local_batch_sizes[rank] == 0:
                # Left out: its probe, samples of the window it does not consume (weight 0).
                begin = self.sampler.window(step)[0]
                stop = begin + self._probe_size(first, step)
            elif stop == begin:
                # A short last window can leave a rank without samples. It must still enter
                # the all-reduce; it runs one sample of the window with weight 0.
                begin, stop = self.sampler.window(step)[0], self.sampler.window(step)[0] + 1
            yield permutation[begin:stop].tolist()


class _LoaderSampler(GlobalSampler):
    """The loader's global sampler, with the ``loader.sampler.set_epoch(epoch)`` of Ray
    Train's examples (a ``DistributedSampler`` needs it to shuffle anew each epoch).

    Here the epoch is the loader's position in the run, which moves on by itself (and a
    restart continues the checkpoint's epoch), so the call changes nothing; an epoch other
    than the loader's is said once, since the user's loop then counts epochs differently."""

    def __init__(self, loader: "PlanFollowingLoader", *args):
        super().__init__(*args)
        self._loader = loader
        self._said = False

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader
        if epoch != loader.epoch and not self._said and loader._session.identity.rank == 0:
            self._said = True
            logger.warning("loader.sampler.set_epoch(%s) changes nothing: the hetero_ray loader runs epoch %d "
                           "next (each iter() runs the rest of one epoch; after a restart, the checkpoint's); "
                           "start your epoch loop at loader.epoch", epoch, loader.epoch)


class _StepBatches:
    """Batch sampler object for the DataLoader: each ``iter()`` starts at the loader's position."""

    def __init__(self, loader: PlanFollowingLoader):
        self._loader = loader

    def __iter__(self) -> Iterator[list[int]]:
        return self._loader._index_batches()

    def __len__(self) -> int:
        return len(self._loader)


def _resource_sampler(session: WorkerSession):
    from hetero_ray.training.timing.resource_sampler import ResourceSampler

    return ResourceSampler(session.identity.device, interval_steps=session.settings.profile_interval)


def _gauges(session: WorkerSession):
    from hetero_ray.metrics.gauges import RankGauges

    return RankGauges(session.settings.experiment_name)


def _agree_on_data(session: WorkerSession, size: int, own_lookahead_steps: int) -> int:
    """Collective: every rank's dataset has the same length, or the run stops here; returns
    the plan look-ahead of all ranks (the largest rank's own).

    Each rank cuts its piece out of a permutation of ``range(len(dataset))``; ranks that
    see different lengths (another copy of the files on one node) would draw from different
    permutations, and exactly-once would break without any error. The look-ahead rides in
    the same all-reduce: ranks that agreed plans at different steps would deadlock."""
    identity = session.identity
    n = identity.num_workers
    if n == 1:
        return own_lookahead_steps
    values = torch.zeros(2 * n, dtype=torch.int64, device=identity.collective_device)
    values[identity.rank] = size
    values[n + identity.rank] = own_lookahead_steps
    torch.distributed.all_reduce(values)
    sizes, lookaheads = values[:n].tolist(), values[n:].tolist()
    if len(set(sizes)) > 1:
        described = ", ".join(f"rank {rank} (node {node[:8]}): {length}"
                              for rank, (length, node) in enumerate(zip(sizes, identity.rank_node_ids)))
        raise UserError(f"the ranks' datasets differ in length ({described}); every node must see the same "
                        "data (same files at the same path), or the global sampler cannot give each sample once")
    return max(lookaheads)


def check_map_style(dataset) -> None:
    """A dataset whose samples can be picked by index, or a :class:`UserError` saying why not."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise UserError(f"hetero_ray.train.prepare_data_loader needs a map-style dataset (__len__ and "
                        f"__getitem__), got the iterable-style {type(dataset).__name__}: each rank's share of a "
                        "global step is picked by sample index, which a stream cannot do")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        missing = " and ".join(m for m in ("__len__", "__getitem__") if not hasattr(dataset, m))
        raise UserError(f"hetero_ray.train.prepare_data_loader needs a map-style dataset; "
                        f"{type(dataset).__name__} has no {missing}")


def check_workers(num_workers, prefetch_factor) -> None:
    """DataLoader worker settings a person can get wrong, or a :class:`UserError`."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise UserError(f"prepare_data_loader(num_workers=...) must be a non-negative integer, got {num_workers!r}")
    if prefetch_factor is not None and (num_workers == 0 or not isinstance(prefetch_factor, int)
                                        or prefetch_factor < 1):
        raise UserError(f"prepare_data_loader(prefetch_factor={prefetch_factor!r}) needs num_workers > 0 and a "
                        "positive integer")


def make_loader(session: WorkerSession, dataset, *, num_workers: int, prefetch_factor: Optional[int],
                **options: Any) -> PlanFollowingLoader:
    """Checks the arguments a person can get wrong, then makes the worker's one training loader."""
    if session.parts.loader is not None:
        raise UserError("hetero_ray.train.prepare_data_loader(evaluation=False) was called twice on this worker: "
                        "one training loader follows the run's plan; make it once and iterate it once per epoch "
                        "(an evaluation loader takes evaluation=True)")
    check_map_style(dataset)
    check_workers(num_workers, prefetch_factor)
    size, batch = len(dataset), session.settings.global_batch_size
    agreed_lookahead_steps = _agree_on_data(session, size, lookahead_steps(num_workers, prefetch_factor))
    if size < 1 or (options.get("drop_last") and size < batch):
        raise UserError(f"the dataset has {size} samples, fewer than one global batch of {batch} "
                        "(HeteroConfig.global_batch_size)" + (" with drop_last" if size else ""))
    session.parts.loader = PlanFollowingLoader(session, dataset, num_workers=num_workers,
                                               prefetch_factor=prefetch_factor,
                                               plan_lookahead_steps=agreed_lookahead_steps, **options)
    return session.parts.loader
