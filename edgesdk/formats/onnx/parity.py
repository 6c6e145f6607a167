# SPDX-License-Identifier: Apache-2.0
"""Sample inputs from a model's tokenizer / input spec, and parity metrics against the source model.

Text encoders are compared the way their users consume them: the attention-mask-aware mean-pooled
sentence embedding (sentence-transformers' pooling), by cosine; the raw output by max-abs error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import ModelError
from edgesdk.resources import read_data_text

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def sample_sentences(n: int, offset: int = 0) -> list[str]:
    """``n`` built-in English sentences (edgesdk/data/sample_sentences.txt), cycled if needed."""
    text = read_data_text("sample_sentences.txt")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [lines[(offset + i) % len(lines)] for i in range(n)]


def load_tokenizer(model_dir: Path, seq_len: int, fixed_length: bool = True) -> Tokenizer:
    """A fast tokenizer from tokenizer.json (``tokenizers`` only: no transformers on the device).

    ``fixed_length`` pads every text to ``seq_len`` (calibration, latency); otherwise a batch is padded to
    its longest text (parity checks: same numerics on the real tokens, a fraction of the compute)."""
    from tokenizers import Tokenizer

    tj = Path(model_dir) / "tokenizer.json"
    if not tj.is_file():
        raise ModelError(f"{model_dir}: tokenizer.json missing (needed for sample inputs and embed())")
    tok = Tokenizer.from_file(str(tj))
    pad_id = tok.token_to_id("[PAD]")
    if pad_id is None:
        pad_id = tok.token_to_id("<pad>") or 0
    tok.enable_truncation(max_length=seq_len)
    tok.enable_padding(length=seq_len if fixed_length else None, pad_id=pad_id)
    return tok


def encode_texts(tok: Tokenizer, texts: list[str], input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """One feed per text (batch 1), int64, only the inputs the graph declares."""
    feeds: list[dict[str, np.ndarray]] = []
    for enc in tok.encode_batch(texts):
        full = {
            "input_ids": np.asarray([enc.ids], dtype=np.int64),
            "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
            "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64),
        }
        feeds.append({k: v for k, v in full.items() if k in input_names})
    return feeds


def mean_pool(hidden: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    hidden = hidden.astype(np.float32)
    if hidden.ndim == 2:
        return hidden
    if mask is None:
        mean: np.ndarray = hidden.mean(axis=1)
        return mean
    m = mask.astype(np.float32)[..., None]
    pooled: np.ndarray = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    return pooled


def compare(
    reference: list[np.ndarray], candidate: list[np.ndarray], masks: Sequence[np.ndarray | None] | None = None
) -> dict[str, Any]:
    """Parity of candidate vs reference outputs (one array per sample): max-abs and min/mean cosine.

    Non-finite candidate values (a NaN-producing model) are counted and reported, never warned about:
    numpy's RuntimeWarnings are silenced here so the one-line parity error is all the user sees."""
    if len(reference) != len(candidate):
        raise ValueError("reference and candidate sample counts differ")
    masks = masks or [None] * len(reference)
    max_abs = 0.0
    cosines: list[float] = []
    nonfinite = 0
    with np.errstate(all="ignore"):
        for ref, cand, mask in zip(reference, candidate, masks):
            ref = np.asarray(ref, dtype=np.float32)
            cand = np.asarray(cand, dtype=np.float32)
            if ref.shape != cand.shape:
                raise ValueError(f"output shapes differ: {ref.shape} vs {cand.shape}")
            bad = int(np.count_nonzero(~np.isfinite(cand)))
            nonfinite += bad
            if mask is not None and ref.ndim == 3:
                sel = mask.astype(bool)[..., None]
                diff = np.abs(np.where(sel, ref - cand, 0.0))
            else:
                diff = np.abs(ref - cand)
            max_abs = max(max_abs, float(diff.max()) if not bad else float("inf"))
            a = mean_pool(ref, mask).ravel() if ref.ndim == 3 else ref.ravel()
            b = mean_pool(cand, mask).ravel() if cand.ndim == 3 else cand.ravel()
            denom = float(np.linalg.norm(a) * np.linalg.norm(b))
            cos = float(a @ b / denom) if denom > 0 else (1.0 if np.allclose(a, b) else 0.0)
            cosines.append(cos if bad == 0 and np.isfinite(cos) else 0.0)
    return {
        "samples": len(reference),
        "max_abs": max_abs,
        "min_cosine": float(min(cosines)) if cosines else None,
        "mean_cosine": float(np.mean(cosines)) if cosines else None,
        "nonfinite": nonfinite,
        "metric": "cosine of mask-aware mean-pooled output (rank-3) or flattened output; max-abs over valid tokens",
    }


