# SPDX-License-Identifier: Apache-2.0
"""The on-device runtime on real bundles: hashes, EP chain with recorded fallbacks, embed(), CLI run."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import edgesdk
from edgesdk.errors import BundleIntegrityError


def test_load_records_unusable_gpu_eps_as_fallbacks(minilm_orin_bundle):
    import onnxruntime as ort

    s = edgesdk.load(minilm_orin_bundle)
    rep = s.report()
    assert rep["backend"] == "onnxruntime" and rep["built_for"] == "orin-agx-64gb"
    # This machine has no GPU: every GPU EP in the plan's chain must appear as a recorded fallback with a reason.
    listed = set(ort.get_available_providers())
    gpu_eps = [ep for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider")]
    if rep["device"] == "CPUExecutionProvider":
        recorded = {f["from"] for f in rep["fallbacks"]}
        assert set(gpu_eps) <= recorded
        for f in rep["fallbacks"]:
            assert f["reason"] and f["to"]
            if f["from"] in listed:
                assert "failed to initialise" in f["reason"] or "not found" in f["reason"]


def test_embed_matches_sentence_transformers(minilm_orin_bundle, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, normalize_embeddings=True)
    s = edgesdk.load(minilm_orin_bundle)
    emb = s.embed(texts)
    assert emb.shape == (3, 384)
    cos = (emb * ref).sum(axis=1)
    assert cos.min() > 0.999, cos
    sims = emb @ emb.T
    assert sims[0, 1] > sims[0, 2]


def test_placement_reports_where_each_node_ran(minilm_orin_bundle):
    s = edgesdk.load(minilm_orin_bundle)
    ids = np.ones((1, 16), dtype=np.int64)
    place = s.backend.placement({"input_ids": ids, "attention_mask": ids, "token_type_ids": 0 * ids})
    assert place["by_provider"].get("CPUExecutionProvider", 0) > 10
    assert all(n["provider"] for n in place["nodes"].values())


def test_tampered_bundle_refused(minilm_orin_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(minilm_orin_bundle, copy)
    with open(copy / "tokenizer.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(BundleIntegrityError, match="tokenizer.json"):
        edgesdk.load(copy)


def test_cli_run_embeds_and_reports(run_cli, minilm_orin_bundle):
    res = run_cli("run", minilm_orin_bundle, "--input", "hello world", "--input", "hi world", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["embeddings"]["shape"] == [2, 384]
    assert out["report"]["backend"] == "onnxruntime"
    res = run_cli("run", minilm_orin_bundle)
    assert res.returncode == 3 and res.stderr.startswith("error: nothing to run")
