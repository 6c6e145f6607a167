# SPDX-License-Identifier: Apache-2.0
"""The runtime's per-family behaviour, chosen by the family record
(:class:`edgesdk.contracts.vlm_families.RuntimeFamily`).

The record's ``frames`` picks one strategy (:func:`frames_for`), which answers what the preprocessor and the
pipeline used to branch on:

* ``single`` (LLaVA, Gemma-3; also any value not named here): one encoder input per image, resized to the
  processor's ``size`` (SigLIP) or shortest edge + center crop (CLIP); the size limit is 16x the largest
  configured edge, squared;
* ``tiles`` (Idefics3 / SmolVLM): the longest edge then the square tile, or with ``do_image_splitting`` whole tiles
  + a global image (:meth:`ImagePreprocessor.tiles <edgesdk.runtime.backends.vlm.preprocess.ImagePreprocessor.tiles>`);
  libmtmd's per-marker layout is collapsed to the processor's (``VLMPipeline._image_layout``);
* ``dynamic`` (Qwen2.5-VL / Qwen2-VL): the processor's own size for each image (the record's ``resize``), the size
  limit from its ``max_pixels``, and libmtmd told image-token limits under which it keeps that size.

The record's ``image_text`` (a family that writes each image's own layout) picks :func:`image_frames`' tiled path.
The Pillow work itself stays in :mod:`edgesdk.runtime.backends.vlm.preprocess`; these strategies only choose it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from edgesdk.contracts.vlm_families import RuntimeFamily


class Preprocessor(Protocol):
    """What the strategies use of :class:`edgesdk.runtime.backends.vlm.preprocess.ImagePreprocessor`."""

    def resize_fixed(self, img: Any) -> Any: ...

    def resize_tile(self, img: Any) -> Any: ...

    def resize_dynamic(self, img: Any) -> Any: ...

    def tiles(self, img: Any) -> tuple[int, int, list[np.ndarray]]: ...

    def __call__(self, img: Any) -> np.ndarray: ...


class SingleFrames:
    """``frames = "single"``: one resized encoder input per image."""

    name = "single"
    collapse_layout = False  # libmtmd's chunks are the family's token layout as they are

    def __init__(self, record: RuntimeFamily):
        self.record = record

    def max_pixels(self, config: dict[str, Any], image_size: int) -> int:
        """The size limit before the floor (:meth:`ImagePreprocessor.max_pixels`): 16x the largest configured edge,
        squared."""
        size = config.get("size") or {}
        edges = [image_size] + (
            [int(v) for v in size.values() if isinstance(v, (int, float))] if isinstance(size, dict) else []
        )
        edges += [int(v) for v in (config.get("max_image_size") or {}).values() if isinstance(v, (int, float))]
        return (16 * max(edges)) ** 2

    def size_basis(self, image_size: int) -> str:
        """How a size refusal explains the limit."""
        return f"16x its {image_size} px input per side"

    def splitting(self, config: dict[str, Any]) -> bool:
        """Whether an image becomes tiles + a global image."""
        return False

    def resize(self, pre: Preprocessor, img: Any) -> Any:
        """An RGB image resized as the family's processor does it."""
        return pre.resize_fixed(img)

    def mtmd_image_tokens(self, preprocessor: dict[str, Any]) -> tuple[int, int] | None:
        """(min, max) image tokens to set in libmtmd's context parameters, or None to keep its defaults."""
        return None

    def image_tokens(self, pre: Any, width: int, height: int) -> int | None:
        """The image tokens an image of ``width x height`` becomes, from its size alone (before any pixel is
        decoded); None when the bundle records no tokens per frame (``pre.config["_image_tokens"]``)."""
        per_frame = pre.config.get("_image_tokens")
        return int(per_frame) if isinstance(per_frame, int) and per_frame > 0 else None


class TileFrames(SingleFrames):
    """``frames = "tiles"``: Idefics3 / SmolVLM square tiles."""

    name = "tiles"
    collapse_layout = True  # libmtmd wraps each marker as a 1x1 grid: collapsed to one chunk per frame

    def splitting(self, config: dict[str, Any]) -> bool:
        return bool(config.get("do_image_splitting", False))

    def resize(self, pre: Preprocessor, img: Any) -> Any:
        return pre.resize_tile(img)

    def image_tokens(self, pre: Any, width: int, height: int) -> int | None:
        # with splitting: rows x cols tiles + the global image, each a frame (ImagePreprocessor.tiles)
        per_frame = super().image_tokens(pre, width, height)
        if per_frame is None or not self.splitting(pre.config):
            return per_frame
        rows, cols = pre.tile_grid(width, height)
        return per_frame * (int(rows) * int(cols) + 1)


class DynamicFrames(SingleFrames):
    """``frames = "dynamic"``: the processor's own size for each image (Qwen-VL)."""

    name = "dynamic"

    def max_pixels(self, config: dict[str, Any], image_size: int) -> int:
        # Qwen-VL: size holds pixel counts (min / max pixels), not edges
        size = config.get("size") or {}
        most = (size.get("longest_edge") if isinstance(size, dict) else None) or config.get("max_pixels")
        return 16 * int(most or 0)

    def size_basis(self, image_size: int) -> str:
        return "16x its image processor's max_pixels"

    def resize(self, pre: Preprocessor, img: Any) -> Any:
        # without the record's resize hook, the single-frame resize
        return pre.resize_dynamic(img) if self.record.resize is not None else pre.resize_fixed(img)

    def image_tokens(self, pre: Any, width: int, height: int) -> int | None:
        # the processor's own size for this image (the record's resize), one token per patch_size x merge_size
        if self.record.resize is None:
            return super().image_tokens(pre, width, height)
        h, w = self.record.resize(height, width, pre.config)
        side = int(pre.config.get("patch_size", 14)) * int(pre.config.get("merge_size", 2))
        return max(1, (h // side) * (w // side))

    def mtmd_image_tokens(self, preprocessor: dict[str, Any]) -> tuple[int, int] | None:
        if self.record.max_image_tokens is None:
            return None
        # the runtime resizes each image as the HF processor does (ImagePreprocessor); these limits make
        # libmtmd's own resize of those pixels a copy (clip.cpp's defaults for Qwen-VL are 8..4096 tokens)
        return 1, int(self.record.max_image_tokens(preprocessor) or 0) or -1


STRATEGIES: dict[str, type[SingleFrames]] = {"single": SingleFrames, "tiles": TileFrames, "dynamic": DynamicFrames}


def frames_for(record: RuntimeFamily) -> SingleFrames:
    """The strategy of the record's ``frames`` (``single`` for a value not in :data:`STRATEGIES`)."""
    return STRATEGIES.get(record.frames, SingleFrames)(record)


def image_frames(
    pre: Preprocessor, record: RuntimeFamily, img: Any, marker: str
) -> tuple[list[np.ndarray], str | None]:
    """One decoded image's encoder frames and, when the record writes each image's own layout (``image_text``),
    that layout with one ``marker`` per frame (None otherwise: the image stays one marker)."""
    if record.image_text is not None:
        rows, cols, tiles = pre.tiles(img)
        return tiles, record.image_text(rows, cols, marker)
    return [pre(img)], None
