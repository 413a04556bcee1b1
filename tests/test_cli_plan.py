"""``hetero-ray plan``: curves, plan and predictions from a saved profile, no Ray.

On the real H100 profile (resnet18, probed at 8…64 before the curve had a floor) it refits
the GPU's curve from the probe, prints it with its error at every probed size (all within
10 %), the plan and its predicted step time; ``--json`` writes the same. Bad profiles exit 2.
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from hetero_ray.profiling.capability import CpuInfo, DeviceCapability, NodeCapability, write_nodes_json
from tests import cli
from tests.helpers import H100_PROFILE, h100_document, with_cpu_probe

def write(tmp_path, document, name="nodes.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def test_plan_on_the_h100_profile_prints_and_writes_the_curve_and_the_plan(tmp_path, capsys):
    out_json = tmp_path / "plan.json"
    code, out, err = cli.run_cli(["plan", "--profile", str(H100_PROFILE), "--global-batch-size", "64",
                                  "--json", str(out_json)], capsys)
    assert code == 0, err
    assert "NVIDIA H100 80GB HBM3: flat" in out and "refitted from the probe" in out
    for b in (8, 16, 32, 64):
        assert any(line.split()[:1] == [str(b)] for line in out.splitlines()), b
    assert "predicted step time" in out and "samples/s" in out
    report = json.loads(out_json.read_text())
    (gpu,) = report["devices"]
    assert [p["batch_size"] for p in gpu["probe"]] == [8, 16, 32, 64]
    for p in gpu["probe"]:
        assert abs(p["predicted_busy_time_s"] - p["measured_busy_time_s"]) / p["measured_busy_time_s"] < 0.10
    assert gpu["max_rel_error"] < 0.10 and gpu["shape"] == "flat"
    (rank,) = report["workers"]
    assert rank["local_batch_size"] == 64 and rank["kind"] == "gpu"
    # flat over the probe: 64 samples cost the floor, not 4.4× it as the old line said
    assert report["predicted_step_time_s"] == pytest.approx(gpu["floor_s"])
    assert report["samples_per_s"] == pytest.approx(64 / report["predicted_step_time_s"])


def test_a_mixed_plan_gives_the_gpu_what_the_cpus_cannot_finish_within_its_floor(tmp_path, capsys):
    path = write(tmp_path, with_cpu_probe(h100_document()))
    out_json = tmp_path / "plan.json"
    code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "64", "--workers", "gpu,cpu*3",
                                  "--model", "resnet18", "--json", str(out_json)], capsys)
    assert code == 0, err
    report = json.loads(out_json.read_text())
    sizes = [w["local_batch_size"] for w in report["workers"]]
    assert sum(sizes) == 64 and [w["kind"] for w in report["workers"]] == ["gpu", "cpu", "cpu", "cpu"]
    # each CPU rank takes what it finishes within the GPU's ~6.9 ms floor: (6.9 − 1)/0.5 ≈ 11
    assert sizes[1] == sizes[2] == sizes[3] and 9 <= sizes[1] <= 12
    assert report["predicted_step_time_s"] == pytest.approx(max(w["predicted_busy_time_s"] for w in report["workers"]))
    assert len(report["devices"]) == 2


def test_with_the_allreduce_the_plan_leaves_out_the_cpu_ranks_that_cost_more_than_they_add(tmp_path, capsys):
    """The H100 with three CPU ranks ran at 0.49 of the H100 alone: their all-reduce (2.6 ms)
    cost more than the ~1/3 of the batch they took off a GPU that is flat at 64 samples."""
    path = write(tmp_path, with_cpu_probe(h100_document()))
    reports = {}
    for allreduce in ("2.6", "0"):
        out_json = tmp_path / f"plan-{allreduce}.json"
        code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "64", "--workers", "gpu,cpu*3",
                                      "--allreduce-ms", allreduce, "--json", str(out_json)], capsys)
        assert code == 0, err
        reports[allreduce] = json.loads(out_json.read_text())
    left_out = reports["2.6"]
    assert [w["local_batch_size"] for w in left_out["workers"]] == [64, 0, 0, 0]
    assert left_out["left_out_ranks"] == [1, 2, 3]
    gpu_alone = left_out["workers"][0]["predicted_busy_time_s"]
    assert left_out["predicted_comm_time_s"] == 0.0 and left_out["predicted_step_time_s"] == pytest.approx(gpu_alone)
    assert left_out["all_ranks_predicted_step_time_s"] > left_out["predicted_step_time_s"] + 2.0e-3
    everyone = reports["0"]  # a free all-reduce: every rank in, the compute-only plan
    assert everyone["left_out_ranks"] == [] and min(w["local_batch_size"] for w in everyone["workers"]) >= 9


def test_the_plan_says_when_communication_is_not_modelled(tmp_path, capsys):
    path = write(tmp_path, with_cpu_probe(h100_document()))
    code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "64", "--workers", "gpu,cpu*3"], capsys)
    assert code == 0, err
    assert "communication not modelled: give --allreduce-ms" in out
    code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "64", "--workers", "gpu,cpu*3",
                                  "--allreduce-ms", "2.6"], capsys)
    assert code == 0, err
    assert "left out: ranks 1, 2, 3" in out and "all-reduce 0.000 ms" in out


def test_plan_reads_what_the_profiler_writes(tmp_path, capsys):
    """A nodes.json written by the profile's own writer, with today's curve fields."""
    gpu = DeviceCapability("gpu", "Some GPU", 0, alpha_s=-0.004, beta_s_per_sample=2e-5, floor_s=0.006,
                           fit_shape="floor+line", fit_max_rel_error=0.02, max_batch_size=4096,
                           probe=[{"batch_size": b, "busy_time_s": max(0.006, -0.004 + 2e-5 * b)}
                                  for b in (8, 64, 512, 1024, 2048)])
    cpu = DeviceCapability("cpu", "Some CPU", alpha_s=0.002, beta_s_per_sample=1e-3, floor_s=0.0, fit_shape="line",
                           max_batch_size=1000, probe=[{"batch_size": b, "busy_time_s": 0.002 + 1e-3 * b}
                                                       for b in (8, 16, 32, 64)])
    nodes = [NodeCapability("a" * 56, ip="10.0.0.1", hostname="gpu-node", cpu=CpuInfo(), devices=[cpu, gpu]),
             NodeCapability("b" * 56, ip="10.0.0.2", hostname="cpu-node", cpu=CpuInfo(), devices=[cpu])]
    path = str(tmp_path / "nodes.json")
    write_nodes_json(path, nodes, "simple_cnn", [8, 16, 32, 64])
    out_json = tmp_path / "plan.json"
    code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "1024", "--json", str(out_json),
                                  "--workers", "gpu-node:gpu,10.0.0.2:cpu*2"], capsys)
    assert code == 0, err
    assert "refitted" not in out and "floor+line" in out
    report = json.loads(out_json.read_text())
    sizes = [w["local_batch_size"] for w in report["workers"]]
    assert sum(sizes) == 1024 and sizes[0] > 900
    # the CPU ranks share one node's RAM cap: 1000 // 2 each
    assert [w["max_batch_size"] for w in report["workers"]] == [4096, 500, 500]
    assert all(abs(p["rel_error"]) < 1e-9 for d in report["devices"] for p in d["probe"])
    # default workers: the GPU, and the CPU of the node without one
    code, out, err = cli.run_cli(["plan", "--profile", path, "--global-batch-size", "1024", "--json", str(out_json)], capsys)
    assert code == 0, err
    assert [(w["node_id"][0], w["kind"]) for w in json.loads(out_json.read_text())["workers"]] == [("a", "gpu"),
                                                                                                   ("b", "cpu")]


def no_probe(document):
    document = copy.deepcopy(document)
    for device in document["nodes"][0]["devices"]:
        device.update(alpha_s=None, beta_s_per_sample=None, probe=[])
    return document


BAD = [
    # (id, profile: a document, a string written as is, or None for a missing file; extra flags; message)
    ("missing file", None, [], "no such file; write one with `hetero-ray profile"),
    ("not JSON", "{nodes: [", [], "is not JSON"),
    ("not a profile", {"hello": 1}, [], "has no list of nodes: not a nodes.json"),
    ("nodes not dicts", {"nodes": [1, 2]}, [], "has no list of nodes"),
    ("no probes", "no_probe", [], "holds no model probe"),
    ("model mismatch", "h100", ["--model", "simple_cnn"], "probed resnet18, not simple_cnn"),
    ("bad workers", "h100", ["--workers", "tpu*2"], "expected [NODE:]KIND[*COUNT]"),
    ("zero count", "h100", ["--workers", "gpu*0"], "COUNT ≥ 1"),
    ("unknown node", "h100", ["--workers", "deadbeef:gpu"], "'deadbeef' names no node of the profile"),
    ("unprobed cpu", "h100", ["--workers", "gpu,cpu"], "no cpu with a model probe in the profile"),
    ("too many gpus", "h100", ["--workers", "gpu*2"], "no gpu left in the profile"),
    ("negative all-reduce", "h100", ["--allreduce-ms", "-1"], "--allreduce-ms must be a number of milliseconds ≥ 0"),
    ("nan all-reduce", "h100", ["--allreduce-ms", "nan"], "--allreduce-ms must be a number of milliseconds ≥ 0"),
    ("batch below workers", "h100_cpu", ["--workers", "gpu,cpu*3", "--global-batch-size", "3"],
     "smaller than the 4 workers"),
    ("zero batch", "h100", ["--global-batch-size", "0"], "--global-batch-size must be a positive integer"),
]


@pytest.mark.parametrize("profile, extra, message", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_profiles_and_flags_exit_2_with_a_clear_message(tmp_path, capsys, profile, extra, message):
    if profile is None:
        path = str(tmp_path / "missing.json")
    elif isinstance(profile, str) and profile in ("h100", "h100_cpu", "no_probe"):
        document = {"h100": h100_document, "h100_cpu": lambda: with_cpu_probe(h100_document()),
                    "no_probe": lambda: no_probe(h100_document())}[profile]()
        path = write(tmp_path, document)
    elif isinstance(profile, str):
        path = str(tmp_path / "nodes.json")
        pathlib.Path(path).write_text(profile)
    else:
        path = write(tmp_path, profile)
    argv = ["plan", "--profile", path, "--global-batch-size", "64", *extra]
    if "--global-batch-size" in extra:
        argv = ["plan", "--profile", path, *extra]
    code, out, err = cli.run_cli(argv, capsys)
    assert code == 2, (out, err)
    assert message in err, err
    assert not list(tmp_path.glob("*.tmp"))
