# SPDX-License-Identifier: Apache-2.0
"""Device detection on directory trees holding a Jetson's / a PC's files (formats per docs/devices.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.profiler.device import detect_device, parse_l4t_release, parse_part_number, write_profile
from edgesdk.profiler.sensors import parse_nvpmodel, parse_tegrastats, read_device_state
from edgesdk.profiles import load_profile_file

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16
"""
ORIN_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
    "crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm\n"
    "CPU implementer\t: 0x41\nCPU part\t: 0xd42\n\n"
    for i in range(6)
)
L4T_RELEASE = (
    "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
    "DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
)


def _meminfo(total_kb: int) -> str:
    return (
        f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb // 2} kB\nMemAvailable:   {total_kb * 3 // 4} kB\n"
    )


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def test_orin_nano_identified_by_part_number_in_compatible(tmp_path):
    root = _tree(
        tmp_path,
        {
            "proc/device-tree/model": b"NVIDIA Jetson Orin Nano Developer Kit\0",
            "proc/device-tree/compatible": b"nvidia,p3768-0000+p3767-0003\0nvidia,p3767-0003\0nvidia,tegra234\0",
            "etc/nv_tegra_release": L4T_RELEASE,
            "proc/cpuinfo": ORIN_CPUINFO,
            "proc/meminfo": _meminfo(7_620_000),
        },
    )
    result = detect_device(root)
    assert result.kind == "jetson" and result.arch == "aarch64"
    assert result.best_match == "orin-nano-8gb"
    assert result.confidence >= 0.9
    assert result.jetson["module_part_number"] == "p3767-0003"
    assert result.jetson["l4t"] == "36.4.3"
    assert result.jetson["platform"] == "tegra234"
    assert any("p3767-0003" in e for e in result.evidence)
    assert "asimd" in result.cpu["flags"] and result.cpu["logical_cores"] == 6
    # Tools of this machine are not the fixture's: not run, reported as unavailable.
    assert result.jetson["nvpmodel"] is None and result.jetson["tegrastats"] is None


def test_agx_orin_64gb_from_boot_control_tnspec(tmp_path):
    root = _tree(
        tmp_path,
        {
            "proc/device-tree/model": b"Jetson AGX Orin\0",
            "proc/device-tree/compatible": b"nvidia,tegra234\0",
            "etc/nv_boot_control.conf": "TNSPEC 3701-500-0005-G.0-1-0-jetson-agx-orin-devkit-mmcblk0p1\n"
            "COMPATIBLE_SPEC 3701--0005--1--jetson-agx-orin-devkit-\n",
            "etc/nv_tegra_release": L4T_RELEASE,
            "proc/cpuinfo": ORIN_CPUINFO,
            "proc/meminfo": _meminfo(64_300_000),
        },
    )
    result = detect_device(root)
    assert result.best_match == "orin-agx-64gb"
    assert result.jetson["module_part_number"] == "p3701-0005"
    assert result.jetson["part_number_source"] == "etc/nv_boot_control.conf"


def test_orin_without_part_number_matches_on_model_and_memory_with_lower_confidence(tmp_path):
    root = _tree(
        tmp_path,
        {
            "proc/device-tree/model": b"NVIDIA Orin NX Developer Kit\0",
            "proc/device-tree/compatible": b"nvidia,tegra234\0",
            "proc/cpuinfo": ORIN_CPUINFO,
            "proc/meminfo": _meminfo(15_300_000),
        },
    )
    result = detect_device(root)
    assert result.best_match == "orin-nx-16gb"
    assert 0.5 < result.confidence < 0.95
    nx8 = next(c for c in result.candidates if c["profile"] == "orin-nx-8gb")
    assert nx8["confidence"] < result.confidence  # 15.3 GB does not fit an 8 GB module


def test_cpu_host_matches_generic_profile(tmp_path):
    root = _tree(tmp_path, {"proc/cpuinfo": X86_CPUINFO, "proc/meminfo": _meminfo(24_000_000)})
    result = detect_device(root)
    assert (result.kind, result.arch, result.best_match) == ("cpu", "x86_64", "cpu-x86_64")
    assert result.cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx512_vnni", "amx_int8"} <= set(result.cpu["flags"])
    assert result.memory["total_gb"] == pytest.approx(24.58, abs=0.01)


def test_parsers_on_tool_output_formats():
    line = (
        "RAM 2448/7620MB (lfb 1x4MB) SWAP 0/3810MB (cached 0MB) CPU [1%@1510,0%@1510,off,off] "
        "EMC_FREQ 0%@2133 GR3D_FREQ 12%@[624] cpu@47.5C soc2@46.8C tj@48.1C "
        "VDD_IN 4506mW/4506mW VDD_CPU_GPU_CV 561mW/561mW VDD_SOC 1323mW/1323mW"
    )
    ts = parse_tegrastats(line)
    assert ts["ram_used_mb"] == 2448 and ts["ram_total_mb"] == 7620
    assert ts["gr3d_freq"] == {"load_pct": 12, "mhz": 624}
    assert ts["emc_freq"]["mhz"] == 2133
    assert ts["temperatures_c"]["tj"] == 48.1
    assert ts["power_mw"] == {"VDD_IN": 4506, "VDD_CPU_GPU_CV": 561, "VDD_SOC": 1323}
    assert parse_nvpmodel("NV Power Mode: 15W\n0\n") == {"mode": "15W", "id": 0}
    assert parse_nvpmodel("nvpmodel: command not found") is None
    assert parse_l4t_release("# R35 (release), REVISION: 4.1, GCID: 33958178") == "35.4.1"
    assert parse_part_number("nvidia,p3768-0000+p3767-0004") == "p3767-0004"
    assert parse_part_number("nvidia,tegra234") is None


def test_unreadable_sensors_are_unavailable_not_zero(tmp_path):
    state = read_device_state(tmp_path)
    assert state["cpu_governor"] is None and state["cpu0_mhz"] is None and state["temperatures_c"] is None
    _tree(
        tmp_path,
        {
            "sys/class/thermal/thermal_zone0/temp": "45500\n",
            "sys/class/thermal/thermal_zone0/type": "cpu-thermal\n",
            "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "schedutil\n",
        },
    )
    state = read_device_state(tmp_path)
    assert state["temperatures_c"] == {"cpu-thermal": 45.5}
    assert state["cpu_governor"] == "schedutil"


@pytest.mark.slow
def test_write_profile_is_valid_and_carries_measured_bandwidth(tmp_path):
    root = _tree(tmp_path / "root", {"proc/cpuinfo": X86_CPUINFO, "proc/meminfo": _meminfo(24_000_000)})
    result = detect_device(root)
    path = write_profile(result, tmp_path / "my-box.yaml")
    profile = load_profile_file(path)  # validates the schema
    assert profile.name == "my-box"
    bw = profile.data["device"]["memory"]["bandwidth_gbps"]
    assert bw["status"] == "measured" and bw["value"] > 0.5
    assert "numpy.copyto" in bw["source"]
    assert profile.data["device"]["peak"]["fp32_tflops"]["status"] == "measured"
    assert profile.figure("device.memory.total_gb") == pytest.approx(24.58, abs=0.01)
    assert profile.data["measured"]["best_match"] == "cpu-x86_64"
