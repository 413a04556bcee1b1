"""Ray Data at each rank's share: ``hetero_ray.train.get_dataset_shard("train")`` on three
ranks of a real gloo group (tests/inprocess_session.py: the worker runtime without Ray
Train), reading a real Ray Data pipeline (rows made by one ``map_batches`` and augmented by
another) through a real feed actor on the test session's local Ray. Each case trains a float64 model with
BatchNorm and records the row ids of every step on every rank; the test replays those
global batches on one device and checks the weights, and that every row of every epoch
was trained exactly once — under a plan change mid-epoch, a rank left out and brought
back, a local shuffle that differs between epochs, and a stop mid-epoch resumed from the
checkpoint."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

from hetero_ray.constants import RAY_NAMESPACE
from tests.inprocess_session import ScriptedPlanner, run_cases_on_ranks, run_in_session
from tests.ray_data_jobs import LR, MOMENTUM, SEED, augment, features, make_model, one_device, restore

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # Ray Data's datasets need the session's Ray

NUM_WORKERS, NUM_ROWS, GLOBAL_BATCH, EPOCHS = 3, 70, 16, 2  # 5 steps an epoch, the last of 6 rows
FEED_NAME = "test-ray-data/data-train"
PLANS = {
    "change": {0: (6, 6, 4), 2: (10, 4, 2), 7: (2, 4, 10)},
    "out_and_back": {0: (6, 6, 4), 1: (10, 0, 6), 3: (12, 0, 4), 6: (6, 6, 4)},  # rank 1 out at steps 1–5
    "resume": {0: (6, 6, 4), 3: (4, 4, 8)},  # stopped after global step 2 (mid-epoch 0), resumed
    "misuse": {0: (6, 6, 4)},
}
SHUFFLE = {"change": None, "out_and_back": 20, "resume": 8}
STOP_AFTER = 3  # the resume case's first session trains this many steps


def data_loop(config: dict) -> dict:
    import ray.train

    import hetero_ray.train

    model = hetero_ray.train.prepare_model(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    restore(model, optimizer)
    shard = hetero_ray.train.get_dataset_shard("train")
    steps = []  # per step: (epoch, the row ids this rank trained)
    for epoch in range(shard.epoch, EPOCHS):
        for batch in shard.iter_torch_batches(local_shuffle_buffer_size=config["shuffle"]):
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append((epoch, [] if hetero_ray.train.is_probe_step() else batch["id"].tolist()))
            if len(steps) == config.get("stop_after"):
                with tempfile.TemporaryDirectory() as directory:
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "global_step": len(steps)},
                               os.path.join(directory, "state.pt"))
                    hetero_ray.train.report({"steps": len(steps)},
                                            checkpoint=ray.train.Checkpoint.from_directory(directory))
                return {"steps": steps}
    return {"steps": steps, "params": {k: v.detach().clone() for k, v in model.module.state_dict().items()}}


def misuse_loop(config: dict) -> dict:
    """What a loop can get wrong, each said before a step trains."""
    import hetero_ray.train
    from hetero_ray.errors import UserError

    model = hetero_ray.train.prepare_model(make_model())
    said = {}
    try:
        hetero_ray.train.get_dataset_shard("training")
    except UserError as e:
        said["name"] = str(e)
    shard = hetero_ray.train.get_dataset_shard("train")
    try:
        for first, second in zip(shard.iter_torch_batches(), shard.iter_torch_batches()):
            model(first["x"]).sum().backward()
    except UserError as e:
        said["twice"] = str(e)
    try:
        shard.iter_torch_batches(local_shuffle_buffer_size=0)
    except UserError as e:
        said["buffer"] = str(e)
    return {"said": said}


def _run_case(case: dict, rank: int, case_dir: str) -> dict:
    import ray

    if not ray.is_initialized():
        ray.init(address=case["address"], namespace=RAY_NAMESPACE, logging_level="WARNING")
    feeds = {"train": ray.get_actor(FEED_NAME, namespace=RAY_NAMESPACE)}
    common = dict(rank=rank, num_workers=NUM_WORKERS, global_batch_size=GLOBAL_BATCH,
                  planner=ScriptedPlanner(PLANS[case["plan"]]), storage=os.path.join(case_dir, "storage"), seed=SEED,
                  data_feeds=feeds)
    if case["plan"] == "misuse":
        result, _, _ = run_in_session(misuse_loop, {}, **common)
        return result
    config = {"shuffle": SHUFFLE[case["plan"]]}
    if case["plan"] != "resume":
        result, _, _ = run_in_session(data_loop, config, **common)
        return result
    first, _, ray_train = run_in_session(data_loop, {**config, "stop_after": STOP_AFTER}, **common)
    torch.distributed.barrier()
    restored = os.path.join(common["storage"], ray_train.reports[-1]["name"], "rank0")
    result, _, _ = run_in_session(data_loop, config, **common, restored_checkpoint=restored)
    return {**result, "steps": first["steps"] + result["steps"]}


def _case_name(case: dict) -> str:
    return case["plan"]


@pytest.fixture(scope="module")
def per_rank(ray_session, tmp_path_factory) -> list[dict]:
    from hetero_ray.runtime.data_feed import DataFeed

    ray = ray_session
    # Rows made and augmented on the cluster, read anew each epoch. (Parquet is read in
    # tests/test_ray_data_e2e.py: Ray Data starts a file-listing actor for every reading of
    # it, seconds each here, which these twelve readings need not pay.)
    dataset = ray.data.range(NUM_ROWS, override_num_blocks=4).map_batches(features).map_batches(augment)
    feed = ray.remote(DataFeed).options(name=FEED_NAME, namespace=RAY_NAMESPACE, num_cpus=0,
                                        max_concurrency=8).remote(dataset, "train", read_batch_size=7)
    address = ray.get_runtime_context().gcs_address
    cases = [{"plan": plan, "address": address} for plan in [*PLANS, "misuse"]]
    try:
        return run_cases_on_ranks(_run_case, cases, _case_name, NUM_WORKERS,
                                  str(tmp_path_factory.mktemp("ray_data_cases")))
    finally:
        ray.kill(feed)


@pytest.mark.parametrize("plan", ["change", "out_and_back", "resume"])
def test_every_row_once_and_one_devices_weights(per_rank, plan):
    results = [rank[plan] for rank in per_rank]
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    steps = [r["steps"] for r in results]
    assert len({len(s) for s in steps}) == 1  # all ranks ran the same steps
    global_batches, epochs = [], {}
    for at in range(len(steps[0])):
        epoch = steps[0][at][0]
        ids = [i for rank_steps in steps for i in rank_steps[at][1]]
        global_batches.append(ids)
        epochs.setdefault(epoch, []).extend(ids)
    assert sorted(epochs) == list(range(EPOCHS))
    for epoch, ids in epochs.items():
        assert sorted(ids) == list(range(NUM_ROWS)), f"epoch {epoch}: a row missing or trained twice"
    assert [len(b) for b in global_batches] == ([GLOBAL_BATCH] * 4 + [6]) * EPOCHS
    if SHUFFLE[plan]:  # a new order each epoch
        assert epochs[0] != epochs[1]
    expected = one_device(NUM_ROWS, global_batches)
    for rank, result in enumerate(results):
        for name, value in expected.items():
            difference = (result["params"][name].double() - value.double()).abs().max().item()
            assert difference < 1e-10, f"rank {rank}, {name}: {difference:.2e} from one device"


def test_a_left_out_rank_reads_only_probes(per_rank):
    steps = per_rank[1]["out_and_back"]["steps"]
    assert [ids for _, ids in steps[1:6]] == [[]] * 5  # left out at steps 1–5: nothing trained
    assert steps[6][1]  # and back


def test_bad_use_of_a_shard_is_said_before_a_step_trains(per_rank):
    for rank in per_rank:
        said = rank["misuse"]["said"]
        assert "no dataset of that name (given: 'train')" in said["name"]
        assert "resumed after a newer one began" in said["twice"]
        assert "local_shuffle_buffer_size must be a positive integer" in said["buffer"]
