# SPDX-License-Identifier: Apache-2.0
"""TensorRT-friendly ONNX for Jetson profiles (TensorRT heads the EP chain and ships with JetPack): standard
ops only, so TensorRT takes the encoder whole; GPU servers keep ONNX Runtime's fused graph, with the CUDA EP
figure that decided it in --explain."""

from __future__ import annotations

import json

import pytest

from edgesdk.capability import check_capability
from edgesdk.profiles import resolve_profile


def _optimize(run_cli, minilm_dir, profile: str) -> dict:
    res = run_cli("build", str(minilm_dir), "--profile", profile, "--plan-only", "--json")
    assert res.returncode == 0, res.stderr
    return next(d for d in json.loads(res.stdout)["decisions"] if d["key"] == "optimize")


def test_jetson_plans_standard_ops_gpu_server_keeps_fusion(run_cli, minilm_dir):
    orin = _optimize(run_cli, minilm_dir, "orin")
    assert orin["value"] == "onnxslim" and "TensorRT takes the graph whole" in orin["reason"]
    h200 = _optimize(run_cli, minilm_dir, "h200")
    assert h200["value"] == "onnxruntime-transformer-optimizer"
    assert "0.45 ms vs 1.06 ms" in h200["reason"] and "--format tensorrt" in h200["reason"]
    cpu = _optimize(run_cli, minilm_dir, "cpu-x86_64")
    assert "H200" not in cpu["reason"]  # the CUDA EP figure only where a GPU runs it


@pytest.mark.slow
def test_orin_minilm_is_one_tensorrt_partition(minilm_orin_bundle):
    import onnx

    ops = {n.op_type for n in onnx.load(str(minilm_orin_bundle / "model.onnx")).graph.node}
    assert not ops & {"Attention", "SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization"}
    report = check_capability(minilm_orin_bundle / "model.onnx", resolve_profile("orin"), "fp16")
    assert [p.backend for p in report.partitions] == ["tensorrt"]
