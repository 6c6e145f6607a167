# SPDX-License-Identifier: Apache-2.0
"""Detect the device in front of us and match it to a profile, with a confidence and the evidence.

Sources, in order of trust: Jetson device-tree / L4T files (the CUDA name is just "Orin" for every
SKU, so only the module part number tells an NX from a Nano), NVML for discrete GPUs, then the CPU
(``/proc/cpuinfo``, ``/proc/meminfo``). Every file is read below a ``root`` directory so detection
can be exercised on a directory tree holding a Jetson's files. Sensors that cannot be read are
reported as ``None`` (unavailable), never as zero.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgesdk import host
from edgesdk.errors import InputError, ProfileError
from edgesdk.host import parse_l4t_release, parse_part_number, read_cpu, read_under
from edgesdk.profiler.sensors import parse_nvpmodel, parse_tegrastats, run_tool, tegrastats_sample

# Re-exported: the parsers and the CPU reader live in edgesdk.host (one reader of each file).
__all__ = [
    "DetectionResult",
    "build_profile_data",
    "detect_device",
    "measure_cpu_peak_flops",
    "measure_memory_bandwidth",
    "parse_l4t_release",
    "parse_part_number",
    "read_cpu",
    "read_jetson",
    "read_memory",
    "read_nvml",
    "write_profile",
]


@dataclass
class DetectionResult:
    """What was found on this machine and which profile it matches best."""

    kind: str  # "jetson" | "gpu" | "cpu"
    arch: str
    cpu: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    gpus: list[dict] = field(default_factory=list)
    jetson: dict | None = None
    best_match: str | None = None
    confidence: float = 0.0
    evidence: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)
    bandwidth: dict | None = None  # measured memory bandwidth, when asked for

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- readers (all below ``root``)


def read_memory(root: Path) -> dict:
    text = read_under(root, "proc/meminfo") or ""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            values[m.group(1)] = int(m.group(2)) * 1024 / 1e9
    return {
        "total_gb": round(values["MemTotal"], 2) if "MemTotal" in values else None,
        "available_gb": round(values["MemAvailable"], 2) if "MemAvailable" in values else None,
        "source": "proc/meminfo" if values else "unavailable",
    }


def read_jetson(root: Path, run_tools: bool = True) -> dict | None:
    """Jetson identity (:func:`edgesdk.host.read_jetson_identity`) plus power mode and a tegrastats sample."""
    ident = host.read_jetson_identity(root)
    if ident is None:
        return None
    info: dict[str, Any] = {
        "model": ident.model,
        "compatible": list(ident.compatible),
        "platform": ident.platform,
        "module_part_number": ident.module_part_number,
        "part_number_source": ident.part_number_source,
        "l4t": ident.l4t,
        "sm": ident.sm,
        "nvpmodel": None,
        "tegrastats": None,
    }
    if run_tools:
        info["nvpmodel"] = parse_nvpmodel(run_tool(["nvpmodel", "-q"]) or "")
        sample = tegrastats_sample()
        info["tegrastats"] = parse_tegrastats(sample) if sample else None
    return info


def read_nvml() -> list[dict]:
    """Discrete GPUs (:func:`edgesdk.host.read_gpus`) in the profile's units. Empty without NVML."""
    return [
        {
            "index": g.index,
            "name": g.name,
            "sm": g.sm,
            "memory_total_gb": round(g.memory_bytes / 1e9, 2) if g.memory_bytes is not None else None,
            "driver": g.driver,
            "source": g.source,
        }
        for g in host.probe().gpus
    ]


# ---------------------------------------------------------------- matching


def _score_profiles(result: DetectionResult, profiles: list) -> list[dict]:
    scored = []
    for p in profiles:
        score = 0.0
        why: list[str] = []
        if p.arch != result.arch:
            continue
        if result.kind == "jetson" and p.kind == "jetson":
            j = result.jetson or {}
            if j.get("module_part_number") and j["module_part_number"] == p.module_part_number:
                score, why = 0.95, [f"module part number {j['module_part_number']} ({j['part_number_source']})"]
            elif j.get("platform") and j["platform"] == p.platform:
                score, why = 0.4, [f"platform {j['platform']} from device-tree compatible"]
                words = set(re.findall(r"nano|nx|agx", (j.get("model") or "").lower()))
                if words and words <= set(re.findall(r"nano|nx|agx", p.name)):
                    score, why = score + 0.2, why + [f"device-tree model {j['model']!r}"]
                total = (result.memory or {}).get("total_gb")
                nominal = p.figure("device.memory.total_gb")
                if total and nominal and 0.8 * nominal <= total <= 1.02 * nominal:
                    score, why = score + 0.2, why + [f"MemTotal {total} GB fits nominal {nominal} GB"]
        elif result.kind == "gpu" and p.kind == "gpu" and result.gpus:
            g = result.gpus[0]
            if g["name"] == p.gpu_name or g["name"].startswith(p.gpu_name or "\0"):
                score, why = 0.9, [f"NVML name {g['name']!r}"]
                if g.get("sm") and g["sm"] == p.sm:
                    score, why = 0.95, why + [f"compute capability {g['sm']}"]
        elif result.kind == "cpu" and p.kind == "cpu":
            score, why = 0.6, [f"generic {result.arch} CPU host (no GPU found)"]
            needed = set(p.cpu_isa)
            have = set(result.cpu.get("flags") or [])
            missing = {f for f in needed if f != "amx" and f not in have}
            if missing:
                score, why = 0.45, why + [f"profile lists ISA features this CPU lacks: {', '.join(sorted(missing))}"]
        if score > 0:
            scored.append({"profile": p.name, "confidence": round(score, 2), "evidence": why})
    scored.sort(key=lambda c: -c["confidence"])
    return scored


