# SPDX-License-Identifier: Apache-2.0
"""edgesdk.host: one probe of this machine, readable on a fake root, constructible in tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk import host
from edgesdk.formats.tensorrt.engine import preflight
from edgesdk.host import GpuInfo, HostFacts, JetsonFacts, probe

REPO = Path(__file__).resolve().parents[1]


def _jetson_tree(root):
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "proc/device-tree/compatible").write_bytes(b"nvidia,p3768-0000+p3767-0000\0nvidia,tegra234\0")
    (root / "proc/device-tree/model").write_text("NVIDIA Jetson Orin NX Engineering Reference Developer Kit\0")
    (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic")
    (root / "proc/cpuinfo").write_text(
        "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\nprocessor\t: 1\nFeatures\t: fp asimd asimddp i8mm\n"
    )


def test_probe_reads_a_jetson_tree_without_nvml(tmp_path, monkeypatch):
    _jetson_tree(tmp_path)

    def no_nvml():  # a fake root must never reach the real machine's NVML
        raise AssertionError("NVML probed for a fake root")

    monkeypatch.setattr(host, "read_gpus", no_nvml)
    facts = probe(str(tmp_path))
    assert facts.jetson == JetsonFacts(
        model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        platform="tegra234",
        l4t="36.4.3",
        sm="8.7",
        sm_source=host.TEGRA_SM_SOURCE,
        compatible=("nvidia,p3768-0000+p3767-0000", "nvidia,tegra234"),
        module_part_number="p3767-0000",
        part_number_source="proc/device-tree/compatible",
    )
    assert (facts.sm, facts.arch, facts.gpus, facts.trtexec) == ("8.7", "aarch64", (), None)
    assert facts.cpu_flags == ("asimd", "asimddp", "i8mm") and facts.logical_cores == 2
    assert any("L4T 36.4.3" in e and "sm_8.7" in e for e in facts.evidence)
    assert probe(str(tmp_path)) is facts  # cached per root
    env = facts.tensorrt_env()
    assert (env["platform"], env["sm"], env["l4t"]) == ("tegra234", "8.7", "36.4.3")


def test_probe_of_a_plain_tree_says_no_gpu_was_probed(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor : 0\nmodel name : Test CPU\nflags : fpu avx2 avx512f\n")
    facts = probe(str(tmp_path))
    assert facts.jetson is None and facts.sm is None and facts.cpu_model == "Test CPU"
    assert facts.cpu_flags == ("avx2", "avx512f") and facts.arch == "x86_64"
    assert any("not this machine's root" in e for e in facts.evidence)


def test_non_nvidia_device_tree_is_not_a_jetson(tmp_path):
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/compatible").write_bytes(b"raspberrypi,5-model-b\0brcm,bcm2712\0")
    assert host.read_jetson_identity(tmp_path) is None


def test_real_probe_and_dict():
    facts = probe()
    d = facts.to_dict()
    assert set(d) >= {
        "os",
        "arch",
        "python",
        "tensorrt",
        "tensorrt_reason",
        "trtexec",
        "gpus",
        "jetson",
        "versions",
        "evidence",
        "onnxruntime_providers",
        "sm",
    }
    assert d["versions"]["python"] == facts.python and "edgesdk" in d["versions"]
    if facts.tensorrt is None:
        assert "TensorRT Python API not importable" in facts.tensorrt_reason
    assert facts.trtexec == host.find_trtexec()


def test_tool_versions_reads_metadata_and_skips_absent():
    got = host.tool_versions(("numpy", "no-such-distribution-edgesdk"))
    assert set(got) == {"numpy"} and got["numpy"][0].isdigit()


def test_find_trtexec_prefers_path_then_the_jetpack_location(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    fallback = tmp_path / "usr-src-trtexec"
    monkeypatch.setattr(host, "TRTEXEC_FALLBACK_PATH", fallback)
    assert host.find_trtexec() is None
    fallback.write_text("")
    assert host.find_trtexec() == str(fallback)
    on_path = tmp_path / "trtexec"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert host.find_trtexec() == str(on_path)


def test_constructed_facts_drive_preflight():
    a10 = HostFacts(tensorrt="10.3.0", gpus=(GpuInfo(index=0, name="NVIDIA A10", sm="8.6"),))
    assert a10.sm == "8.6" and a10.gpu_name == "NVIDIA A10"
    assert preflight({"sm": "8.7", "tensorrt": "10.3"}, a10) == ["engine targets sm_8.7, this GPU is sm_8.6"]
    orin = HostFacts(tensorrt="10.3.0", jetson=JetsonFacts(platform="tegra234", sm="8.7", l4t="36.4.3"))
    assert preflight({"sm": "8.7", "tensorrt": "10.3", "l4t": "36.4"}, orin) == []
    assert preflight({"sm": "8.7"}, HostFacts()) == ["no NVIDIA GPU here", "TensorRT is not installed here"]


def test_nvml_block_yields_none_without_a_driver():
    with host.nvml() as nv:
        if nv is not None:
            pytest.skip("NVML works on this host")
        assert nv is None
    assert host.gpu_free_bytes(0) is None


def test_doctor_reports_from_the_facts_it_is_given():
    from edgesdk.doctor import diagnose

    orin = HostFacts(
        jetson=JetsonFacts(model="Jetson AGX Orin", platform="tegra234", l4t="36.4.3", sm="8.7", sm_source="test"),
        trtexec="/usr/src/tensorrt/bin/trtexec",
        tensorrt_reason="TensorRT Python API not importable (test)",
    )
    rows = {r["component"]: r for r in diagnose(orin)}
    gpu = rows["NVIDIA GPU"]
    assert gpu["available"] and gpu["version"] == "L4T 36.4.3" and "sm_8.7" in gpu["detail"]
    assert rows["trtexec"] == {
        "component": "trtexec",
        "available": True,
        "version": None,
        "detail": "/usr/src/tensorrt/bin/trtexec",
    }
    trt = rows["TensorRT (Python API)"]
    assert not trt["available"] and "(test)" in trt["detail"]


# ---------------------------------------------------------------------------------------------- CPU threads


@pytest.mark.parametrize(
    "value,cap", [("3", 3), ("2,1", 2), (" 4 ", 4), ("0", None), ("-2", None), ("abc", None), ("", None)]
)
def test_thread_cap_reads_omp_num_threads_as_openmp_does(monkeypatch, value, cap):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert host.thread_cap() == cap


def test_default_threads_take_omp_num_threads_and_cap_the_plan(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (host.default_threads(), host.default_threads(batch=True)) == (3, 3)
    assert (host.default_threads(planned=6), host.default_threads(planned=2)) == (3, 2)
    monkeypatch.delenv("OMP_NUM_THREADS")
    cpus = host.usable_cpus()
    assert (host.default_threads(), host.default_threads(batch=True)) == (max(1, cpus // 2), cpus)
    assert host.default_threads(planned=cpus + 4) == cpus  # a bigger device's plan, capped by this host


AFFINITY_CHILD = """
import json, os, sys
os.environ.pop("OMP_NUM_THREADS", None)
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # as `taskset -c N` or a one-CPU cpuset would
import edgesdk
from edgesdk import host
with edgesdk.load(sys.argv[1]) as s:
    print(json.dumps({"cpus": host.usable_cpus(), "threads": s.report()["backend_report"]["threads"]}))
