# SPDX-License-Identifier: Apache-2.0
"""Typed Profile accessors (issue 22 item 3): the planners read ``preferred_formats``, ``precision_order``,
``execution_providers``, ``parity_overrides()``, ``llm``, ``kernel()``, ``software_version()`` and ``cpu_cores``
instead of indexing ``policy`` / ``kernels`` / ``software`` / ``data`` (and the capability checker, profiler and
``profiles list`` read ``arch``, ``platform``, ``module_part_number``, ``gpu_name``, ``cpu_isa``, ``aliases`` and
``latency_target_ms``); each returns what the YAML says, for every shipped profile."""

from __future__ import annotations

import pytest

from edgesdk.profiles import KernelSupport, LlmPolicy, list_profiles


@pytest.mark.parametrize("profile", list_profiles(), ids=lambda p: p.name)
def test_accessors_return_what_the_yaml_says(profile):
    policy, data = profile.data["policy"], profile.data
    assert profile.preferred_formats == policy["formats"] and profile.precision_order == policy["precision"]
    assert profile.execution_providers == list(policy.get("execution_providers") or [])
    for prec in ("fp32", "fp16", "int8", "Q4_K_M"):
        assert profile.parity_overrides(prec) == dict((policy.get("parity") or {}).get(prec) or {})
    llm = policy.get("llm") or {}
    assert isinstance(profile.llm, LlmPolicy)
    assert (
        profile.llm.context_length,
        profile.llm.min_context_length,
        profile.llm.kv_type,
        profile.llm.n_ubatch,
    ) == tuple(llm.get(k) for k in ("context_length", "min_context_length", "kv_type", "n_ubatch"))
    assert profile.llm.quant_order == (list(llm["quant_order"]) if llm.get("quant_order") else None)
    for name in ("flash_attention", "cuda_graphs", "fp8", "no-such-kernel"):
        row = data["kernels"].get(name) or {}
        assert profile.kernel(name) == KernelSupport(row.get("supported"), row.get("recommended"), row.get("source"))
    for key in ("tensorrt", "l4t", "jetpack", "cuda", "source"):
        assert profile.software_version(key) == data["software"].get(key)
    assert profile.cpu_cores == ((data["device"].get("cpu") or {}).get("cores") or None)
    assert profile.memory_headroom_fraction == float(policy["memory_headroom_fraction"])
    dev = data["device"]
    assert profile.arch == dev["arch"] and profile.platform == dev.get("platform")
    assert profile.module_part_number == dev.get("module_part_number")
    assert profile.gpu_name == (dev.get("gpu") or {}).get("name")
    assert profile.cpu_isa == list((dev.get("cpu") or {}).get("isa") or [])
    assert profile.aliases == list(data.get("aliases") or [])
    assert profile.latency_target_ms == policy.get("latency_target_ms")
