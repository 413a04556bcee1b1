"""Where a `ray job submit` entrypoint writes: never into Ray's copy of the working dir.

A job's driver runs inside Ray's unpacked copy of ``--working-dir``
(``/tmp/ray/session_*/runtime_resources/working_dir_files/…``), which Ray deletes later.
A relative ``--storage-path`` (``train``'s default ``runs``; the balance benchmark's
``--output-dir``) or ``--json`` would land there and
vanish with it. Inside a Ray job, those paths are resolved against
``HETERO_RAY_JOB_OUTPUT_DIR`` if set, else ``~/hetero_ray``; absolute paths and runs
outside a job are left as given.

Ray's job supervisor marks a job's driver with ``RAY_JOB_CONFIG_JSON_ENV_VAR`` in its
environment (``ray/_private/runtime_env/constants.py``; the name is also its value).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional, Sequence

from hetero_ray.validate import flag_of

RAY_JOB_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
JOB_OUTPUT_DIR_ENV_VAR = "HETERO_RAY_JOB_OUTPUT_DIR"
DEFAULT_JOB_OUTPUT_DIR = "~/hetero_ray"  # the submitting user's home on the head node: outlives the job


def in_ray_job(environ: Optional[dict] = None) -> bool:
    return RAY_JOB_ENV_VAR in (os.environ if environ is None else environ)


def job_output_root(environ: Optional[dict] = None) -> str:
    environ = os.environ if environ is None else environ
    return os.path.abspath(os.path.expanduser(environ.get(JOB_OUTPUT_DIR_ENV_VAR) or DEFAULT_JOB_OUTPUT_DIR))


def resolve_output_paths(command: str, argv: Sequence[str], environ: Optional[dict] = None,
                         emit: Callable[[str], None] = lambda line: print(line, flush=True)) -> list[str]:
    """``argv`` for ``hetero-ray <command>`` (``bench``: benchmarks/balance.py) with its
    output paths made absolute in a Ray job.

    Args:
        command: ``train``, ``profile`` or ``bench``.
        argv: the flags after the command, as given to the entrypoint.

    Returns:
        The flags to run with: unchanged outside a Ray job; inside one, an absolute
        ``--storage-path`` (``--output-dir`` for the benchmark) / ``--json`` appended where the given (or default) one was
        relative (the last occurrence of a flag wins in argparse).
    """
    argv = list(argv)
    if not in_ray_job(environ):
        return argv
    # The real parser: defaults, abbreviations and --flag=value read exactly as main() will.
    if command == "bench":
        from benchmarks.balance import build_parser

        args, _ = build_parser().parse_known_args(argv)
    else:
        from hetero_ray.cli.main import build_parser

        args, _ = build_parser().parse_known_args([command, *argv])
    root = job_output_root(environ)
    added: list[str] = []
    setting = "output_dir" if command == "bench" else "storage_path"  # the bench's flag, the train's
    output_dir = getattr(args, setting, None)
    if command == "bench" and output_dir is None:  # the bench's own default, under the root
        output_dir = os.path.join("runs", time.strftime("bench-%Y%m%d-%H%M%S"))
    if output_dir is not None and not os.path.isabs(os.path.expanduser(output_dir)):
        added += [flag_of(setting), os.path.join(root, output_dir)]
    json_path = getattr(args, "json", None)
    if json_path and not os.path.isabs(os.path.expanduser(json_path)):
        added += ["--json", os.path.join(root, json_path)]
    if added:
        os.makedirs(root, exist_ok=True)
        where = ", ".join(f"{flag} {path}" for flag, path in zip(added[::2], added[1::2]))
        emit(f"[hetero_ray] running as a Ray job: results go to {where} (relative paths resolve against "
             f"{JOB_OUTPUT_DIR_ENV_VAR} or {DEFAULT_JOB_OUTPUT_DIR}, not Ray's temporary copy of the working dir)")
    return argv + added
