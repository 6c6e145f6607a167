# SPDX-License-Identifier: Apache-2.0
"""Llama (``LlamaForCausalLM``): the reference decoder. HF applies rotary embedding with ``rotate_half`` (dims i
and i + d/2 pair up); llama.cpp's LLAMA architecture uses the "normal" rope that pairs adjacent dims, so Q and K
rows are re-ordered per head (:func:`permute_rope_rows`)."""

from __future__ import annotations

import numpy as np

from edgesdk.formats.gguf.archs.base import Config, Hparams, TextArch


def permute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Re-order each head's rows from HF's half-split rope layout to llama.cpp's interleaved one:
    new row 2j+h of a head is old row h*(d/2)+j."""
    rows = weight.shape[0]
    d = rows // n_head
    out: np.ndarray = weight.reshape(n_head, 2, d // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    return out


def _transform(name: str, data: np.ndarray, config: Config, hp: Hparams) -> np.ndarray:
    if name.endswith("q_proj.weight"):
        return permute_rope_rows(data, hp.n_head)
    if name.endswith("k_proj.weight"):
        return permute_rope_rows(data, hp.n_kv)
    return data


ARCH = TextArch(
    gguf_arch="llama",
    hf_classes=("LlamaForCausalLM",),
    transform=_transform,
    notes="Q/K rows permuted from HF's rotate_half layout to llama.cpp's interleaved rope",
)
