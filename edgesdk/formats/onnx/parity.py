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


def compare(reference: list[np.ndarray], candidate: list[np.ndarray],
            masks: Sequence[np.ndarray | None] | None = None) -> dict[str, Any]:
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
