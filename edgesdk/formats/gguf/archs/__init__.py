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
    "qwen2vl",
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


def chat_template_for(arch: str) -> str | None:
    """The shipped chat template for a model of architecture ``arch`` that carries none: ``arch`` is a HF class
    name (``Gemma3ForCausalLM``) or llama.cpp's ``general.architecture`` (``gemma3``). None when no record names
    one, or when the records of one llama.cpp architecture disagree (``llama`` is Llama's and Mistral's)."""
    if arch in ARCHS:
        return ARCHS[arch].chat_template
    found = {rec.chat_template for rec in ARCHS.values() if rec.gguf_arch == arch}
    return found.pop() if len(found) == 1 else None


__all__ = ["ARCHS", "TextArch", "chat_template_for"]
