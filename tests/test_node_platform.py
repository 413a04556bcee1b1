"""A node says which platform it runs on, and a Windows machine in WSL2 says ``wsl2``: read
from the kernel's version string (Python inside WSL2 says "Linux"), shown by
``hetero-ray profile``'s line per node and on the app's cluster page. The strings are
those real kernels print; no Ray."""

from __future__ import annotations

import pandas as pd
import pytest

from hetero_ray.profiling import inventory
from hetero_ray.profiling.capability import CpuInfo, DeviceCapability, NodeCapability
from hetero_ray.profiling.node_text import describe_node
from hetero_ray.reporting import frames

WSL2_RELEASE = "5.15.167.4-microsoft-standard-WSL2"
WSL2_PROC_VERSION = ("Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc (GCC) 11.2.0, "
                     "GNU ld (GNU Binutils) 2.37) #1 SMP Tue Nov 5 00:21:55 UTC 2024")
UBUNTU_RELEASE = "6.8.0-49-generic"
UBUNTU_PROC_VERSION = ("Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) (x86_64-linux-gnu-gcc-12 (Ubuntu "
                       "12.3.0-1ubuntu1~22.04) 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #49~22.04.1-Ubuntu SMP")


@pytest.mark.parametrize("system, release, proc_version, expected", [
    ("Linux", WSL2_RELEASE, WSL2_PROC_VERSION, "wsl2"),
    ("Linux", "6.6.36.3-microsoft-standard+", "Linux version 6.6.36.3-microsoft-standard+ (custom)", "wsl2"),
    ("Linux", "5.15.0", WSL2_PROC_VERSION, "wsl2"),  # the release hidden, /proc/version still tells
    ("Linux", "4.4.0-19041-Microsoft", "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com)", "wsl1"),
    ("Linux", UBUNTU_RELEASE, UBUNTU_PROC_VERSION, "linux"),
    ("Linux", "6.1.0-28-cloud-amd64", "", "linux"),  # no /proc/version: the release alone
    ("Darwin", "24.1.0", "", "darwin"),
    ("Windows", "10", "", "windows"),
])
def test_the_platform_comes_from_the_kernels_version_string(system, release, proc_version, expected):
    assert inventory.platform_from(system, release, proc_version) == expected


def test_this_node_reads_its_own_kernel(monkeypatch, tmp_path):
    version = tmp_path / "version"
    version.write_text(WSL2_PROC_VERSION)
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(version if path == "/proc/version" else path,
                                                                         *a, **k))
    monkeypatch.setattr(inventory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(inventory.platform, "release", lambda: WSL2_RELEASE)
    assert inventory.node_platform() == "wsl2"


def _node(platform):
    return NodeCapability(node_id="1a2b3c4d5e6f", ip="10.0.0.7", hostname="gaming-pc", platform=platform,
                          cpu=CpuInfo(model="AMD Ryzen 9 7950X", physical_cores=16),
                          devices=[DeviceCapability(kind="cpu", name="AMD Ryzen 9 7950X", index=0,
                                                    matmul_tflops_fp32=0.9)])


def test_hetero_ray_profile_names_a_wsl2_node_and_keeps_a_linux_line_as_it_was():
    assert describe_node(_node("wsl2")).startswith("node 1a2b3c4d (10.0.0.7, wsl2): cpu 0.9 TFLOPS fp32")
    assert describe_node(_node("linux")).startswith("node 1a2b3c4d (10.0.0.7): cpu")
    assert describe_node(_node(None)).startswith("node 1a2b3c4d (10.0.0.7): cpu")  # a nodes.json from before


def test_hetero_ray_profiles_summary_names_each_nodes_platform():
    from hetero_ray.cli.profile import profile_report

    report = profile_report([_node("wsl2"), _node("linux"), _node(None)])
    assert "node 1a2b3c4d (gaming-pc, wsl2): ok" in report
    assert "node 1a2b3c4d (gaming-pc, linux): ok" in report
    assert "node 1a2b3c4d (gaming-pc): ok" in report  # a nodes.json from before


def test_the_platform_travels_in_nodes_json_and_reaches_the_cluster_page():
    recorded = _node("wsl2").to_dict()
    assert recorded["platform"] == "wsl2"
    assert NodeCapability.from_dict(recorded).platform == "wsl2"
    older = {k: v for k, v in recorded.items() if k != "platform"}
    assert NodeCapability.from_dict(older).platform is None
    table = frames.nodes_frame([recorded, _node("linux").to_dict() | {"node_id": "ffff0000"}],
                               pd.DataFrame(), live=False, now=0.0)
    assert list(table["platform"]) == ["wsl2", "linux"]
    assert list(table.columns[:3]) == ["node_id", "host", "platform"]
