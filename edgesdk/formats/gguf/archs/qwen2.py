# SPDX-License-Identifier: Apache-2.0
"""Qwen2 (``Qwen2ForCausalLM``): llama-shaped with Q/K/V biases; llama.cpp runs it with NEOX rope, the same
pairing as HF's ``rotate_half``, so no tensor is rewritten."""

from __future__ import annotations

from edgesdk.formats.gguf.archs.base import TextArch

ARCH = TextArch(
    gguf_arch="qwen2",
    hf_classes=("Qwen2ForCausalLM",),
    chat_template="chatml",
    notes="Q/K/V biases, NEOX rope (no permute)",
)
