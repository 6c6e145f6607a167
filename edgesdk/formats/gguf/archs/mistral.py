# SPDX-License-Identifier: Apache-2.0
"""Mistral (``MistralForCausalLM``: Mistral-7B v0.2 / v0.3, Mistral-Nemo, Ministral): llama's graph in llama.cpp
(its own converter registers the class under the llama architecture), so llama's Q/K row permutation applies;
head_dim may differ from hidden / heads (Mistral-Nemo: 128 vs 160, written as key/value_length). Mistral-7B v0.1
attends through a 4096-token sliding window that llama.cpp's llama graph does not have: refused."""

from __future__ import annotations

from edgesdk.errors import ModelError
from edgesdk.formats.gguf.archs import llama
from edgesdk.formats.gguf.archs.base import Config, TextArch


def _check(config: Config, where: str) -> None:
    window = config.get("sliding_window")
    if window and int(window) < int(config.get("max_position_embeddings") or 0):
        raise ModelError(
            f"{where}: sliding_window {window} is not supported for mistral (llama.cpp's llama graph "
            "attends to the whole context)"
        )


ARCH = TextArch(
    gguf_arch="llama",
    hf_classes=("MistralForCausalLM",),
    check=_check,
    transform=llama.ARCH.transform,
    chat_template="mistral",
    notes="llama.cpp's llama graph; Q/K rows permuted as llama's; a sliding window is refused",
)
