# SPDX-License-Identifier: Apache-2.0
"""Shared fallback helpers: what this host has (TensorRT, SM, L4T), pre-flight against a target, which
fast kernel paths a profile allows, and what losing them costs.

Everything here reads the machine or the profile; nothing pretends. Where a figure is an estimate it
says which measurement it was scaled from.
"""

from __future__ import annotations

import functools
import importlib
import shutil
from pathlib import Path

from edgesdk.capability import tables

TEGRA_SM = {"tegra234": "8.7", "tegra194": "7.2"}  # Orin / Xavier iGPU compute capability (specs/devices.md)


@functools.cache
def tensorrt_python() -> tuple[str | None, str]:
    """TensorRT Python API version, or None with the reason it does not import."""
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError when libnvinfer is missing
        return None, f"TensorRT Python API not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    version = getattr(trt, "__version__", None)
    if not version:
        return None, "the tensorrt module has no __version__ (bindings without libnvinfer?)"
    return str(version), "tensorrt Python API"


def host_env(root: str = "/") -> dict:
    """This machine as TensorRT sees it: TensorRT version, GPU SM, L4T, platform, trtexec, with evidence."""
    from edgesdk.profiler.device import read_jetson, read_nvml

    env: dict = {"tensorrt": None, "sm": None, "l4t": None, "platform": None, "gpu": None, "trtexec": None,
                 "evidence": []}
    version, why = tensorrt_python()
    env["tensorrt"] = version
    env["evidence"].append(f"tensorrt: {version} ({why})" if version else why)
    env["trtexec"] = shutil.which("trtexec") or next(
        (str(p) for p in (Path("/usr/src/tensorrt/bin/trtexec"),) if p.is_file()), None)
    jetson = read_jetson(Path(root), run_tools=False)
    if jetson:
        env["platform"] = jetson.get("platform")
        env["l4t"] = jetson.get("l4t")
        env["sm"] = TEGRA_SM.get(jetson.get("platform") or "")
        env["gpu"] = jetson.get("model")
        env["evidence"].append(f"jetson {jetson.get('model')!r} platform {env['platform']}, L4T {env['l4t']}")
    else:
        gpus = read_nvml()
        if gpus:
            env["sm"], env["gpu"] = gpus[0].get("sm"), gpus[0].get("name")
            env["evidence"].append(f"gpu 0: {env['gpu']} sm_{env['sm']} (NVML)")
        else:
            env["evidence"].append("no NVIDIA GPU found (NVML unavailable or reports none; not a Jetson)")
    return env


def _major_minor(text: str | None) -> tuple[int, ...]:
    return tables.version_tuple(text)[:2]


def preflight(target: dict, here: dict) -> list[str]:
    """Why an engine built for ``target`` would not load ``here`` -- empty when it would.

    TensorRT engines are specific to the GPU's SM and the TensorRT version that built them (and on
    Jetson the L4T/JetPack release that ships that TensorRT); checking before deserialising turns an
    opaque deserialisation failure into one line and a clean fallback.
    """
    problems = []
    if not here.get("sm"):
        problems.append("no NVIDIA GPU here")
    elif target.get("sm") and target["sm"] != here["sm"]:
        problems.append(f"engine targets sm_{target['sm']}, this GPU is sm_{here['sm']}")
    if not here.get("tensorrt"):
        problems.append("TensorRT is not installed here")
    elif target.get("tensorrt") and _major_minor(target["tensorrt"]) != _major_minor(here["tensorrt"]):
        problems.append(f"engine targets TensorRT {target['tensorrt']}, this host has {here['tensorrt']}")
    if target.get("l4t") and here.get("l4t") and _major_minor(target["l4t"]) != _major_minor(here["l4t"]):
        problems.append(f"engine targets L4T {target['l4t']}, this Jetson runs L4T {here['l4t']}")
    return problems


def fast_paths(profile, *, device_is_cuda: bool) -> dict[str, dict]:
    """Per fast path (flash_attention, cuda_graphs, triton/torch.compile): take it or not, and why.

    The profile's kernel table decides (it carries the device's sources); without a CUDA device here,
    none of them can run regardless of the profile.
    """
    out: dict[str, dict] = {}
    kernels = profile.kernels if profile is not None else {}
    for feature in ("flash_attention", "cuda_graphs", "triton"):
        entry = kernels.get(feature) or {}
        if not device_is_cuda:
            out[feature] = {"use": False, "reason": "no CUDA device on this host"}
        elif not entry.get("supported", False):
            out[feature] = {"use": False, "reason": f"profile {profile.name}: unsupported ({entry.get('source')})"}
        elif entry.get("recommended") is False:
            out[feature] = {"use": False, "reason": f"profile {profile.name}: supported but not recommended "
                                                    f"({entry.get('source')})"}
        else:
            out[feature] = {"use": True, "reason": f"profile {profile.name}: supported ({entry.get('source')})"}
    return out


def eager_cost_estimate(precision: str = "fp32") -> dict:
    """What running eagerly costs vs compiled / compiled+CUDA graphs, scaled from the one measurement we
    have (FACTS.md: H200, MiniLM-shaped BERT, batch 1, seq 128). An estimate for other devices/models:
    small models at batch 1 are launch-bound everywhere, large ones much less so."""
    table = tables.kernel_table()
    data = table["eager_cost"]
    key = "fp16_ms" if precision in ("fp16", "bf16") else "fp32_ms"
    ms = data[key]
    return {"measured_on": data["device"], "model": data["model"],
            "source": table["sources"].get(data["source"], data["source"]), "precision": key[:4],
            "eager_ms": ms["eager"], "compile_ms": ms["compile"], "compile_cuda_graphs_ms": ms["compile_cuda_graphs"],
            "eager_vs_compile": round(ms["eager"] / ms["compile"], 2),
            "eager_vs_compile_cuda_graphs": round(ms["eager"] / ms["compile_cuda_graphs"], 2)}
