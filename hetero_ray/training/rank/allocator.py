"""Keeps freed host memory in the process, so a training step does not page-fault its way
through the same activations every time.

PyTorch's CPU tensors come from ``malloc``. glibc serves large blocks (activations of a
few MB and up) with a fresh ``mmap`` and gives them back with ``munmap`` when freed, so
every step maps, faults in and zeroes its activations again: for ``simple_cnn`` on a
2-core VM that was ~6,100 page faults and ~10 % of the step's CPU time at batch 192, and
~40,000 faults and 20–25 % at batch 280 (``benchmarks/allocator.py``). Raising glibc's
mmap and trim thresholds keeps the freed blocks in the heap for the next step; the price
is that the peak of a step stays resident — which it is again a step later anyway. (It
did not measurably lower the step-to-step jitter there: that is the machine's.) (Intel's
PyTorch CPU tuning guide gets the same from jemalloc/tcmalloc; this needs no extra
library.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above half its largest heap on some versions (32 MiB
# on 64-bit); the first value it accepts wins.
_MMAP_THRESHOLDS = (1 << 30, 32 << 20)
_TRIM_THRESHOLD = (1 << 31) - 1  # never give the top of the heap back between steps


def keep_freed_memory() -> bool:
    """Sets glibc's thresholds for this process; False where there is no glibc ``mallopt``
    (macOS, musl), which leaves the allocator as it was."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not any(mallopt(_M_MMAP_THRESHOLD, value) == 1 for value in _MMAP_THRESHOLDS):
        logger.debug("mallopt refused every mmap threshold; the allocator is left as it was")
        return False
    return mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
