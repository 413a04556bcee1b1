"""The CPU quota a process runs under, read from real cgroup files (v1 and v2 layouts
written to a temporary folder the way the kernel shows them)."""

from __future__ import annotations

import os

import pytest

from hetero_ray.profiling.cgroup import cpu_quota_cores


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _v1(tmp_path, quotas: dict[str, tuple[int, int]], controllers="cpu") -> str:
    for path, (quota, period) in quotas.items():
        directory = os.path.join(tmp_path, "root", controllers, path.strip("/"))
        _write(os.path.join(directory, "cpu.cfs_quota_us"), f"{quota}\n")
        _write(os.path.join(directory, "cpu.cfs_period_us"), f"{period}\n")
    return os.path.join(tmp_path, "root")


def test_v1_quota_of_the_process_cgroup(tmp_path):
    root = _v1(tmp_path, {"/": (-1, 100000), "/ray_node": (33000, 100000)})
    _write(tmp_path / "cgroup", "4:memory:/x\n1:cpu:/ray_node\n0::/\n")
    assert cpu_quota_cores(str(tmp_path / "cgroup"), root) == pytest.approx(0.33)


def test_the_tightest_ancestor_binds(tmp_path):
    root = _v1(tmp_path, {"/": (-1, 100000), "/pod": (50000, 100000), "/pod/container": (200000, 100000)},
               controllers="cpu,cpuacct")
    _write(tmp_path / "cgroup", "3:cpu,cpuacct:/pod/container\n")
    assert cpu_quota_cores(str(tmp_path / "cgroup"), root) == pytest.approx(0.5)


def test_v2_cpu_max(tmp_path):
    _write(tmp_path / "root" / "cpu.max", "max 100000\n")
    _write(tmp_path / "root" / "kubepods" / "cpu.max", "250000 100000\n")
    _write(tmp_path / "cgroup", "0::/kubepods\n")
    assert cpu_quota_cores(str(tmp_path / "cgroup"), str(tmp_path / "root")) == pytest.approx(2.5)


@pytest.mark.parametrize("proc_text, files", [
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}),  # v1, no quota
    ("0::/\n", {"cpu.max": "max 100000"}),  # v2, no quota
    ("0::/gone\n", {}),  # files that cannot be read
])
def test_no_quota_is_none(tmp_path, proc_text, files):
    for name, text in files.items():
        _write(tmp_path / "root" / name, text)
    _write(tmp_path / "cgroup", proc_text)
    assert cpu_quota_cores(str(tmp_path / "cgroup"), str(tmp_path / "root")) is None


def test_no_cgroup_file_is_none(tmp_path):
    assert cpu_quota_cores(str(tmp_path / "missing"), str(tmp_path)) is None