def check_thresholds(metrics: Mapping[str, Any], thresholds: Mapping[str, Any]) -> str | None:
    """Return a one-line reason when a threshold is missed, else None."""
    if metrics.get("nonfinite"):
        return f"the output has {metrics['nonfinite']} non-finite values (NaN/Inf)"
    min_cos = thresholds.get("min_cosine")
    if min_cos is not None and metrics["min_cosine"] is not None and metrics["min_cosine"] < min_cos:
        return f"min cosine {metrics['min_cosine']:.5f} < {min_cos}"
    max_abs = thresholds.get("max_abs")
    if max_abs is not None and metrics["max_abs"] > max_abs:
        return f"max abs error {metrics['max_abs']:.4g} > {max_abs}"
    return None


# ------------------------------------------------------------------ padded, batched inputs (as embed() runs them)


def embed_max_length(model_dir: Path) -> int:
    """The truncation length :meth:`edgesdk.runtime.session.Session.embed` uses for this model's texts:
    tokenizer_config's ``model_max_length`` (512 if absent), capped by sentence_bert_config's
    ``max_seq_length`` and config.json's ``max_position_embeddings``."""
    import json

    def field(name: str, key: str) -> int | None:
        path = Path(model_dir) / name
        try:
            value = json.loads(path.read_text()).get(key) if path.is_file() else None
            return int(value) if value else None
        except (ValueError, TypeError, AttributeError, OSError):
            return None

    limit = min(field("tokenizer_config.json", "model_max_length") or 512, 8192)
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("config.json", "max_position_embeddings")):
        limit = min(limit, field(name, key) or limit)
    return limit


def long_feeds(
    model_dir: Path, max_len: int, input_names: Sequence[str], n: int = 4, offset: int = 200
) -> list[dict[str, np.ndarray]]:
    """``n`` batch-1 feeds of long texts (sample sentences run together): half of them ``max_len`` tokens,
    half about 0.8x that, the lengths that widened a short neighbour's INT8 scale the most."""
    tok = load_tokenizer(Path(model_dir), max_len, fixed_length=False)
    text = " ".join(sample_sentences(400, offset))
    feeds = []
    for i in range(n):
        words = text.split()
        start = (i * 97) % max(len(words) - 1, 1)
        target = max_len if i % 2 == 0 else max(int(0.8 * max_len), 8)
        tok.enable_truncation(max_length=target)
        feeds.extend(encode_texts(tok, [" ".join(words[start:] + words[:start])], input_names))
    return feeds


def _right_pad(feeds: Sequence[Mapping[str, np.ndarray]], pad_id: int) -> dict[str, np.ndarray]:
    """Batch-1 feeds stacked into one batch, right-padded to the longest (pad id, mask 0, type 0)."""
    width = max(f["input_ids"].shape[1] for f in feeds)
    batch: dict[str, np.ndarray] = {}
    for key in feeds[0]:
        fill = pad_id if key == "input_ids" else 0
        batch[key] = np.stack([np.pad(f[key][0], (0, width - f[key].shape[1]), constant_values=fill) for f in feeds])
    return batch


