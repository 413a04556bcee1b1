# hetero_ray: `make demo` and `make test` work on a fresh machine (they set everything up).
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(shell date +%Y%m%d-%H%M%S)
DEMO_NAME ?= demo-$(DEMO_STAMP)

.PHONY: setup setup-browser bytecode demo lint test test-fast test-torch-oldest cli-docs bench gpu-check clean

setup:
	@scripts/setup.sh

setup-browser:
	@SETUP_BROWSER=1 scripts/setup.sh

## A short run on a local Ray cluster with four visibly different (emulated) workers.
demo: setup
	$(VENV)/bin/hetero-ray train --model simple_cnn --dataset synthetic_image \
	  --num-samples 6144 --epochs 2 --global-batch-size 96 --num-workers 4 \
	  --emulate-speeds 1,1,0.5,0.25 \
	  --storage-path runs --name $(DEMO_NAME)
	@$(VENV)/bin/hetero-ray report --quiet runs/$(DEMO_NAME)  # the run already printed its summary

## Imports point down only: the contract is [tool.importlinter] in pyproject.toml.
lint: setup
	$(VENV)/bin/lint-imports

## The whole test suite (unit, real local Ray, real gloo groups, browser), after the layers check:
## the tests without Ray run beside the others, in their idle moments (scripts/test.sh).
test: setup-browser bytecode
	$(VENV)/bin/lint-imports
	scripts/test.sh -q -W ignore::DeprecationWarning --durations=30

test-fast: setup bytecode
	$(VENV)/bin/lint-imports
	TEST_MARKER="not slow" scripts/test.sh -q -W ignore::DeprecationWarning --durations=10

## Every process of a run (driver, each Ray actor and worker) imports ~110 of the project's
## modules; without bytecode on disk each compiles them again (~0.2 s of CPU a process), and
## PYTHONDONTWRITEBYTECODE=1 machines never write it. Up-to-date files are skipped.
bytecode: setup
	$(PY) -m compileall -q hetero_ray dashboards tests benchmarks examples jobs

## Weighting, batch norm, model preparation and the loader on the lowest supported torch
## (its own .venv-torch-oldest; a few GB the first time).
test-torch-oldest:
	scripts/test_torch_oldest.sh

## docs/cli.md's reference, written from the parsers (tests/test_cli_docs.py checks it).
cli-docs: setup
	$(PY) -m hetero_ray.cli.reference docs/cli.md

## Benchmarks print figures and ratios (minutes each; not part of the tests).
bench: setup
	$(PY) benchmarks/solver.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/balance.py --speed-change 100:1:0.5 --homogeneous-check
	$(PY) benchmarks/allocator.py
	$(PY) benchmarks/profiler_overhead.py --in-process  # whole runs differ by more than 2 % here (docs/benchmarks.md)
	$(PY) benchmarks/dashboard.py
	$(PY) benchmarks/bench_first_step.py
	$(PY) benchmarks/bench_ray_data.py
	# These two need a writable cgroup v1 cpu controller (they say so and go on without one).
	-$(PY) benchmarks/bench_first_step.py --nodes 2 --num-workers 2 --quota 0.33
	-$(PY) benchmarks/cgroup_cluster.py --cold-start --steps 480

## The GPU check (benchmarks/gpu_check.py): NVML, the profile's curves, GPU alone vs GPU + CPU
## ranks, the API on CUDA, NCCL; one table, logs in one folder. Exits 2 where there is no GPU.
## No setup step: a GPU machine may have no network. It needs Ray, torch with CUDA and
## requirements.txt installed (make setup, where it has network), or a prebuilt bundle of them activated first.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),python3) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf runs .pytest_cache
