# SPDX-License-Identifier: Apache-2.0
"""The planner decides the ONNX shape buckets for CUDA-graph capture (``shape_buckets``), ``--explain`` and
the manifest show the decision, and the runtime captures exactly those buckets; a bundle without the
decision keeps the runtime's defaults.

No GPU here: the CUDA-graph session is replaced by one that runs the plain CPU session on the padded
feeds (as in tests/test_ort_buckets.py), and the backend is told it runs on the CUDA EP."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.runtime.backends.ort_buckets import (
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_SEQ_BUCKETS,
    bucket_options,
    cut_outputs,
    pad_feeds,
    request_shape,
)


def _facts(**config):
    from edgesdk.types import ModelFacts

    return ModelFacts(
        source="x",
        kind="hf",
        task="feature-extraction",
        name="enc",
        family="bert",
        config={"num_attention_heads": 12, "hidden_size": 384, **config},
        weight_bytes=90_000_000,
    )


def _decision(facts, profile, **options):
    from edgesdk.formats.onnx.plan import plan_onnx
    from edgesdk.profiles import resolve_profile
    from edgesdk.types import BuildOptions

    decisions = plan_onnx(facts, resolve_profile(profile), BuildOptions(**options), "fp16").decisions()
    found = [d for d in decisions if d.key == "shape_buckets"]
    assert len(found) == 1
    return found[0]


# ------------------------------------------------------------------------------ the pure planner
def test_gpu_profile_buckets_follow_the_model_and_the_profile():
    d = _decision(_facts(max_position_embeddings=512), "h200")
    assert d.value == {"batch": [1, 8], "seq": [32, 128, 256, 512], "capture": "at load"}
    assert "recommends CUDA graphs" in d.reason and "0.22 ms" in d.reason and "up to 8 graphs" in d.reason
    short = _decision(_facts(max_position_embeddings=200), "l4")  # positions cut the ladder: a bucket at the cap
    assert short.value["seq"] == [32, 128, 200] and "capped at 200" in short.reason
    long = _decision(_facts(max_position_embeddings=8192), "h200")  # no 8192-token graph unless asked for
    assert long.value["seq"] == [32, 128, 256, 512] and "8192" in long.reason


def test_options_bound_the_buckets():
    d = _decision(_facts(max_position_embeddings=512), "h200", max_batch=4, max_seq_len=64, seq_len=48)
    assert d.value["batch"] == [1, 4] and d.value["seq"] == [32, 48, 64]
    assert "--max-batch" in d.reason and "--max-seq-len" in d.reason
    big = _decision(_facts(max_position_embeddings=512), "h200", max_batch=16)
    assert big.value["batch"] == [1, 8, 16]


def test_jetson_records_buckets_but_captures_on_request_only():
    d = _decision(_facts(max_position_embeddings=512), "orin")
    assert d.value["capture"] == "on request" and "does not recommend" in d.reason
    assert "unified memory" in d.reason  # the profile's own source for the choice


def test_cpu_profile_and_image_models():
    assert _decision(_facts(max_position_embeddings=512), "cpu").value is None
    from edgesdk.types import ModelFacts

    image = ModelFacts(
        source="x",
        kind="hf",
        task="image-classification",
        name="resnet",
        family="resnet",
        config={},
        weight_bytes=1_000_000,
    )
    d = _decision(image, "h200")
    assert d.value["seq"] is None and d.value["batch"] == [1, 8] and "batch buckets only" in d.reason


def test_bucket_options_from_a_manifest_plan():
    plan = {
        "decisions": [
            {"key": "shape_buckets", "value": {"batch": [1, 4], "seq": [32, 64], "capture": "at load"}, "reason": "r"}
        ]
    }
    assert bucket_options(plan, 512) == {
        "seq_buckets": (32, 64),
        "batch_buckets": (1, 4),
        "max_seq": 64,
        "source": "plan",
    }
    old = bucket_options({"decisions": [{"key": "ep_chain", "value": [], "reason": ""}]}, 512)  # older bundle
    assert old["seq_buckets"] == DEFAULT_SEQ_BUCKETS and old["batch_buckets"] == DEFAULT_BATCH_BUCKETS
    assert old["max_seq"] == 512 and old["source"].startswith("runtime defaults")
    assert bucket_options(None)["source"].startswith("runtime defaults")
    cpu = bucket_options({"decisions": [{"key": "shape_buckets", "value": None, "reason": ""}]}, 128)
    assert cpu["source"].startswith("runtime defaults")  # cuda_graphs=True on a bundle planned for the CPU
    image = bucket_options({"decisions": [{"key": "shape_buckets", "value": {"batch": [1, 8], "seq": None}}]})
    assert image["batch_buckets"] == (1, 8) and image["seq_buckets"] == DEFAULT_SEQ_BUCKETS
    bad = bucket_options({"decisions": [{"key": "shape_buckets", "value": {"batch": [0, "8"], "seq": [32]}}]})
    assert bad["source"].startswith("runtime defaults")


# ------------------------------------------------------------------------------ build, explain, manifest, runtime
class FakeGraphs:
    """Stands in for the CUDA-graph session: runs the plain session (probe) on the padded feeds."""

    def __init__(self, model_path, plan, output_names, probe, session_options=None, device_id=0):
        self.plan, self.probe, self.captured, self.requests = plan, probe, [], {}

    def run(self, feeds, bucket):
        b, s = request_shape(self.plan, feeds)
        self.captured += [] if bucket.key in self.captured else [bucket.key]
        self.requests[bucket.key] = self.requests.get(bucket.key, 0) + 1
        return cut_outputs(self.probe(pad_feeds(self.plan, feeds, bucket)), bucket, b, s)


def _as_if_on_cuda(monkeypatch):
    """The backend believes it runs on the CUDA EP when graphs are enabled; capture is FakeGraphs."""
    from edgesdk.runtime.backends import ort_buckets
    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

    monkeypatch.setattr(ort_buckets, "CudaGraphBuckets", FakeGraphs)
    original = OnnxRuntimeBackend.enable_cuda_graphs

    def enable(self, reason, **kw):
        self.device = "CUDAExecutionProvider"
        return original(self, reason, **kw)

    monkeypatch.setattr(OnnxRuntimeBackend, "enable_cuda_graphs", enable)


@pytest.fixture(scope="module")
def bounded_h200_bundle(minilm_dir, tmp_path_factory):
    """MiniLM FP16 for h200 with --max-batch 4 --max-seq-len 64: buckets unlike the runtime defaults."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("buckets") / "minilm-h200"
    return build(
        minilm_dir, "h200", out, BuildOptions(progress=False, parity_samples=2, max_batch=4, max_seq_len=64, seq_len=32)
    )


