# SPDX-License-Identifier: Apache-2.0
"""Which fast kernel paths a profile allows on this device (what losing them costs is
:func:`edgesdk.capability.tables.eager_cost_estimate`, beside the kernel table it reads).

A pure function of the profile: nothing here probes the machine (host facts come from :mod:`edgesdk.host`).
"""

from __future__ import annotations

from typing import Any

from edgesdk.profiles import KernelSupport

FAST_PATHS = ("flash_attention", "cuda_graphs", "triton")


def fast_paths(profile: Any, *, device_is_cuda: bool) -> dict[str, dict[str, Any]]:
    """Per fast path (flash_attention, cuda_graphs, triton/torch.compile): take it or not, and why.

    The profile's kernel table decides (it carries the device's sources); without a CUDA device here,
    none of them can run regardless of the profile.
    """
    out: dict[str, dict[str, Any]] = {}
    for feature in FAST_PATHS:
        entry = profile.kernel(feature) if profile is not None else KernelSupport()
        if not device_is_cuda:
            out[feature] = {"use": False, "reason": "no CUDA device on this host"}
        elif not entry.supported:
            out[feature] = {"use": False, "reason": f"profile {profile.name}: unsupported ({entry.source})"}
        elif entry.recommended is False:
            out[feature] = {
                "use": False,
                "reason": f"profile {profile.name}: supported but not recommended ({entry.source})",
            }
        else:
            out[feature] = {"use": True, "reason": f"profile {profile.name}: supported ({entry.source})"}
    return out