def detect_device(
    root: str | os.PathLike = "/", *, profiles: list | None = None, use_nvml: bool = True, run_tools: bool | None = None
) -> DetectionResult:
    """Detect this machine (or the tree under ``root``) and match it to the closest profile.

    ``run_tools`` (nvpmodel, tegrastats) defaults to True only for the real root: a fixture tree's
    tools are not this machine's.
    """
    from edgesdk.profiles import list_profiles

    root = Path(root)
    real = root.resolve() == Path("/")
    run_tools = real if run_tools is None else run_tools
    cpu = read_cpu(root)
    memory = read_memory(root)
    jetson = read_jetson(root, run_tools=run_tools)
    arch = platform.machine() if real else ("aarch64" if jetson or "asimd" in cpu["flags"] else "x86_64")
    arch = {"arm64": "aarch64", "AMD64": "x86_64"}.get(arch, arch)
    gpus = read_nvml() if (use_nvml and real and not jetson) else []
    kind = "jetson" if jetson else ("gpu" if gpus else "cpu")
    result = DetectionResult(kind=kind, arch=arch, cpu=cpu, memory=memory, gpus=gpus, jetson=jetson)
    result.evidence.append(
        f"cpu: {cpu['model'] or 'model unknown'}, {cpu['logical_cores']} logical cores ({cpu['source']})"
    )
    if jetson:
        result.evidence.append(
            f"jetson: model {jetson['model']!r}, part {jetson['module_part_number']}, L4T {jetson['l4t']}"
        )
    for g in gpus:
        result.evidence.append(f"gpu {g['index']}: {g['name']} sm_{g['sm']}, {g['memory_total_gb']} GB (NVML)")
    if not gpus and not jetson:
        result.evidence.append(
            "no NVIDIA GPU: NVML unavailable or reports none" if use_nvml and real else "GPU probing skipped"
        )
    result.candidates = _score_profiles(result, profiles if profiles is not None else list_profiles())
    if result.candidates:
        best = result.candidates[0]
        result.best_match, result.confidence = best["profile"], best["confidence"]
        result.evidence.extend(e for e in best["evidence"] if e not in result.evidence)
    return result


# ---------------------------------------------------------------- bandwidth + --write


