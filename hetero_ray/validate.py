"""The checks every configuration shares: :class:`~hetero_ray.builtin.config.TrainConfig`'s parts,
:class:`~hetero_ray.hetero_config.HeteroConfig` and
:class:`~hetero_ray.profiling.profile_config.ProfileConfig` reject a value with the same
words, naming the setting the way its user wrote it.

A setting has one name, its field's (``global_batch_size``); :func:`named` writes it in the
words in force — its flag ``--global-batch-size`` (the command line, job entrypoints,
config.json), ``HeteroConfig.global_batch_size`` under the API's :func:`words` — so a part
checks its fields once for every front end. Each check raises
:class:`~hetero_ray.errors.ConfigError` or returns the value in the form the configs store
(a list for a sequence, a float for a number); ``name`` is the setting as :func:`named` wrote it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Sequence

from hetero_ray.errors import ConfigError


def flag_of(setting: str) -> str:
    """The flag of a setting: ``profile_timeout_s`` → ``--profile-timeout-s``."""
    return "--" + setting.replace("_", "-")


@dataclass(frozen=True)
class Words:
    """How a front end writes its settings: as flags (``--global-batch-size``, the default), or
    as fields of its class (``HeteroConfig.global_batch_size``), with those it takes from
    another class under that one's name (``{"num_workers": "ScalingConfig"}``)."""

    owner: Optional[str] = None
    elsewhere: Mapping[str, str] = field(default_factory=dict)

    def name(self, setting: str) -> str:
        if self.owner is None:
            return flag_of(setting)
        return f"{self.elsewhere.get(setting, self.owner)}.{setting}"


_WORDS: contextvars.ContextVar[Words] = contextvars.ContextVar("hetero_ray.words", default=Words())


def named(setting: str) -> str:
    """``setting`` as its user wrote it, in the words in force (its flag, unless a front end chose others)."""
    return _WORDS.get().name(setting)


@contextlib.contextmanager
def words(in_force: Words) -> Iterator[None]:
    """Checks inside name each setting in ``in_force``'s words."""
    token = _WORDS.set(in_force)
    try:
        yield
    finally:
        _WORDS.reset(token)


# What a probe needs: the fit t(b) = α + β·b has two unknowns.
MIN_PROBE_SIZES = 2