def padded_batches(
    feeds: Sequence[Mapping[str, np.ndarray]],
    extra: Sequence[Mapping[str, np.ndarray]],
    pad_id: int,
    *,
    how: str,
    max_batch: int | None = None,
) -> list[tuple[dict[str, np.ndarray], list[int]]]:
    """Padded batches of the batch-1 text ``feeds`` (plus ``extra`` long texts as neighbours).

    ``how="embed"``: grouped exactly as ``Session.embed`` groups texts (:func:`plan_embed_batches`).
    ``how="pairs"``: every feed beside one long text, one batch each (a caller batching by itself).
    Returns ``(batch feed, rows)``; ``rows[j]`` is the index in ``feeds`` of row ``j`` (-1: a long text)."""
    from edgesdk.formats.embed_batches import EMBED_MAX_BATCH, plan_embed_batches

    pool = list(feeds) + list(extra)
    owner = list(range(len(feeds))) + [-1] * len(extra)
    if how == "pairs":
        if not extra:
            return []
        groups = [[i, len(feeds) + i % len(extra)] for i in range(len(feeds))]
    elif how == "embed":
        groups = plan_embed_batches([int(f["attention_mask"].sum()) for f in pool], max_batch or EMBED_MAX_BATCH)
    else:
        raise ValueError(f"unknown batching {how!r}")
    return [(_right_pad([pool[i] for i in g], pad_id), [owner[i] for i in g]) for g in groups]


def batched_parity(
    reference: Sequence[np.ndarray],
    masks: Sequence[np.ndarray | None],
    batches: Sequence[tuple[Mapping[str, np.ndarray], list[int]]],
    run: Any,
) -> dict[str, Any]:
    """Cosine of each text's mean-pooled output inside its padded batch vs its batch-1 reference.

    ``run(feed) -> first output [batch, seq, dim]``; ``reference[i]``/``masks[i]`` are feed i's reference
    output and mask (batch 1, unpadded)."""
    cosines: list[float] = []
    nonfinite = 0
    with np.errstate(all="ignore"):
        for feed, rows in batches:
            hidden = np.asarray(run(feed), dtype=np.float32)
            pooled = mean_pool(hidden, feed.get("attention_mask"))
            for j, i in enumerate(rows):
                if i < 0:
                    continue
                a = mean_pool(np.asarray(reference[i], dtype=np.float32), masks[i]).ravel()
                b = pooled[j].ravel()
                bad = int(np.count_nonzero(~np.isfinite(b)))
                nonfinite += bad
                denom = float(np.linalg.norm(a) * np.linalg.norm(b))
                cos = float(a @ b / denom) if denom > 0 and not bad else 0.0
                cosines.append(cos if np.isfinite(cos) else 0.0)
    sizes = [len(rows) for _, rows in batches]
    widths = [int(feed["input_ids"].shape[1]) for feed, _ in batches]
    return {
        "samples": len(cosines),
        "min_cosine": float(min(cosines)) if cosines else None,
        "mean_cosine": float(np.mean(cosines)) if cosines else None,
        "nonfinite": nonfinite,
        "batches": len(batches),
        "batch_size_max": max(sizes, default=0),
        "padded_length_max": max(widths, default=0),
    }


def embed_batch_parity(
    reference: Sequence[np.ndarray],
    masks: Sequence[np.ndarray | None],
    feeds: Sequence[Mapping[str, np.ndarray]],
    extra: Sequence[Mapping[str, np.ndarray]],
    pad_id: int,
    run: Any,
    min_cosine: float | None,
) -> dict[str, Any]:
    """:func:`batched_parity` of ``feeds`` (+ ``extra``) batched as ``Session.embed`` batches them, with at
    most 32, 16, ... 1 texts per batch: the first size whose min cosine reaches ``min_cosine`` is kept
    (``embed_max_batch``; 1 means each text alone), with every size tried in ``min_cosine_by_max_batch``."""
    from edgesdk.formats.embed_batches import EMBED_MAX_BATCH

    tried: dict[str, float | None] = {}
    out: dict[str, Any] = {}
    size = EMBED_MAX_BATCH
    for size in sorted({EMBED_MAX_BATCH, 16, 8, 4, 2, 1}, reverse=True):
        out = batched_parity(reference, masks, padded_batches(feeds, extra, pad_id, how="embed", max_batch=size), run)
        tried[str(size)] = out["min_cosine"]
        if min_cosine is None or (out["min_cosine"] is not None and out["min_cosine"] >= min_cosine):
            break
    out["embed_max_batch"] = size
    out["min_cosine_by_max_batch"] = tried
    return out
