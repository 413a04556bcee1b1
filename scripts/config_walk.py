"""The walk of the configuration from ``hetero-ray train``: which modules its settings pass
through, in order, and whether any call climbs back up the layers.

    python scripts/config_walk.py [train flags…]

Traces every call into a ``hetero_ray`` module (``sys.setprofile``) while the flags become
a ``TrainConfig``, pass the checks before a run, become the ``HeteroTrainer`` of the
built-in job, and that trainer makes the ``TorchTrainer``, the worker settings and the run
spec: everything the driver does with the configuration before Ray runs anything (no Ray
is started). It runs once before the trace, so that importing a module (its top-level
code) is not counted as a call. Prints the modules in the order they are first entered, the count of stays
(a module entered from another), and each call that goes from a lower layer to a higher
one (the layers of ``pyproject.toml``'s import contract); exits 1 if there is one.
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def layers() -> list[list[str]]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    entries = next(c for c in contracts if c["type"] == "layers")["layers"]
    return [[name.strip() for name in entry.replace(":", "|").split("|")] for entry in entries]


def layer_of(module: str, ordered: list[list[str]]) -> int:
    """The index of the module's layer (0: the top); the last for a module no layer names."""
    for index, names in enumerate(ordered):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    return len(ordered)


def walk(argv: list[str]) -> list[tuple[str, str]]:
    """The (caller module, callee module) of every call between two hetero_ray modules, in order."""
    from hetero_ray.builtin import preflight
    from hetero_ray.builtin.driver import builtin_trainer
    from hetero_ray.cli.main import build_parser
    from hetero_ray.cli.train import config_from_args
    from hetero_ray.runs import storage
    from hetero_ray.runs.folder import RunFolder

    calls: list[tuple[str, str]] = []

    def module_of(frame) -> str:
        return frame.f_globals.get("__name__", "") if frame is not None else ""

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = module_of(frame)
        if not callee.startswith("hetero_ray"):
            return
        caller_frame = frame.f_back
        while caller_frame is not None and not module_of(caller_frame).startswith("hetero_ray"):
            caller_frame = caller_frame.f_back
        caller = module_of(caller_frame)
        if caller and caller != callee:
            calls.append((caller, callee))

    def drive() -> None:
        config = config_from_args(build_parser().parse_args(argv))
        preflight.check(config)
        device_mode = "mixed" if config.cluster.mixed_devices else "cpu"  # "gpu" would need a cluster's GPUs
        trainer = builtin_trainer(config, device_mode, emit=lambda line: None)
        run = storage.resolve(os.path.abspath(config.storage_path), config.name, None)
        trainer._torch_trainer(run, device_mode, first_plan_wait_s=0.0)
        trainer._run_spec(RunFolder(run, trainer._job.words, held=None, locked=False), False, config.cpus_per_worker)

    drive()  # once untraced: what it imports runs its module code then, not in the walk
    sys.setprofile(profile)
    try:
        drive()
    finally:
        sys.setprofile(None)
    return calls


def main(flags: list[str]) -> int:
    ordered = layers()
    with tempfile.TemporaryDirectory() as output_dir:
        calls = walk(["train", *flags, "--storage-path", output_dir, "--name", "walk"])
    first_seen = list(dict.fromkeys(m for call in calls for m in call))
    up = Counter((a, b) for a, b in calls if layer_of(b, ordered) < layer_of(a, ordered))
    print(f"{len(first_seen)} modules, {len(calls)} calls between modules, in the order first entered:")
    for module in first_seen:
        print(f"  [{layer_of(module, ordered):2d}] {module}")
    if not up:
        print("no call climbs back up the layers: every call goes to the caller's layer or one below it")
        return 0
    print(f"{sum(up.values())} call(s) climb back up the layers:")
    for (caller, callee), count in up.most_common():
        print(f"  {caller} → {callee} ({count}×)")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["--model", "mlp"]))
