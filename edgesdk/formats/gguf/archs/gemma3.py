# SPDX-License-Identifier: Apache-2.0
"""Gemma-3 text (``Gemma3ForCausalLM``: Gemma-3-270M, Gemma-3-1B).

What differs from llama, and where llama.cpp's ``gemma3`` graph expects it:

* RMS norms scale by ``1 + w`` (``Gemma3RMSNorm``); llama.cpp multiplies by the stored weight, so every
  ``*norm.weight`` (input, post-attention, pre/post-feed-forward, q/k and the final norm) is stored as ``1 + w``,
  as llama.cpp's convert_hf_to_gguf does for gemma3.
* Four norms per block (``post_attention_layernorm`` -> ``post_attention_norm``, ``pre_feedforward_layernorm`` ->
  ``ffn_norm``, ``post_feedforward_layernorm`` -> ``post_ffw_norm``) and per-head q/k norms: gguf-py's GEMMA3 map.
* Sliding-window layers: ``sliding_window`` and the per-layer pattern from ``layer_types`` (True = sliding) go
  into ``attention.sliding_window`` / ``attention.sliding_window_pattern``; local layers use
  ``rope_local_base_freq`` (``rope.freq_base_swa``), global ones ``rope_theta`` (``rope.freq_base``); a linear
  rope_scaling applies to the global layers only, in HF and llama.cpp alike. transformers 5 writes both as
  ``rope_parameters: {full_attention: {...}, sliding_attention: {...}}``, read the same way.
* Embeddings are scaled by sqrt(hidden) inside llama.cpp's graph, as HF's ``Gemma3TextScaledWordEmbedding``
  does: nothing to write. The output is tied to the embedding (no ``lm_head.weight`` is saved).
* Attention scale: llama.cpp uses 1/sqrt(head_dim) (``query_pre_attn_scalar`` = head_dim in every Gemma3ForCausalLM
  config; 1/sqrt(hidden / heads) for its 62-layer 27B type) and reads no scale from the file: another value is
  refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgesdk.errors import ModelError
from edgesdk.formats.gguf.archs.base import Config, Hparams, TextArch, finite

if TYPE_CHECKING:
    from gguf import GGUFWriter


def layer_types(config: Config, n_layer: int) -> list[str]:
    """``layer_types`` of the config, else Gemma-3's default: every ``sliding_window_pattern``-th layer global."""
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == n_layer:
        return [str(t) for t in types]
    pattern = int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layer)]


def _check(config: Config, where: str) -> None:
    if config.get("attn_logit_softcapping") is not None:
        raise ModelError(
            f"{where}: attn_logit_softcapping is not supported for gemma3 (llama.cpp's gemma3 graph "
            "has no attention soft-capping)"
        )
    if config.get("use_bidirectional_attention"):
        raise ModelError(f"{where}: use_bidirectional_attention (an embedding model) is not a causal LM for gemma3")
    n_layer = int(config.get("num_hidden_layers") or 0)
    scalar = config.get("query_pre_attn_scalar")
    heads, hidden = int(config.get("num_attention_heads") or 1), int(config.get("hidden_size") or 0)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    # llama.cpp's gemma3 scales attention by 1/sqrt(head_dim), by 1/sqrt(hidden / heads) for its 62-layer (27B)
    # type, and reads no scale from the file (measured: attention.scale written, min cosine 0.81)
    if scalar is not None and int(scalar) != head_dim and not (n_layer == 62 and int(scalar) == hidden // heads):
        raise ModelError(
            f"{where}: query_pre_attn_scalar {scalar} is not supported for gemma3 (llama.cpp scales "
            f"attention by 1/sqrt(head_dim {head_dim}))"
        )
    bad = sorted({t for t in layer_types(config, n_layer) if t not in ("sliding_attention", "full_attention")})
    if bad:
        raise ModelError(f"{where}: layer_types {', '.join(bad)} are not gemma3 layer types")


def _metadata(writer: GGUFWriter, config: Config, hp: Hparams) -> None:
    import gguf

    where = "config.json"
    types = layer_types(config, hp.n_layer)
    window = config.get("sliding_window")
    if window and any(t == "sliding_attention" for t in types):
        writer.add_sliding_window(int(window))
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    local = config.get("rope_local_base_freq", 10000.0)
    writer.add_rope_freq_base_swa(finite(local, "rope_local_base_freq", where))
    if hp.rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(finite(hp.rope.get("factor"), "rope_scaling.factor", where))
    softcap = config.get("final_logit_softcapping")
    if softcap is not None:
        writer.add_final_logit_softcapping(finite(softcap, "final_logit_softcapping", where))


def _transform(name: str, data: np.ndarray, config: Config, hp: Hparams) -> np.ndarray:
    if name.endswith("norm.weight"):
        return data + 1.0  # Gemma3RMSNorm: x * (1 + w); llama.cpp: x * w
    return data


ARCH = TextArch(
    gguf_arch="gemma3",
    hf_classes=("Gemma3ForCausalLM",),
    rope_types=("default", "linear"),
    check=_check,
    metadata=_metadata,
    transform=_transform,
    layer_rope=True,
    chat_template="gemma",
    notes="(1 + w) norms, four norms per block, q/k norms, sliding-window layers with their own rope "
    "base, scaled embeddings (in llama.cpp's graph), tied output",
)
