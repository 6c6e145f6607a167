# SPDX-License-Identifier: Apache-2.0
"""The runtime side of each VLM family record (issue 40, item 3): what a device needs to run a VLM bundle of the
family, and nothing of how the build converts one.

A :class:`RuntimeFamily` holds the family's name, how its image processor is recognised in a bundle's
``preprocessor_config.json`` (:func:`by_processor`), the prompt and chat formats, the image-token layout of one
image and how an image is preprocessed (``frames``: ``single`` = one resized encoder input, ``tiles`` = the
Idefics3 frames of :meth:`edgesdk.runtime.backends.vlm.ImagePreprocessor.tiles`, ``dynamic`` = the image at the
processor's own size for it, the record's ``resize``: Qwen2.5-VL / Qwen2-VL). The runtime looks records up here;
the build-side record (:class:`edgesdk.formats.vlm.families.BuildFamily`: HF classes, tensor names, the support
check and the mmproj writer, parity settings) holds its runtime record as ``runtime``.

In :mod:`edgesdk.contracts` (the lowest layer): standard library, numpy-free, no build module. Adding a family: a
module here defining ``FAMILIES`` (its records) and its name in :data:`REGISTRY`, plus the build side in
``edgesdk/formats/vlm/families/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgesdk.errors import ModelError

# the record modules of this package, in lookup order (by_processor: the first whose processor matches; else the
# first record)
REGISTRY = ("llava", "idefics3", "gemma3", "qwen_vl")


@dataclass(frozen=True)
class RuntimeFamily:
    name: str
    display: str  # how messages name it ("LLaVA", "Idefics3/SmolVLM")
    user_prompt: Callable[[str, int, str], str]  # (text, n_images, marker) -> one user turn + generation prompt
    chat: Callable[[list[dict[str, Any]], str], str]  # (validated messages, marker) -> prompt text
    processor_types: frozenset[str] = frozenset()  # image_processor_type values that mean this family
    processor_keys: frozenset[str] = frozenset()  # preprocessor-config keys only this family's processor has
    image_text: Callable[[int, int, str], str] | None = None  # (rows, cols, marker) -> one image's layout
    frames: str = "single"  # preprocessing: "single", "tiles" or "dynamic" (the family's own resize)
    # dynamic resolution (frames "dynamic"): the most image tokens one image becomes, from the image processor's
    # settings, and the size (height, width) the runtime resizes an image of (height, width) to
    max_image_tokens: Callable[[dict[str, Any]], int | None] | None = None
    resize: Callable[[int, int, dict[str, Any]], tuple[int, int]] | None = None


def parts(content: Any) -> list[dict[str, Any]]:
    """A validated message's content as parts (a string is one text part)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def families() -> tuple[RuntimeFamily, ...]:
    return tuple(f for m in REGISTRY for f in importlib.import_module(f"{__name__}.{m}").FAMILIES)


def by_name(name: str) -> RuntimeFamily:
    for f in families():
        if f.name == name:
            return f
    raise ModelError(f"unknown VLM family {name!r} (known: {', '.join(f.name for f in families())})")


def by_processor(preprocessor: dict[str, Any]) -> RuntimeFamily:
    """The family whose image processor wrote ``preprocessor`` (its ``image_processor_type`` or a key only that
    processor has); the first registered family otherwise."""
    for f in families():
        if preprocessor.get("image_processor_type") in f.processor_types or f.processor_keys & set(preprocessor):
            return f
    return families()[0]