"""


def test_a_bundle_planned_for_a_bigger_device_runs_with_the_cpus_it_is_given(gemma_gguf, tmp_path):
    """A profile that lists 6 CPU cores plans 6 llama.cpp threads; a process limited to one CPU runs the bundle with
    1 (before: 6 threads spinning on each other's barriers on one CPU)."""
    import json
    import subprocess
    import sys

    import yaml

    from edgesdk.bundle import open_bundle

    profile = yaml.safe_load((REPO / "profiles" / "cpu-x86_64.yaml").read_text())
    profile["device"]["cpu"]["cores"] = 6
    (tmp_path / "six-cores.yaml").write_text(yaml.safe_dump(profile))
    out = tmp_path / "b"
    build = [sys.executable, "-m", "edgesdk", "build", str(gemma_gguf), "-p", str(tmp_path / "six-cores.yaml"), "-o",
             str(out), "--accept-license", "LicenseRef-gemma", "--no-progress"]  # fmt: skip
    subprocess.run(build, capture_output=True, timeout=300, check=True)
    assert open_bundle(out).manifest.llm.thread_count == 6
    child = subprocess.run(
        [sys.executable, "-c", AFFINITY_CHILD, str(out)], capture_output=True, text=True, timeout=300, check=True
    )
    assert json.loads(child.stdout.strip().splitlines()[-1]) == {"cpus": 1, "threads": 1}