def measure_memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> dict:
    """Host memory bandwidth from a numpy copy: bytes read + written over the best of ``repeats``.

    One thread, so this is a floor on a multi-channel machine; it is what a single inference thread
    streaming weights sees.
    """
    import numpy as np

    n = megabytes * (1 << 20) // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    gbps = 2 * src.nbytes / best / 1e9
    return {
        "value_gbps": round(gbps, 1),
        "method": f"numpy.copyto of {megabytes} MiB float64, best of {repeats}, bytes read+written, 1 thread",
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def measure_cpu_peak_flops(n: int = 1024, repeats: int = 5) -> dict:
    """FP32 matrix-multiply rate on all cores: a practical peak for the roofline.

    Timed through ONNX Runtime's MatMul (MLAS, the kernels bundles run on; it uses AVX-512 where
    numpy's generic OpenBLAS build may not), numpy when onnxruntime is missing.
    """
    import numpy as np

    a = np.ones((n, n), dtype=np.float32)
    run = None
    how = "numpy"
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "b"], ["c"])],
            "peak",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
            [numpy_helper.from_array(a, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        run = lambda: sess.run(None, {"a": a})  # noqa: E731
        how = f"onnxruntime {ort.__version__} MatMul (CPU EP)"
    except Exception:  # noqa: BLE001 - onnxruntime/onnx missing or broken: numpy's BLAS instead
        run = lambda: a @ a  # noqa: E731
    run()  # thread pool start-up is not throughput
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return {
        "value_tflops": round(2 * n**3 / best / 1e12, 4),
        "method": f"{how}, float32 {n}x{n}x{n}, best of {repeats}, all cores",
    }


# Profile ISA names (device.cpu.isa) and the /proc/cpuinfo flags that show each one.
ISA_FLAGS = {
    "avx2": ("avx2",),
    "avx512f": ("avx512f",),
    "avx512_vnni": ("avx512_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_fp16": ("avx512_fp16",),
    "avx_vnni": ("avx_vnni",),
    "amx": ("amx_tile",),
    "neon": ("asimd",),
    "dotprod": ("asimddp",),
    "sve": ("sve",),
    "sve2": ("sve2",),
    "i8mm": ("i8mm",),
}


def measured_isa(flags) -> list[str]:
    """The profile ISA names this CPU's flags show (AMX only with amx_tile; nothing copied from a base)."""
    have = set(flags or ())
    return [isa for isa, need in ISA_FLAGS.items() if all(f in have for f in need)]


def _figure(value: Any, source: str, status: str = "measured") -> dict:
    return {"value": value, "source": source, "status": status}


def build_profile_data(result: DetectionResult, name: str) -> dict:
    """A profile mapping for this machine: the best match's policies + what was measured here."""
    from edgesdk.profiles import resolve_profile

    base_name = result.best_match or f"cpu-{result.arch}"
    try:
        data = resolve_profile(base_name).as_written()
    except ProfileError as exc:
        raise InputError(f"cannot write a profile: no base profile for {base_name!r}") from exc
    when = _dt.date.today().isoformat()
    data["name"] = name
    data["display_name"] = f"{data['display_name']} (detected {when})"
    data.pop("aliases", None)
    dev = data["device"]
    if result.cpu.get("model") or result.cpu.get("flags"):
        cpu = dev.setdefault("cpu", {})
        if result.cpu.get("model"):
            cpu["model"] = result.cpu["model"]
        if result.cpu.get("logical_cores"):
            cpu["cores"] = int(result.cpu["logical_cores"])
        cpu["flags"] = list(result.cpu.get("flags") or [])
        if result.cpu.get("flags"):  # what this CPU has, not the base profile's list (no AMX on an AMD host)
            cpu["isa"] = measured_isa(result.cpu["flags"])
    mem = dev["memory"]
    if result.memory.get("total_gb"):
        mem["total_gb"] = _figure(result.memory["total_gb"], f"measured: /proc/meminfo MemTotal on {when}")
    if result.memory.get("available_gb"):
        mem["usable_gb"] = _figure(result.memory["available_gb"], f"measured: /proc/meminfo MemAvailable on {when}")
    usable = result.memory.get("available_gb") or result.memory.get("total_gb")
    if usable and result.kind == "cpu":
        # The base's budget is a placeholder for an unknown host; here the memory was measured, so the budget is
        # what Profile.memory_budget_gb() derives from it: usable memory minus the policy's headroom.
        headroom = float(data["policy"].get("memory_headroom_fraction", 0.3))
        data["policy"]["memory_budget_gb"] = round(float(usable) * (1.0 - headroom), 1)
    if result.kind == "cpu" and not dev["peak"].get("fp32_tflops"):
        peak = measure_cpu_peak_flops()
        dev["peak"]["fp32_tflops"] = _figure(peak["value_tflops"], f"measured: {peak['method']} on {when}")
    if result.bandwidth:
        mem["bandwidth_gbps"] = _figure(
            result.bandwidth["value_gbps"], f"measured: {result.bandwidth['method']} on {when}"
        )
    if result.jetson and result.jetson.get("l4t"):
        data["software"]["l4t"] = result.jetson["l4t"]
        data["software"]["source"] = f"measured: /etc/nv_tegra_release on {when}"
    elif result.kind == "cpu":
        data["software"]["source"] = f"detected host on {when} (edgesdk profiles detect --write)"
    data["measured"] = {
        "detected_on": when,
        "best_match": result.best_match,
        "confidence": result.confidence,
        "evidence": list(result.evidence),
        "bandwidth": result.bandwidth,
        "gpus": result.gpus,
        "jetson": result.jetson,
    }
    return data


def write_profile(result: DetectionResult, path: str | os.PathLike) -> Path:
    """Write a valid profile YAML for the detected machine (measures bandwidth if not done yet)."""
    from edgesdk.profiles import validate_profile_data

    path = Path(path)
    if result.bandwidth is None:
        result.bandwidth = measure_memory_bandwidth()
    name = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower()).strip("-") or "my-device"
    data = build_profile_data(result, name)
    validate_profile_data(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# SPDX-License-Identifier: Apache-2.0\n"
        "# Written by `edgesdk profiles detect --write`: measured figures carry status: measured.\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
