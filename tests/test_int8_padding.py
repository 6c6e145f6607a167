# SPDX-License-Identifier: Apache-2.0
"""INT8 embeddings must not depend on what else is in the batch (issue 14).

Dynamic INT8 quantizes each activation tensor with one scale per run, i.e. per batch: padded rows and
a long neighbour used to widen a short text's scale (MiniLM INT8: min cosine 0.9971 alone, 0.9942
padded to 256 tokens, 0.9944 beside a 256-token text). The INT8 graph now zeroes padded rows before
quantizing, ``Session.embed`` groups texts by length, and the build's verify step scores the held-out
texts in padded batches as embed() forms them (manifest ``parity.<precision>.padded``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from edgesdk.formats.onnx import parity as P
from edgesdk.runtime.session import EMBED_MAX_LENGTH_RATIO, plan_embed_batches

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------------------------------ fast


def test_plan_embed_batches_groups_similar_lengths():
    lengths = [5, 250, 6, 240, 12, 7, 3, 128, 9, 11]
    batches = plan_embed_batches(lengths, max_batch=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3
        assert max(lengths[i] for i in b) <= EMBED_MAX_LENGTH_RATIO * min(lengths[i] for i in b)
    assert not any({0, 1} <= set(b) for b in batches)  # a short text never shares a batch with a 250-token one
    assert plan_embed_batches([10, 12, 11], max_batch=32) == [[0, 2, 1]]


def _feed(n_tokens: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.arange(1, n_tokens + 1, dtype=np.int64)[None],
        "attention_mask": np.ones((1, n_tokens), np.int64),
        "token_type_ids": np.zeros((1, n_tokens), np.int64),
    }


def test_batched_parity_sees_a_batch_wide_scale():
    """A fake model whose output step size grows with the batch's longest row, like per-tensor INT8."""
    rng = np.random.default_rng(0)
    feeds = [_feed(n) for n in (6, 8, 9, 12)]
    refs = [rng.standard_normal((1, f["input_ids"].shape[1], 16)).astype(np.float32) for f in feeds]
    longs = [_feed(200)]
    table = {tuple(f["input_ids"][0]): r[0] for f, r in zip(feeds, refs)}

    def run(batch):
        width = batch["input_ids"].shape[1]
        out = np.zeros((len(batch["input_ids"]), width, 16), np.float32)
        step = 0.02 * width  # coarser with a longer batch
        for j, ids in enumerate(batch["input_ids"]):
            n = int(batch["attention_mask"][j].sum())
            key = tuple(ids[:n])
            if key in table:
                out[j, :n] = np.round(table[key] / step) * step
        return out

    masks = [f["attention_mask"] for f in feeds]
    embed = P.batched_parity(refs, masks, P.padded_batches(feeds, longs, 0, how="embed"), run)
    pairs = P.batched_parity(refs, masks, P.padded_batches(feeds, longs, 0, how="pairs"), run)
    assert embed["samples"] == pairs["samples"] == 4
    assert pairs["padded_length_max"] == 200 and embed["padded_length_max"] == 200  # the long text ran too
    assert embed["min_cosine"] > 0.99 > pairs["min_cosine"]
    assert P.check_thresholds(pairs, {"min_cosine": 0.995})


