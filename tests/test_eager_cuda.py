# SPDX-License-Identifier: Apache-2.0
"""Eager CUDA fallback of GPU ONNX bundles (issue 13, item 4), on the CPU.

A real ``h200`` MiniLM bundle (FP16 ONNX + eager safetensors) is loaded here, where onnxruntime has no GPU
EP: the runtime loads the eager weights for real (on the torch CPU device named by ``eager_device``), checks
them against the ONNX graph and picks by measured figures. Only the timing is injected (``eager_measure``),
standing in for a CUDA device; the real measurement ran on the H200 (tools/bench/results/eager_cuda_h200.json).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def h200_bundle(minilm_dir, tmp_path_factory):
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("eager") / "minilm-h200"
    return build(minilm_dir, "h200", out, BuildOptions(progress=False, parity_samples=4, calibration_samples=4))


def _fake(figures: dict[str, float], calls: list[str]):
    def measure(label, run, feeds):
        run(feeds)  # the candidate really runs once on the representative input
        calls.append(label)
        return figures["cpu" if label == "CPUExecutionProvider" else "eager"]

    return measure


def test_plan_ships_eager_weights_for_gpu_profiles_only(minilm_dir):
    from edgesdk.plan import inspect_model, plan_build
    from edgesdk.profiles import resolve_profile

    facts = inspect_model(minilm_dir)
    gpu = plan_build(facts, resolve_profile("h200"))
    dec = next(d for d in gpu.decisions if d.key == "eager_fallback")
    assert dec.value == "safetensors+config"
    assert "torch.export" in dec.reason and "CPU EP vs eager CUDA" in dec.reason
    assert "eager_fallback" in gpu.explain()
    cpu = plan_build(facts, resolve_profile("cpu"))
    assert not any(d.key == "eager_fallback" for d in cpu.decisions)


def test_bundle_carries_fp16_safetensors_and_config(h200_bundle):
    from safetensors import safe_open

    from edgesdk.bundle import open_bundle

    b = open_bundle(h200_bundle)
    assert b.has_artifact("eager-weights") and b.has_artifact("eager-config")
    info = b.manifest.extras["eager_fallback"]
    assert info["included"] and info["dtype"] == "float16" and info["auto_class"] == "AutoModel"
    with safe_open(str(b.artifact_path("eager-weights")), "pt") as f:
        name = next(k for k in f.keys() if k.endswith("query.weight"))
        assert str(f.get_tensor(name).dtype) == "torch.float16"
        # one metadata key: safetensors writes the map in hash order, so a second key made the file's bytes (and
        # the bundle hash) differ from build to build
        assert f.metadata() == {"format": "pt"}


def test_eager_wins_by_its_figure_and_runs(h200_bundle):
    import edgesdk

    calls: list[str] = []
    s = edgesdk.load(h200_bundle, eager_device="cpu", eager_measure=_fake({"cpu": 7.3, "eager": 3.1}, calls), threads=2)
    assert calls == ["CPUExecutionProvider", "torch-eager:cpu"]
    assert (s.backend.name, s.backend.device) == ("torch", "cpu")
    rec = s.fallbacks[-1]
    assert rec["from"] == "TensorrtExecutionProvider" and rec["to"] == "torch-eager:cpu"
    assert "CPU EP 7.30 ms vs eager cpu 3.10 ms vs planned TensorRT n/a" in rec["reason"]
    assert rec["costs"]["eager_vs_cpu_ep_cosine"] > 0.999
    assert set(rec["costs"]["load_cost_s"]) == {"eager_load", "measure"}
    report = s.report()["backend_report"]["eager_fallback"]
    assert report["used"] is True and "2.4x faster" in report["reason"]
    cpu = edgesdk.load(h200_bundle, eager_fallback=False, threads=2)
    texts = ["eager fallback on the GPU", "the CPU execution provider"]
    a, b = s.embed(texts), cpu.embed(texts)
    assert np.min((a * b).sum(1)) > 0.999  # the eager module computes what the FP16 ONNX graph does


def test_cpu_ep_kept_when_it_measures_faster(h200_bundle):
    import edgesdk

    calls: list[str] = []
    s = edgesdk.load(h200_bundle, eager_device="cpu", eager_measure=_fake({"cpu": 2.0, "eager": 9.0}, calls), threads=2)
    assert s.backend.name == "onnxruntime" and s.backend.device == "CPUExecutionProvider"
    rec = s.fallbacks[-1]
    assert rec["to"] == "CPUExecutionProvider" and "CPU EP 2.00 ms vs eager cpu 9.00 ms" in rec["reason"]
    status = s.report()["backend_report"]["eager_fallback"]
    assert status["used"] is False and "4.5x faster" in status["reason"]


def test_off_by_option_and_without_cuda(h200_bundle, monkeypatch):
    import torch

    import edgesdk

    calls: list[str] = []
    s = edgesdk.load(h200_bundle, eager_fallback=False, eager_measure=_fake({"cpu": 1, "eager": 1}, calls))
    assert s.backend.name == "onnxruntime" and calls == []
    assert s.report()["backend_report"]["eager_fallback"]["reason"] == "eager_fallback=False (option)"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s = edgesdk.load(h200_bundle, eager_measure=_fake({"cpu": 1, "eager": 1}, calls))
    assert s.backend.name == "onnxruntime" and calls == []
    assert "sees no CUDA device" in s.report()["backend_report"]["eager_fallback"]["reason"]


def test_representative_feeds_and_measure():
    from edgesdk.runtime.backend import TensorSpec
    from edgesdk.runtime.backends.torch_eager import measure_ms, representative_feeds

    specs = [
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("attention_mask", "int64", (None, None)),
        TensorSpec("pixel_values", "float32", (None, 3, None, None)),
    ]
    feeds = representative_feeds(specs, {"vocab_size": 500, "max_position_embeddings": 64, "image_size": 32})
    assert feeds["input_ids"].shape == (1, 64) and feeds["input_ids"].max() < 500
    assert feeds["attention_mask"].all() and feeds["pixel_values"].shape == (1, 3, 32, 32)
    seen = []
    ms = measure_ms("x", lambda f: seen.append(1), feeds, warmup=2, runs=4, budget_s=10)
    assert ms >= 0 and len(seen) == 6
