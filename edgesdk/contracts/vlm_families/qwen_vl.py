# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-VL's and Qwen2-VL's runtime records: one chat template, one image processor (dynamic resolution) and one
prompt for both generations (build side: ``formats/vlm/families/qwen25vl.py``, ``qwen2vl.py``).

Dynamic resolution (:func:`smart_resize`): the runtime resizes each image as the HF processor does (Pillow, the
processor's bicubic filter) and gives libmtmd the resized pixels with image-token limits that make its own resize a
copy (``mtmd_context_params.image_min_tokens`` / ``image_max_tokens``). llama.cpp caps an image at
:data:`MAX_IMAGE_TOKENS` tokens (its default for Qwen-VL); larger images are resized down to that many tokens, where
the HF processor would keep up to ``max_pixels`` (16384 tokens for Qwen2.5-VL-3B).

The prompt: Qwen2.5-VL's chat template (a default system turn ``You are a helpful assistant.``); one image is
``<|vision_start|><|image_pad|>...<|vision_end|>``, and libmtmd wraps each media marker in ``<|vision_start|>`` /
``<|vision_end|>`` itself, so the runtime writes the marker alone.
"""

from __future__ import annotations

import math
from typing import Any

from edgesdk.contracts.vlm_families import RuntimeFamily, parts

SYSTEM = "You are a helpful assistant."
TURN = "<|im_start|>{role}\n{body}<|im_end|>\n"
GENERATION = "<|im_start|>assistant\n"
MAX_IMAGE_TOKENS = 4096  # llama.cpp's cap for Qwen-VL images (clip.cpp: set_limit_image_tokens(8, 4096))
# the image processor both Qwen-VL generations save
PROCESSOR_TYPES = frozenset({"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"})
PROCESSOR_KEYS = frozenset({"temporal_patch_size"})


def pixel_limits(pre: dict[str, Any]) -> tuple[int, int]:
    """(min_pixels, max_pixels) of the image processor: ``size.shortest_edge`` / ``longest_edge`` (transformers
    >= 4.50 reads these), else ``min_pixels`` / ``max_pixels``, else Qwen2-VL's defaults."""
    size = pre.get("size") or {}
    lo = size.get("shortest_edge") if isinstance(size, dict) else None
    hi = size.get("longest_edge") if isinstance(size, dict) else None
    lo = lo if isinstance(lo, int) else pre.get("min_pixels", 56 * 56)
    hi = hi if isinstance(hi, int) else pre.get("max_pixels", 28 * 28 * 1280)
    return int(lo), int(hi)


def factor(pre: dict[str, Any]) -> int:
    """The side of one image token in pixels: patch_size x merge_size (28 for Qwen2-VL and Qwen2.5-VL)."""
    return int(pre.get("patch_size", 14)) * int(pre.get("merge_size", 2))


def smart_resize(height: int, width: int, pre: dict[str, Any]) -> tuple[int, int]:
    """(height, width) the image processor resizes an image to: each edge rounded to a multiple of
    :func:`factor`, then scaled (aspect kept) into [min_pixels, max_pixels], with llama.cpp's cap of
    :data:`MAX_IMAGE_TOKENS` tokens as a further maximum (the same arithmetic as transformers' ``smart_resize``)."""
    f = factor(pre)
    lo, hi = pixel_limits(pre)
    hi = min(hi, MAX_IMAGE_TOKENS * f * f)
    h_bar, w_bar = round(height / f) * f, round(width / f) * f
    if h_bar * w_bar > hi:
        beta = math.sqrt(height * width / hi)
        h_bar, w_bar = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < lo:
        beta = math.sqrt(lo / (height * width))
        h_bar, w_bar = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h_bar, w_bar


def max_image_tokens(pre: dict[str, Any]) -> int:
    """The most image tokens one image becomes: max_pixels over one token's pixels, at most llama.cpp's cap."""
    return min(MAX_IMAGE_TOKENS, pixel_limits(pre)[1] // factor(pre) ** 2)


def user_prompt(text: str, n_images: int, marker: str) -> str:
    """Qwen2.5-VL's chat template for one user turn (the default system turn, images first) + the generation
    prompt."""
    return (
        TURN.format(role="system", body=SYSTEM) + TURN.format(role="user", body=marker * n_images + text) + GENERATION
    )


def chat(messages: list[dict[str, Any]], marker: str) -> str:
    """Qwen2.5-VL's chat template: the default system turn unless the first message is one, each message
    ``<|im_start|>role\\n`` + its parts (images where they appear) + ``<|im_end|>\\n``, then
    ``<|im_start|>assistant\\n``."""
    text = "" if messages and messages[0]["role"] == "system" else TURN.format(role="system", body=SYSTEM)
    for m in messages:
        body = "".join(p["text"] if p.get("type") == "text" else marker for p in parts(m["content"]))
        text += TURN.format(role=m["role"], body=body)
    return text + GENERATION


def _record(name: str, display: str) -> RuntimeFamily:
    return RuntimeFamily(
        name=name,
        display=display,
        user_prompt=user_prompt,
        chat=chat,
        processor_types=PROCESSOR_TYPES,
        processor_keys=PROCESSOR_KEYS,
        frames="dynamic",
        max_image_tokens=max_image_tokens,
        resize=smart_resize,
    )


# Qwen2.5-VL first: a bundle whose manifest names no family gets it from by_processor (the same resize and prompt)
FAMILIES = (_record("qwen25vl", "Qwen2.5-VL"), _record("qwen2vl", "Qwen2-VL"))