def test_padded_batches_pad_on_the_right():
    batch, rows = P.padded_batches([_feed(3)], [_feed(5)], 99, how="pairs")[0]
    assert rows == [0, -1]
    assert batch["input_ids"].tolist() == [[1, 2, 3, 99, 99], [1, 2, 3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


# ---------------------------------------------------------------------------- real MiniLM INT8 bundle


@pytest.fixture(scope="module")
def int8_bundle(minilm_cpu_int8):
    """tests/conftest.py's INT8, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_int8


@pytest.fixture(scope="module")
def reference(minilm_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    model = AutoModel.from_pretrained(str(minilm_dir)).eval()

    def embed(text: str) -> np.ndarray:  # batch 1, no padding: the truth a batch must not change
        with torch.no_grad():
            enc = tok(text, return_tensors="pt", truncation=True, max_length=256)
            return model(**enc).last_hidden_state[0].mean(0).numpy()

    return embed


def _long_text(minilm_dir, n_tokens: int) -> str:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.no_truncation()
    words = " ".join(P.sample_sentences(300, offset=100)).split()
    for cut in range(n_tokens, len(words)):
        text = " ".join(words[:cut])
        if len(tok.encode(text).ids) >= n_tokens:
            return text
    raise AssertionError("sample sentences too short for a long text")


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.slow
def test_manifest_reports_padded_batch_parity(int8_bundle):
    m = json.loads((int8_bundle / "manifest.json").read_text())
    assert m["precision"] == "int8"
    p = m["parity"]["int8"]
    padded = p["padded"]
    assert padded["samples"] == p["samples"] == 16
    assert padded["padded_length_max"] == 256 and max(padded["long_texts"]) == 256  # embed()'s truncation length
    assert padded["min_cosine"] >= p["thresholds"]["min_cosine"] and p["passed"]
    assert padded["pairs"]["samples"] == 16 and padded["pairs"]["min_cosine"] is not None
    # batches of 32 first, then fewer until min_cosine holds; embed() then uses that batch size
    tried = padded["min_cosine_by_max_batch"]
    assert padded["embed_max_batch"] in (1, 2, 4, 8, 16, 32) and list(tried)[-1] == str(padded["embed_max_batch"])
    assert all(v < p["thresholds"]["min_cosine"] for v in list(tried.values())[:-1])


@pytest.mark.slow
def test_embed_uses_the_batch_size_the_build_verified(int8_bundle, monkeypatch):
    import edgesdk

    verified = json.loads((int8_bundle / "manifest.json").read_text())["parity"]["int8"]["padded"]["embed_max_batch"]
    with edgesdk.load(int8_bundle) as session:
        sizes = []
        run = session.backend.run
        monkeypatch.setattr(session.backend, "run", lambda feeds: sizes.append(len(feeds["input_ids"])) or run(feeds))
        session.embed(["one two three"] * 40)
        assert max(sizes) == min(verified, 32) and sum(sizes) == 40
        sizes.clear()
        session.embed(["one two three"] * 5, max_batch=5)  # the caller's choice wins
        assert sizes == [5]


@pytest.mark.slow
def test_embed_short_beside_long_keeps_the_bundles_min_cosine(int8_bundle, reference, minilm_dir):
    import edgesdk

    threshold = json.loads((int8_bundle / "manifest.json").read_text())["parity"]["int8"]["thresholds"]["min_cosine"]
    long_text = _long_text(minilm_dir, 300)  # truncated to 256 by embed()
    with edgesdk.load(int8_bundle) as session:
        for short in P.sample_sentences(16):
            pair = session.embed([short, long_text], normalize=False)
            alone = session.embed([short], normalize=False)[0]
            assert _cos(pair[0], reference(short)) >= threshold, short
            np.testing.assert_allclose(pair[0], alone, rtol=1e-5, atol=1e-5)
        texts = [long_text] + P.sample_sentences(6) + [long_text[:400]]
        batched = session.embed(texts, normalize=False)  # length-grouped, returned in input order
        one_by_one = np.stack([session.embed([t], normalize=False)[0] for t in texts])
        assert _cos(batched[0], one_by_one[0]) > 0.9999 and _cos(batched[-1], one_by_one[-1]) > 0.9999
        for a, b in zip(batched, one_by_one):
            assert _cos(a, b) > 0.998


@pytest.mark.slow
def test_int8_graph_output_does_not_depend_on_padding(int8_bundle):
    """Padding a short text to 256 tokens in its own batch leaves its pooled INT8 output unchanged."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(int8_bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    tok = P.load_tokenizer(int8_bundle, 256, fixed_length=False)
    padded_tok = P.load_tokenizer(int8_bundle, 256, fixed_length=True)
    names = [i.name for i in session.get_inputs()]
    for text in P.sample_sentences(8):
        plain = P.encode_texts(tok, [text], names)[0]
        padded = P.encode_texts(padded_tok, [text], names)[0]
        assert padded["input_ids"].shape[1] == 256 > plain["input_ids"].shape[1]
        a = P.mean_pool(session.run(None, plain)[0], plain["attention_mask"])[0]
        b = P.mean_pool(session.run(None, padded)[0], padded["attention_mask"])[0]
        assert _cos(a, b) > 0.99999, text
