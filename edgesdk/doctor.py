# SPDX-License-Identifier: Apache-2.0
"""Probe this machine for every backend the runtime can use, and say why each missing one is missing."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import platform
import shutil


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def _ort_checks() -> list[dict]:
    out = []
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return [{"component": "onnxruntime", "available": False, "version": None,
                 "detail": f"not importable: {exc}"}]
    version = ort.__version__
    listed = ort.get_available_providers()
    out.append({"component": "onnxruntime", "available": True, "version": version,
                "detail": f"providers built in: {', '.join(listed)}"})
    from edgesdk.runtime.backends.onnxruntime import probe_provider

    for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider"):
        if ep not in listed:
            out.append({"component": f"ORT {ep}", "available": False, "version": version,
                        "detail": "not built into this onnxruntime package (install onnxruntime-gpu)"})
            continue
        ok, why = probe_provider(ep)
        out.append({"component": f"ORT {ep}", "available": ok, "version": version,
                    "detail": "initialised on a probe model" if ok else f"listed, but {why}"})
    out.append({"component": "ORT CPUExecutionProvider", "available": "CPUExecutionProvider" in listed,
                "version": version, "detail": "always last in every chain"})
    return out


def _nvidia() -> dict:
    smi = shutil.which("nvidia-smi")
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
        return {"component": "NVIDIA GPU", "available": n > 0, "version": pynvml.nvmlSystemGetDriverVersion(),
                "detail": ", ".join(map(str, names)) or "NVML reports no GPU"}
    except Exception as exc:  # noqa: BLE001 - NVML missing or no driver: both mean "no GPU here"
        why = "nvidia-ml-py not installed" if isinstance(exc, ImportError) else f"NVML: {exc}"
        tegra = platform.machine() == "aarch64" and shutil.which("tegrastats")
        return {"component": "NVIDIA GPU", "available": bool(tegra), "version": None,
                "detail": "Jetson (tegrastats present; NVML is limited on Orin)" if tegra else
                f"none found ({why}{'; nvidia-smi present' if smi else '; no nvidia-smi, no driver'})"}


def _module(component: str, module: str, dists: tuple[str, ...], missing_hint: str) -> dict:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return {"component": component, "available": False, "version": None,
                "detail": f"{missing_hint} ({exc.__class__.__name__}: {exc})"[:200]}
    except OSError as exc:  # shared library present but unloadable
        return {"component": component, "available": False, "version": _dist_version(*dists),
                "detail": f"installed but its native library failed to load: {exc}"[:200]}
    return {"component": component, "available": True, "version": _dist_version(*dists), "detail": "importable"}


def diagnose() -> list[dict]:
    checks = _ort_checks()
    checks.append(_module("TensorRT (Python API)", "tensorrt", ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"),
                          "not installed: TensorRT ships with JetPack and NVIDIA containers, not PyPI; "
                          "bundles defer the engine build to the device"))
    trtexec = shutil.which("trtexec")
    checks.append({"component": "trtexec", "available": bool(trtexec), "version": None,
                   "detail": trtexec or "not on PATH"})
    checks.append(_module("llama.cpp (llama-cpp-python)", "llama_cpp", ("llama-cpp-python",),
                          "not installed: pip install 'edgesdk[gguf]' with CMAKE_ARGS=-DGGML_NATIVE=OFF"))
    checks.append(_module("PyTorch (eager backend, exporters)", "torch", ("torch",),
                          "not installed: pip install 'edgesdk[export]'"))
    checks.append(_nvidia())
    return checks