def choice(name: str, value, choices: Sequence) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def switch(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


def optional_path(name: str, value):
    """None, or a folder's path as text (a ``pathlib.Path`` is taken and stored as text)."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a folder's path (a str or pathlib.Path) or None, got {value!r}")
    return value


def positive_int(name: str, value) -> int:
    if not _is_int(value) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def positive_number(name: str, value, unit: str = "") -> float:
    """A finite number > 0; ``unit`` (e.g. ``"seconds"``) completes the message."""
    if not _is_number(value) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a positive number{' of ' + unit if unit else ''}, got {value!r}")
    return float(value)


def fraction(name: str, value, of: str = "") -> float:
    """A number in (0, 1]: a part of something that cannot be none of it (a speed, a share of RAM)."""
    if not _is_number(value) or not 0 < value <= 1:
        raise ConfigError(f"{name} must be in (0, 1]{_fraction_of(of)}, got {value!r}")
    return float(value)


def fraction_below_one(name: str, value, of: str = "") -> float:
    """A number in [0, 1): a margin that may be none but not all of something (a gain)."""
    if not _is_number(value) or not 0 <= value < 1:
        raise ConfigError(f"{name} must be in [0, 1){_fraction_of(of)}, got {value!r}")
    return float(value)


DEVICE_KINDS = ("gpu", "cpu")  # a worker's device kind, as the node label hetero-ray.io/device names it


def device_kinds(name: str, values) -> list[str]:
    """One device kind per worker, each gpu or cpu."""
    kinds = sequence(name, values)
    if not kinds or any(kind not in DEVICE_KINDS for kind in kinds):
        raise ConfigError(f"{name} must give each worker gpu or cpu (e.g. gpu,gpu,cpu), got {values!r}")
    return kinds


def sequence(name: str, values: Iterable) -> list:
    """Any sequence (a list, a tuple) as a list; text and mappings are not sequences here."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise ConfigError(f"{name} must be a list of values, got {values!r}")
    return list(values)


def fractions(name: str, values, of: str = "") -> list[float]:
    """A non-empty sequence of numbers in (0, 1], e.g. one emulated speed per rank."""
    values = sequence(name, values)
    if not values or not all(_is_number(v) and 0 < v <= 1 for v in values):
        raise ConfigError(f"{name} values must be in (0, 1]{_fraction_of(of)}, got {values}")
    return [float(v) for v in values]


def int_list(name: str, values) -> list[int]:
    values = sequence(name, values)
    if not all(_is_int(v) for v in values):
        raise ConfigError(f"{name} values must be integers, got {values}")
    return values


def probe_sizes(name: str, values) -> list[int]:
    """Batch sizes to time a model at: positive, two or more different ones; sorted, distinct."""
    sizes = sequence(name, values)
    if not sizes or not all(_is_int(b) and b >= 1 for b in sizes):
        raise ConfigError(f"{name} must be positive integers like 8,16,32,64; got {sizes}")
    if len(set(sizes)) < MIN_PROBE_SIZES:
        raise ConfigError(f"{name} needs two or more different positive sizes to fit t(b) = α + β·b, "
                          f"got {sizes}")
    return sorted(set(sizes))


def shares(name: str, sizes, total: int, total_name: str, *, may_leave_out: bool = False) -> list[int]:
    """Local batch sizes ``b_i ≥ 1`` with ``Σ b_i = B`` (one plan of the global batch);
    ``may_leave_out``: ``b_i = 0`` leaves rank ``i`` out, but rank 0 stays in (it holds
    the run's state: see :mod:`hetero_ray.planning.subset`)."""
    sizes = int_list(name, sizes)
    if may_leave_out and (any(b < 0 for b in sizes) or not sizes or sizes[0] < 1):
        raise ConfigError(f"{name} values must be ≥ 0 (0 leaves a rank out) with rank 0's ≥ 1, got {sizes}")
    if not may_leave_out and any(b < 1 for b in sizes):
        raise ConfigError(f"{name} values must be ≥ 1 (every rank needs a sample per step), got {sizes}")
    if sum(sizes) != total:
        raise ConfigError(f"{name} sums to {sum(sizes)}, but {total_name} is {total} "
                          f"(got {','.join(map(str, sizes))})")
    return sizes


def per_rank(name: str, values: Sequence, num_workers: int) -> None:
    if len(values) != num_workers:
        raise ConfigError(f"{name} has {len(values)} values but {named('num_workers')} is {num_workers}; "
                          "give one value per rank")


def speed_changes(name: str, changes) -> list[dict]:
    """Emulated slowdowns ``{"global_step", "rank", "speed"}``: from that step on, that rank
    runs at that fraction of its real speed."""
    out = []
    for change in sequence(name, changes):
        if not (isinstance(change, dict) and set(change) == {"global_step", "rank", "speed"}
                and _is_int(change["global_step"]) and change["global_step"] >= 0
                and _is_int(change["rank"]) and change["rank"] >= 0
                and _is_number(change["speed"]) and 0 < change["speed"] <= 1):
            raise ConfigError(f"{name}: each change has the keys global_step and rank (integers ≥ 0) and "
                              f"speed (in (0, 1]); got {change!r}")
        out.append({**change, "speed": float(change["speed"])})
    return out


def plan_changes(name: str, changes) -> list[dict]:
    """Scripted plans ``{"global_step", "local_batch_sizes"}``; the sizes are checked as
    :func:`shares` by whoever knows the global batch."""
    out = []
    for change in sequence(name, changes):
        if not (isinstance(change, dict) and set(change) == {"global_step", "local_batch_sizes"}
                and _is_int(change["global_step"]) and change["global_step"] >= 0):
            raise ConfigError(f"{name}: each change has the keys global_step (an integer ≥ 0) and "
                              f"local_batch_sizes; got {change!r}")
        step = change["global_step"]
        out.append({"global_step": step, "local_batch_sizes": int_list(f"{name} at step {step}",
                                                                       change["local_batch_sizes"])})
    return out


def _fraction_of(of: str) -> str:
    return f" (a fraction of {of})" if of else ""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
