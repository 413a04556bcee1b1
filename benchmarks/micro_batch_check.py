"""Micro-batches on a real device: rank 0 (on --device) is given 32 samples but holds 8, so it
trains 4 micro-batches of 8 per step; rank 1 (CPU) takes 8; gloo between them. Prints the
largest weight difference to one CPU process on the whole global batches; exit 0 below 1e-5.

    python3 benchmarks/micro_batch_check.py --device cuda      # no Ray, no pytest
"""
import argparse, os, socket, sys, tempfile  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hetero_ray.training.gradients.micro_batches import accumulate, micro_batch_sizes, split_batch  # noqa: E402
from hetero_ray.training.gradients.weighting import WeightedAllReduceState, weighted_allreduce_hook  # noqa: E402

SHARES, CAPS, STEPS, TOLERANCE = [32, 8], [8, None], 5, 1e-5


def model_and_data(step=None):
    if step is None:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(sum(SHARES), 10, generator=g), torch.randint(0, 4, (sum(SHARES),), generator=g)


def rank_main(rank, port, device, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(SHARES))
    device = torch.device(device if rank == 0 else "cpu")
    model = torch.nn.parallel.DistributedDataParallel(model_and_data().to(device), bucket_cap_mb=0.001)
    state = WeightedAllReduceState(weight=SHARES[rank] / sum(SHARES))
    model.register_comm_hook(state, weighted_allreduce_hook)
    optimizer, start = torch.optim.SGD(model.parameters(), lr=0.5), sum(SHARES[:rank])
    for step in range(STEPS):
        share = [t[start:start + SHARES[rank]].to(device) for t in model_and_data(step)]
        sizes = micro_batch_sizes(SHARES[rank], CAPS[rank])
        for x, y in accumulate(model, state, split_batch(share, sizes), sizes):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="rank 0's device (cuda, cuda:1, cpu)")
    device = parser.parse_args().device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here; run with --device cpu, or on a GPU machine", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides: a tolerance for rounding only
    reference = model_and_data()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(STEPS):
        x, y = model_and_data(step)
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    with socket.socket() as s, tempfile.TemporaryDirectory() as out:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        torch.multiprocessing.spawn(rank_main, args=(port, device, out), nprocs=len(SHARES), join=True)
        ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(len(SHARES))]
    worst = max((w[k] - v).abs().max().item() for w in ranks for k, v in reference.state_dict().items())
    print(f"rank 0 on {device}: share {SHARES[0]}, cap {CAPS[0]} -> micro-batches "
          f"{micro_batch_sizes(SHARES[0], CAPS[0])}; max weight difference to one device: {worst:.3g} "
          f"({'ok' if worst < TOLERANCE else 'FAILED'}, tolerance {TOLERANCE:g})")
    return 0 if worst < TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
