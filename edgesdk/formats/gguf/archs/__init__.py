# SPDX-License-Identifier: Apache-2.0
"""Text architectures the HF -> GGUF converter knows: one module per family, one registry line each.

Adding a family: write ``archs/<family>.py`` with an ``ARCH = TextArch(...)`` (:mod:`.base` says what a record
holds) and add the module to :data:`_MODULES`. Everything else (inspect / plan facts, the supported list in
errors, the converter) reads :data:`ARCHS`.
"""

from __future__ import annotations

from edgesdk.formats.gguf.archs import gemma3, llama, phi3, qwen2, qwen3
from edgesdk.formats.gguf.archs.base import TextArch

_MODULES = (
    llama,
    qwen2,
    qwen3,
    gemma3,
    phi3,
)

# HF class name (config.json architectures[0]) -> its record
ARCHS: dict[str, TextArch] = {cls: m.ARCH for m in _MODULES for cls in m.ARCH.hf_classes}

__all__ = ["ARCHS", "TextArch"]
