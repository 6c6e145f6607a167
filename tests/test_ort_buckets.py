# SPDX-License-Identifier: Apache-2.0
"""Shape buckets for CUDA-graph capture: bucket choice, padding/masking and cutting (CPU), and that a padded,
masked request gives the unpadded result on a real encoder (MiniLM bundle on the CPU EP)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from edgesdk.runtime.backends.ort_buckets import Bucket, cut_outputs, pad_feeds, plan_buckets, request_shape

BERT_INPUTS = [
    NS(name="input_ids", shape=["batch", "seq"]),
    NS(name="attention_mask", shape=["batch", "seq"]),
    NS(name="token_type_ids", shape=["batch", "seq"]),
]


def test_plan_and_choose_smallest_bucket():
    plan = plan_buckets(BERT_INPUTS, seq_buckets=(32, 128), batch_buckets=(1, 8))
    assert [b.key for b in plan.buckets] == ["b1_s32", "b1_s128", "b8_s32", "b8_s128"]
    assert plan.choose(1, 20) == Bucket(1, 32)
    assert plan.choose(1, 33) == Bucket(1, 128)
    assert plan.choose(3, 20) == Bucket(8, 32)
    assert plan.choose(9, 20) is None and plan.choose(1, 129) is None  # larger than every bucket: plain run
    assert plan.as_dict()["padding"] == "upper bound + attention mask"


def test_max_seq_caps_buckets():
    plan = plan_buckets(BERT_INPUTS, seq_buckets=(32, 128, 256, 512), batch_buckets=(1,), max_seq=200)
    assert [b.seq for b in plan.buckets] == [32, 128, 200]


def test_no_mask_means_batch_only():
    plan = plan_buckets([NS(name="input_ids", shape=["batch", "seq"])])
    assert plan.seq_inputs == [] and plan.skipped and plan.buckets[0].seq is None
    assert plan.choose(1, None) == Bucket(1, None)
    image = plan_buckets([NS(name="pixel_values", shape=["batch", 3, 224, 224])], batch_buckets=(1, 8))
    assert image.choose(3, None) == Bucket(8, None) and image.seq_inputs == []


def test_pad_masks_tokens_and_rows_then_cut():
    plan = plan_buckets(BERT_INPUTS, seq_buckets=(8,), batch_buckets=(4,))
    feeds = {
        "input_ids": np.array([[101, 7, 102], [101, 9, 102]]),
        "attention_mask": np.ones((2, 3), np.int64),
        "token_type_ids": np.zeros((2, 3), np.int64),
    }
    padded = pad_feeds(plan, feeds, Bucket(4, 8))
    assert padded["input_ids"].shape == (4, 8) and padded["input_ids"][0, 3:].sum() == 0
    assert padded["attention_mask"][:2, 3:].sum() == 0 and padded["attention_mask"][:2, :3].all()
    assert padded["attention_mask"][2:].tolist() == [[1, 0, 0, 0, 0, 0, 0, 0]] * 2  # no fully masked row
    out = cut_outputs({"last_hidden_state": np.zeros((4, 8, 5)), "pooled": np.zeros((4, 5))}, Bucket(4, 8), 2, 3)
    assert out["last_hidden_state"].shape == (2, 3, 5) and out["pooled"].shape == (2, 5)
    assert request_shape(plan, feeds) == (2, 3)
    with pytest.raises(ValueError, match="does not fit"):
        pad_feeds(plan, {"input_ids": np.zeros((5, 3), np.int64)}, Bucket(4, 8))


@pytest.mark.slow
def test_padded_masked_equals_unpadded_on_minilm(minilm_orin_bundle):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(minilm_orin_bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    plan = plan_buckets(sess.get_inputs(), seq_buckets=(32, 128), batch_buckets=(1, 8))
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, size=(3, 21), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    names = [o.name for o in sess.get_outputs()]
    plain = dict(zip(names, sess.run(names, feeds)))
    bucket = plan.choose(*request_shape(plan, feeds))
    assert bucket == Bucket(8, 32)
    padded = dict(zip(names, sess.run(names, pad_feeds(plan, feeds, bucket))))
    got = cut_outputs(padded, bucket, 3, 21)
    for n in names:
        assert got[n].shape == plain[n].shape
        np.testing.assert_allclose(got[n], plain[n], atol=2e-2)  # FP16 graph: same math, other reduction sizes
        a, b = got[n].reshape(-1, got[n].shape[-1]), plain[n].reshape(-1, plain[n].shape[-1])
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        assert cos.min() > 0.9999


@pytest.mark.slow
def test_backend_routes_through_buckets_and_reports(minilm_orin_bundle, monkeypatch):
    """The CUDA-graph path with the capture session injected (no GPU here): requests inside a bucket go
    through it padded, larger ones run plain, and report() says which buckets were captured and why."""
    from edgesdk.runtime.backends import ort_buckets
    from edgesdk.runtime.session import load

    class FakeGraphs:  # stands in for the CUDA-graph session: runs the probe (plain session) on padded feeds
        def __init__(self, model_path, plan, output_names, probe, session_options=None, device_id=0):
            self.plan, self.probe, self.captured, self.requests = plan, probe, [], {}

        def run(self, feeds, bucket):
            b, s = request_shape(self.plan, feeds)
            self.captured += [] if bucket.key in self.captured else [bucket.key]
            self.requests[bucket.key] = self.requests.get(bucket.key, 0) + 1
            return cut_outputs(self.probe(pad_feeds(self.plan, feeds, bucket)), bucket, b, s)

    sess = load(minilm_orin_bundle, cuda_graphs=True)
    backend = sess.backend
    rep = backend.report()["cuda_graphs"]
    assert rep["enabled"] is False and "CPUExecutionProvider" in rep["reason"]  # CPU host: honest refusal
    monkeypatch.setattr(ort_buckets, "CudaGraphBuckets", FakeGraphs)
    monkeypatch.setattr(backend, "device", "CUDAExecutionProvider")
    assert backend.enable_cuda_graphs("test", seq_buckets=(32,), batch_buckets=(1, 8), max_seq=512)
    ids = np.full((2, 20), 1000, np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    plain = dict(zip(backend.output_names, backend.session.run(backend.output_names, feeds)))
    got = backend.run(feeds)
    for n in backend.output_names:
        np.testing.assert_allclose(got[n], plain[n], atol=2e-2)
    big = np.full((9, 16), 1000, np.int64)  # batch 9 > every bucket: plain session
    backend.run({"input_ids": big, "attention_mask": np.ones_like(big), "token_type_ids": 0 * big})
    rep = backend.report()["cuda_graphs"]
    assert rep["enabled"] and rep["captured"] == ["b8_s32"] and rep["requests_per_bucket"] == {"b8_s32": 1}
    assert rep["buckets"] == ["b1_s32", "b1_s512", "b8_s32", "b8_s512"] and rep["plain_runs_outside_buckets"] == 1