@pytest.mark.slow
def test_explain_prints_the_bucket_decision(minilm_dir, run_cli):
    res = run_cli("build", str(minilm_dir), "--profile", "h200", "--plan-only", "--max-batch", "4")
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("shape_buckets"))
    assert "'batch': [1, 4]" in line and "'seq': [32, 128, 256, 512]" in line
    assert "CUDA graphs need static shapes" in res.stdout


@pytest.mark.slow
def test_runtime_captures_the_recorded_buckets(bounded_h200_bundle, monkeypatch):
    from edgesdk.runtime.session import load

    manifest = json.loads((bounded_h200_bundle / "manifest.json").read_text())
    recorded = next(d for d in manifest["plan"]["decisions"] if d["key"] == "shape_buckets")
    assert recorded["value"] == {"batch": [1, 4], "seq": [32, 64], "capture": "at load"}
    _as_if_on_cuda(monkeypatch)
    with load(bounded_h200_bundle) as s:  # h200 recommends CUDA graphs: enabled at load with the plan's buckets
        backend = s.backend
        rep = backend.report()["cuda_graphs"]
        assert rep["enabled"] and rep["source"] == "plan", rep
        assert rep["buckets"] == ["b1_s32", "b1_s64", "b4_s32", "b4_s64"]
        ids = np.full((3, 40), 1000, np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        plain = dict(zip(backend.output_names, backend.session.run(backend.output_names, feeds)))
        got = backend.run(feeds)  # 3 x 40 -> the b4_s64 graph, cut back to 3 x 40
        for n in backend.output_names:
            assert got[n].shape == plain[n].shape
            np.testing.assert_allclose(got[n], plain[n], atol=2e-2)
        long = np.full((1, 100), 1000, np.int64)  # longer than every planned bucket: the plain session
        backend.run({"input_ids": long, "attention_mask": np.ones_like(long), "token_type_ids": 0 * long})
        rep = backend.report()["cuda_graphs"]
        assert rep["captured"] == ["b4_s64"] and rep["plain_runs_outside_buckets"] == 1


def test_jetson_bundle_captures_its_recorded_buckets_only_when_asked(minilm_orin_bundle, monkeypatch):
    """orin does not recommend CUDA graphs: not enabled at load; with cuda_graphs=True the recorded buckets."""
    from edgesdk.runtime.session import load

    manifest = json.loads((minilm_orin_bundle / "manifest.json").read_text())
    recorded = next(d for d in manifest["plan"]["decisions"] if d["key"] == "shape_buckets")
    assert recorded["value"]["capture"] == "on request"
    _as_if_on_cuda(monkeypatch)
    with load(minilm_orin_bundle) as s:
        assert s.backend.report()["cuda_graphs"]["enabled"] is False
    with load(minilm_orin_bundle, cuda_graphs=True) as s:
        rep = s.backend.report()["cuda_graphs"]
        assert rep["enabled"] and rep["source"] == "plan"
        assert rep["buckets"] == [f"b{b}_s{q}" for b in recorded["value"]["batch"] for q in recorded["value"]["seq"]]
