# SPDX-License-Identifier: Apache-2.0
"""Qwen3 (``Qwen3ForCausalLM``): Qwen2 without the Q/K/V biases, with an RMS norm on each head's query and key
(``self_attn.q_norm`` / ``k_norm`` -> ``attn_q_norm`` / ``attn_k_norm``) and a head_dim that is not
hidden / heads (Qwen3-0.6B: 16 heads x 128 on a 1024-wide model; the converter writes key/value_length)."""

from __future__ import annotations

from edgesdk.errors import ModelError
from edgesdk.formats.gguf.archs.base import Config, TextArch


def _check(config: Config, where: str) -> None:
    if config.get("use_sliding_window"):
        # Qwen3Config keeps sliding_window for max_window_layers, but no published Qwen3 turns it on and
        # llama.cpp's qwen3 graph has no sliding-window layers
        raise ModelError(
            f"{where}: use_sliding_window is not supported for qwen3 (llama.cpp has no sliding-window layers for it)"
        )


ARCH = TextArch(
    gguf_arch="qwen3",
    hf_classes=("Qwen3ForCausalLM",),
    check=_check,
    chat_template="chatml",
    notes="per-head q/k RMS norms, head_dim independent of the width, NEOX rope",
)
