# SPDX-License-Identifier: Apache-2.0
"""Which fast kernel paths a profile allows on this device, and what losing them costs.

Pure functions of the profile and the capability tables: nothing here probes the machine (host facts
come from :mod:`edgesdk.host`). Where a figure is an estimate it says which measurement it was scaled
from.
"""

from __future__ import annotations

from typing import Any

from edgesdk.capability import tables

FAST_PATHS = ("flash_attention", "cuda_graphs", "triton")


def fast_paths(profile: Any, *, device_is_cuda: bool) -> dict[str, dict[str, Any]]:
    """Per fast path (flash_attention, cuda_graphs, triton/torch.compile): take it or not, and why.

    The profile's kernel table decides (it carries the device's sources); without a CUDA device here,
    none of them can run regardless of the profile.
    """
    out: dict[str, dict[str, Any]] = {}
    kernels = profile.kernels if profile is not None else {}
    for feature in FAST_PATHS:
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


def eager_cost_estimate(precision: str = "fp32") -> dict[str, Any]:
    """What running eagerly costs vs compiled / compiled+CUDA graphs, scaled from the one measurement in
    the kernel table (its ``eager_cost`` entry names the device, model and source). An estimate for other
    devices/models: small models at batch 1 are launch-bound everywhere, large ones much less so."""
    table = tables.kernel_table()
    data = table["eager_cost"]
    key = "fp16_ms" if precision in ("fp16", "bf16") else "fp32_ms"
    ms = data[key]
    return {"measured_on": data["device"], "model": data["model"],
            "source": table["sources"].get(data["source"], data["source"]), "precision": key[:4],
            "eager_ms": ms["eager"], "compile_ms": ms["compile"], "compile_cuda_graphs_ms": ms["compile_cuda_graphs"],
            "eager_vs_compile": round(ms["eager"] / ms["compile"], 2),
            "eager_vs_compile_cuda_graphs": round(ms["eager"] / ms["compile_cuda_graphs"], 2)}
