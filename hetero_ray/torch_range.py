"""The torch versions hetero_ray runs on, checked when the package is imported.

A GPU machine usually comes with the torch its image was built with, and reinstalling a
CUDA build of torch is gigabytes; so the range is as wide as the code allows, and every
use of an API newer than its lower bound has a fallback (see ``training/gradients/batchnorm.py``).
Outside the range, training could fail deep inside a worker (and be retried as a worker
failure) or, worse, compute something else: stop at import instead, naming the versions.
The lowest version is tested by ``make test-torch-oldest``.
"""

from __future__ import annotations

import re
from importlib import metadata

TORCH_MIN = (2, 11)  # the torch of current CUDA images (2.11 + cu130); tested by make test-torch-oldest
TORCH_BELOW = (2, 15)  # newest tested: 2.14 (requirements.txt)


def parse_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` → ``(2, 11)``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(match.group(1)), int(match.group(2))


def range_text() -> str:
    return f">={TORCH_MIN[0]}.{TORCH_MIN[1]},<{TORCH_BELOW[0]}.{TORCH_BELOW[1]}"


def check_torch_version(installed: str) -> None:
    """Raises ImportError when ``installed`` is outside the supported range."""
    if not TORCH_MIN <= parse_version(installed) < TORCH_BELOW:
        raise ImportError(f"hetero_ray needs torch{range_text()}, but torch {installed} is installed; install a "
                          f"torch in that range (e.g. pip install 'torch{range_text()}') or a hetero_ray release "
                          "made for your torch")


def installed_torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # torch from a source tree or an image without metadata
        return None
