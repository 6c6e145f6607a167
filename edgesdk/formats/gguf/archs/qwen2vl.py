# SPDX-License-Identifier: Apache-2.0
"""The language model of Qwen2-VL / Qwen2.5-VL (HF ``Qwen2VLTextModel`` / ``Qwen2_5_VLTextModel``, the decoder of
``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration``): Qwen2's decoder (Q/K/V biases, NEOX
rope pairing) with multimodal rotary positions (M-RoPE).

M-RoPE splits each head's rotary frequencies into sections (``rope_scaling.mrope_section``, [16, 24, 24] in
Qwen2.5-VL-3B/7B: temporal, height, width) rotated by three position ids. llama.cpp's ``qwen2vl`` architecture reads
the sections from ``rope.dimension_sections`` (four entries, the unused fourth 0) and the positions per token from the
batch: a text token's one position is used in every section, an image token gets (t, row, column) from libmtmd's
helper. With text only the three ids are equal and M-RoPE is Qwen2's rope, which is why the text parity reference
is the same weights run as ``Qwen2ForCausalLM`` (the VLM family writes the decoder directory that way).

transformers 4.57 saves ``rope_scaling {"type": "default", "mrope_section": [...]}`` (it rewrites the hub's
``"mrope"`` to ``"default"``); the hub's ``{"type": "mrope", ...}`` and transformers 5's ``rope_parameters`` are read
the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgesdk.errors import ModelError
from edgesdk.formats.gguf.archs.base import Config, Hparams, TextArch

if TYPE_CHECKING:
    from gguf import GGUFWriter


def mrope_section(config: Config) -> list[int] | None:
    """``mrope_section`` of a transformers 4 (``rope_scaling``) or 5 (``rope_parameters``) config; None if absent."""
    for key in ("rope_scaling", "rope_parameters"):
        value: Any = config.get(key)
        if isinstance(value, dict) and value.get("mrope_section") is not None:
            section = value["mrope_section"]
            if not (
                isinstance(section, list)
                and 1 <= len(section) <= 4
                and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)
            ):
                raise ModelError(
                    f"config.json: {key}.mrope_section must be a list of up to 4 non-negative "
                    f"integers, got {section!r}"[:200]
                )
            return list(section)
    return None


def _check(config: Config, where: str) -> None:
    section = mrope_section(config)
    if section is None:
        raise ModelError(f"{where}: no rope_scaling.mrope_section (the qwen2vl decoder's M-RoPE sections)")
    heads, hidden = int(config.get("num_attention_heads") or 1), int(config.get("hidden_size") or 0)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    if 2 * sum(section) != head_dim:
        raise ModelError(
            f"{where}: mrope_section {section} covers {2 * sum(section)} of the {head_dim} rotary "
            "dimensions of a head (Qwen-VL's sections cover all of them)"
        )
    if config.get("use_sliding_window"):
        raise ModelError(
            f"{where}: use_sliding_window is not supported for qwen2vl (llama.cpp's qwen2vl graph "
            "has no sliding-window layers)"
        )


def _metadata(writer: GGUFWriter, config: Config, hp: Hparams) -> None:
    section = mrope_section(config) or []
    writer.add_rope_dimension_sections(section + [0] * (4 - len(section)))


ARCH = TextArch(
    gguf_arch="qwen2vl",
    hf_classes=("Qwen2_5_VLTextModel", "Qwen2VLTextModel"),
    rope_types=("default", "mrope"),
    check=_check,
    metadata=_metadata,
    chat_template="chatml",
    notes="Qwen2 decoder with M-RoPE: rope.dimension_sections from rope_scaling.mrope_section "
    "(image tokens get (t, row, column) positions from libmtmd)",
)
