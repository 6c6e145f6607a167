# SPDX-License-Identifier: Apache-2.0
"""Phi-3 / Phi-4-mini (``Phi3ForCausalLM``).

* Fused projections: ``self_attn.qkv_proj`` -> ``attn_qkv`` and ``mlp.gate_up_proj`` -> ``ffn_up`` (gate rows
  first, then up: llama.cpp's phi3 graph splits the fused tensor the same way); gguf-py's PHI3 map names both.
* NEOX rope (HF's ``rotate_half`` pairing), over ``partial_rotary_factor`` of each head (Phi-4-mini: 0.75 of 128 =
  96 dims): ``rope.dimension_count``.
* Long-rope (``rope_scaling.type`` ``longrope``, or ``su`` in older configs): the 128k-context models carry
  per-dimension frequency divisors in config.json. llama.cpp reads them as the tensors ``rope_factors_long`` and
  ``rope_factors_short`` (rope_dim / 2 floats each), uses the long ones when the context it is given exceeds
  ``rope.scaling.original_context_length`` (HF: when the sequence does), and multiplies cos/sin by
  ``rope.scaling.attn_factor`` = sqrt(1 + ln(s) / ln(original context)), s = max_position_embeddings / original,
  the factor HF's longrope applies.
* ``attention.sliding_window``: the config's value, 0 when it has none (how llama.cpp tells Phi-4 from Phi-3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from edgesdk.errors import ModelError
from edgesdk.formats.gguf.archs.base import Config, Hparams, TextArch, finite

if TYPE_CHECKING:
    from gguf import GGUFWriter


def _original_context(config: Config, hp: Hparams) -> int:
    value = hp.rope.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
    return int(value) if value else hp.context


def _factors(hp: Hparams, key: str, where: str) -> np.ndarray:
    values = hp.rope.get(key)
    if not isinstance(values, list) or len(values) != hp.rope_dim // 2:
        got = len(values) if isinstance(values, list) else values
        raise ModelError(f"{where}: rope_scaling.{key} must list {hp.rope_dim // 2} numbers (rope dims / 2), got {got}")
    arr = np.asarray([finite(v, f"rope_scaling.{key} entry", where) for v in values], dtype=np.float32)
    if (arr <= 0).any():
        raise ModelError(f"{where}: rope_scaling.{key} has a value <= 0")
    return arr


def _metadata(writer: GGUFWriter, config: Config, hp: Hparams) -> None:
    writer.add_sliding_window(int(config.get("sliding_window") or 0))
    original = _original_context(config, hp)
    writer.add_rope_scaling_orig_ctx_len(original)
    if hp.rope_type in ("longrope", "su"):
        scale = hp.context / original
        attn = hp.rope.get("attention_factor")
        if attn is None:
            attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
        writer.add_rope_scaling_attn_factors(finite(attn, "rope_scaling.attention_factor", "config.json"))


def _extra_tensors(config: Config, hp: Hparams) -> Iterable[tuple[str, np.ndarray]]:
    if hp.rope_type not in ("longrope", "su"):
        return []
    return [
        ("rope_factors_long.weight", _factors(hp, "long_factor", "config.json")),
        ("rope_factors_short.weight", _factors(hp, "short_factor", "config.json")),
    ]


ARCH = TextArch(
    gguf_arch="phi3",
    hf_classes=("Phi3ForCausalLM",),
    rope_types=("default", "longrope", "su"),
    metadata=_metadata,
    extra_tensors=_extra_tensors,
    chat_template="phi-3",
    notes="fused qkv and gate_up, partial rotary, long-rope factors as rope_factors_long/short tensors",
)
