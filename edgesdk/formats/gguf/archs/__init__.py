# SPDX-License-Identifier: Apache-2.0
"""Text architectures the HF -> GGUF converter knows: one module per family, one registry line each.

Adding a family: write ``archs/<family>.py`` with an ``ARCH = TextArch(...)`` (:mod:`.base` says what a record
holds) and add the module's name to :data:`_MODULES`. Everything else (inspect / plan facts, the supported list in
errors, the converter) reads :data:`ARCHS`.
"""

from __future__ import annotations

from importlib import import_module

from edgesdk.formats.gguf.archs.base import TextArch

_MODULES = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "mistral",
)


def _records() -> dict[str, TextArch]:
    out: dict[str, TextArch] = {}
    for name in _MODULES:
        rec: TextArch = import_module(f"{__name__}.{name}").ARCH
        for cls in rec.hf_classes:
            out[cls] = rec
    return out


# HF class name (config.json architectures[0]) -> its record
ARCHS: dict[str, TextArch] = _records()

__all__ = ["ARCHS", "TextArch"]
