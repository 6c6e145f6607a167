# SPDX-License-Identifier: Apache-2.0
"""VLM image inputs: decoding (Pillow, size-checked from the header before any pixel is decoded) and the model's own
preprocessing (:class:`ImagePreprocessor`: the Pillow resize, center crop, Idefics3 tiles and dynamic resize). Which
of those an image gets is the family record's choice (:mod:`edgesdk.runtime.backends.vlm.families`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.contracts import vlm_families
from edgesdk.errors import InputError, ModelError
from edgesdk.runtime.backends.vlm.families import frames_for

# image inputs (issue 25 finding 8): a file larger than this is refused unread; decoded size is limited per model
# (ImagePreprocessor.max_pixels: 16x the model's input side, squared, at least MIN_MAX_SIDE squared)
MAX_IMAGE_BYTES = 256 * 1024 * 1024
MIN_MAX_SIDE = 4096
MAX_ASPECT = 200  # width:height (either way) at most 200:1, as Qwen2-VL's processor allows


def decode_image(fh: Any, what: str, check_size: Callable[[int, int, str], None], max_pixels: int | None = None) -> Any:
    """Open ``fh`` with Pillow, pass the header's width x height to ``check_size`` (which raises InputError), and
    only then decode the pixels. Any failure is an InputError naming ``what``; ``max_pixels`` is quoted when
    Pillow's own decompression-bomb check refuses the header."""
    return load_pixels(open_image(fh, what, check_size, max_pixels), what)


def open_image(fh: Any, what: str, check_size: Callable[[int, int, str], None], max_pixels: int | None = None) -> Any:
    """The first half of :func:`decode_image`: Pillow's lazily opened image (format and size read from the header,
    no pixel decoded), its size passed to ``check_size``; :func:`load_pixels` decodes it."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(fh)
    except Image.DecompressionBombError as exc:  # Pillow's own header check (over 2x Image.MAX_IMAGE_PIXELS)
        import re

        n = re.search(r"\((\d+) pixels\)", str(exc))
        count = f"{int(n.group(1)):,} pixels" if n else "its size"
        limit = f" ({max_pixels:,} pixels)" if max_pixels else ""
        raise InputError(
            f"{what}: {count} is more than this model takes{limit}: "
            "refused before decoding (a decompression bomb or a very large image)"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - Pillow's plugins raise many types on malformed headers
        detail = str(exc).replace(repr(fh), "the data")[:100]  # what names the image, not the file object's repr
        raise InputError(f"{what}: not a readable image ({type(exc).__name__}: {detail})") from exc
    check_size(int(img.size[0]), int(img.size[1]), what)
    return img


def load_pixels(img: Any, what: str) -> Any:
    """Decode the pixels of an image :func:`open_image` returned (InputError naming ``what`` on failure)."""
    try:
        img.load()
    except MemoryError as exc:
        raise InputError(f"{what}: not enough memory to decode it") from exc
    except Exception as exc:  # noqa: BLE001 - truncated data, bad chunks, codec errors
        raise InputError(f"{what}: not a readable image ({type(exc).__name__}: {str(exc)[:100]})") from exc
    return img


def record_for(config: dict[str, Any]) -> vlm_families.RuntimeFamily:
    """The family record of a bundle's ``preprocessor_config.json``: the one its manifest names (``_family``, set by
    load_vlm; Qwen2-VL and Qwen2.5-VL share one image processor), else the record whose processor wrote it."""
    name = config.get("_family")
    if isinstance(name, str):
        with contextlib.suppress(ModelError):  # a family this edgesdk no longer knows by that name
            return vlm_families.by_name(name)
    return vlm_families.by_processor(config)


class ImagePreprocessor:
    """The model's own image preprocessing (``preprocessor_config.json``): RGB, then either a resize to
    ``size.height x size.width`` (SigLIP) or a shortest-edge resize + center crop (CLIP), with the
    processor's resampling filter, in Pillow as transformers does. The result is the uint8 image the
    encoder sees; mean/std normalisation happens in llama.cpp from the mmproj's ``clip.vision.image_mean/std``
    (written from the same file at build time)."""

    def __init__(self, config: dict[str, Any], image_size: int):
        self.config = config
        self.image_size = int(image_size)
        self.resample = int(config.get("resample", 3))
        # the family record whose processor wrote this config (contracts/vlm_families): its frames, prompt, layout
        self.record = record_for(config)
        self.family = self.record.name
        self.strategy = frames_for(self.record)  # the runtime's behaviour for the record's frames (families.py)
        size = config.get("size") or {}
        self.shortest_edge = size.get("shortest_edge") if isinstance(size, dict) else None
        crop = config.get("crop_size") or {}
        self.crop = (
            (int(crop.get("height", image_size)), int(crop.get("width", image_size)))
            if config.get("do_center_crop")
            else None
        )

    def max_pixels(self) -> int:
        """The largest image (width x height) decoded: generous against the model's own input (16x its largest
        configured edge, squared; a dynamic-resolution processor: 16x its max_pixels), never below 4096 x 4096.
        Checked from the header before any pixel is decoded."""
        return max(MIN_MAX_SIDE * MIN_MAX_SIDE, self.strategy.max_pixels(self.config, self.image_size))

    def check_size(self, width: int, height: int, what: str) -> None:
        """InputError unless ``width x height`` is a non-empty image within :meth:`max_pixels` and the aspect limit."""
        if width <= 0 or height <= 0:
            raise InputError(f"{what}: the image is empty ({width}x{height} pixels)")
        limit = self.max_pixels()
        if width * height > limit:
            basis = self.strategy.size_basis(self.image_size)
            raise InputError(
                f"{what}: {width}x{height} pixels is more than this model takes ({limit:,} pixels, "
                f"{basis}): refused before decoding "
                "(a decompression bomb or a very large image; resize it first)"
            )
        if max(width, height) > MAX_ASPECT * min(width, height):
            raise InputError(f"{what}: {width}x{height} pixels has an aspect ratio above {MAX_ASPECT}:1")

    def image_tokens(self, width: int, height: int) -> int | None:
        """The image tokens an image of ``width x height`` becomes in this model (the family's frames times the
        bundle's tokens per frame), from the size alone; None where the bundle records no tokens per frame."""
        return self.strategy.image_tokens(self, int(width), int(height))

    def load(self, image: Any) -> tuple[str, Any]:
        """(a label naming the image for errors, decoded PIL image) from a path, bytes, a PIL image or an HxWx3
        array. Files are opened from disk (only the header is read before the size check; a file over
        :data:`MAX_IMAGE_BYTES` is refused unread), arrays must be non-empty, finite and within 0..255; every
        refusal is an :class:`InputError` naming the image."""
        from PIL import Image

        if isinstance(image, dict):
            image = image.get("path") or image.get("image") or image.get("url") or image.get("image_url")
        if isinstance(image, (str, Path)):
            path = Path(str(image).removeprefix("file://"))
            if not path.is_file():
                raise InputError(f"image not found: {path}")
            what = f"image {path}"
            size = path.stat().st_size
            if size > MAX_IMAGE_BYTES:
                raise InputError(
                    f"{what}: the file is {size:,} bytes, more than an image for this model takes "
                    f"({MAX_IMAGE_BYTES:,}); refused unread"
                )
            try:
                with open(path, "rb") as fh:
                    return what, self._decode(fh, what)
            except OSError as exc:  # open/stat: permissions, a vanished file
                raise InputError(f"{what}: cannot read it ({type(exc).__name__}: {str(exc)[:100]})") from exc
        if isinstance(image, (bytes, bytearray, memoryview)):
            what = f"image bytes ({len(image):,} bytes)"
            if len(image) > MAX_IMAGE_BYTES:
                raise InputError(f"{what}: more than an image for this model takes ({MAX_IMAGE_BYTES:,})")
            return what, self._decode(io.BytesIO(bytes(image)), what)
        if isinstance(image, np.ndarray):
            return "image array", Image.fromarray(self._array(image))
        if hasattr(image, "convert") and hasattr(image, "size"):
            w, h = image.size
            self.check_size(int(w), int(h), "PIL image")
            return "PIL image", image
        raise InputError(f"an image must be a path, bytes, a PIL image or an array, got {type(image).__name__}")

    def _array(self, image: np.ndarray) -> np.ndarray:
        """An HxWx3 array as uint8: non-empty, numeric, finite, within 0..255, within the size limit."""
        what = "image array"
        if image.ndim != 3 or image.shape[2] != 3:
            raise InputError(f"{what}: must be HxWx3 uint8, got shape {list(image.shape)}")
        if image.dtype.kind not in "uifb":
            raise InputError(f"{what}: must be numeric (uint8), got dtype {image.dtype}")
        self.check_size(int(image.shape[1]), int(image.shape[0]), what)
        if image.dtype != np.uint8:
            if image.dtype.kind == "f" and not np.isfinite(image).all():
                raise InputError(f"{what}: has NaN or infinite values")
            lo, hi = (float(image.min()), float(image.max())) if image.dtype.kind != "b" else (0.0, 1.0)
            if lo < 0 or hi > 255:
                raise InputError(f"{what}: values must be within 0..255 (uint8), got {lo:g}..{hi:g}")
        return np.ascontiguousarray(image.astype(np.uint8))

    def _decode(self, fh: Any, what: str) -> Any:
        """Open ``fh`` with Pillow, check the header's size, then decode. Any failure is an InputError."""
        return decode_image(fh, what, self.check_size, self.max_pixels())

    @property
    def tile(self) -> int:
        """Idefics3 / SmolVLM: the encoder's square tile (``max_image_size.longest_edge``)."""
        return int((self.config.get("max_image_size") or {}).get("longest_edge", self.image_size))

    @property
    def splitting(self) -> bool:
        """Idefics3 / SmolVLM ``do_image_splitting``: tiles + a global image per image."""
        return self.strategy.splitting(self.config)

    def _longest_edge_size(self, w: int, h: int) -> tuple[int, int] | None:
        """The (width, height) :meth:`_longest_edge` resizes a ``w x h`` image to; None: no resize."""
        size = self.config.get("size") or {}
        if self.config.get("do_resize", True) and isinstance(size, dict) and size.get("longest_edge"):
            edge = int(size["longest_edge"])
            if w >= h:
                nw, nh = edge, int(edge / (w / h))
                nh += nh % 2
            else:
                nh, nw = edge, int(edge * (w / h))
                nw += nw % 2
            if max(nw, nh) > 4096:  # transformers' MAX_IMAGE_SIZE
                nw, nh = (4096, int(4096 / (nw / nh))) if nw >= nh else (int(4096 * (nw / nh)), 4096)
            return max(nw, 1), max(nh, 1)
        return None

    def _longest_edge(self, img: Any) -> Any:
        """Idefics3ImageProcessor.resize with ``size.longest_edge``: the longest edge to it (aspect kept, the
        other edge truncated then rounded up to even, at most 4096 px), with the processor's filter."""
        size = self._longest_edge_size(*img.size)
        return img if size is None else img.resize(size, self.resample)

    def _whole_tiles(self, w: int, h: int) -> tuple[int, int]:
        """(width, height) of a ``w x h`` image (after :meth:`_longest_edge`) resized to whole tiles
        (Idefics3's ``resize_for_vision_encoder``)."""
        import math

        t = self.tile
        aspect = w / h
        if w >= h:
            w = math.ceil(w / t) * t
            h = math.ceil(int(w / aspect) / t) * t
        else:
            h = math.ceil(h / t) * t
            w = math.ceil(int(h * aspect) / t) * t
        return w, h

    def tile_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the tiles :meth:`tiles` cuts a ``width x height`` image into with splitting ((0, 0): the
        global image alone), from the size alone."""
        w, h = self._longest_edge_size(width, height) or (width, height)
        w, h = self._whole_tiles(w, h)
        t = self.tile
        return (0, 0) if w <= t and h <= t else (h // t, w // t)

    def resize_tile(self, img: Any) -> Any:
        """Idefics3ImageProcessor with ``do_image_splitting=False``: resize the longest edge to
        ``size.longest_edge`` (aspect kept, the other edge rounded up to even), then to the square
        ``max_image_size`` tile, both with the processor's filter (LANCZOS by default)."""
        img = self._longest_edge(img)
        return img.resize((self.tile, self.tile), self.resample)

    def tiles(self, img: Any) -> tuple[int, int, list[np.ndarray]]:
        """(rows, cols, frames) as Idefics3ImageProcessor emits them: without splitting (or for an image no larger
        than one tile) ``(0, 0, [global image])``; with ``do_image_splitting`` the image resized to whole tiles
        (``resize_for_vision_encoder``), its rows x cols tiles row by row, then the global image (the resized image
        scaled to one tile), each ``tile x tile`` uint8 RGB."""
        img = img.convert("RGB")
        if not self.splitting:
            return 0, 0, [self(img)]
        t = self.tile
        img = self._longest_edge(img)
        w, h = self._whole_tiles(*img.size)
        img = img.resize((w, h), self.resample)
        if w <= t and h <= t:
            return 0, 0, [np.ascontiguousarray(np.asarray(img, dtype=np.uint8))]
        rows, cols = h // t, w // t
        arr = np.asarray(img, dtype=np.uint8)
        frames = [
            np.ascontiguousarray(arr[r * t : (r + 1) * t, c * t : (c + 1) * t])
            for r in range(rows)
            for c in range(cols)
        ]
        frames.append(np.ascontiguousarray(np.asarray(img.resize((t, t), self.resample), dtype=np.uint8)))
        return rows, cols, frames

    def resize_dynamic(self, img: Any) -> Any:
        """Dynamic resolution (Qwen2.5-VL): the processor's own size for this image (the record's ``resize``: aspect
        kept, multiples of its token side), with its filter; libmtmd is told image-token limits under which it keeps
        this size."""
        assert self.record.resize is not None  # DynamicFrames calls this only with the record's resize
        h, w = self.record.resize(img.height, img.width, self.config)
        if (w, h) != img.size:
            img = img.resize((w, h), self.resample)
        return img

    def resize_fixed(self, img: Any) -> Any:
        """A single-frame family's resize: the shortest edge + center crop (CLIP) or to ``size`` (SigLIP)."""
        if self.shortest_edge:
            w, h = img.size
            edge = int(self.shortest_edge)
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = edge, int(edge * long / short)
            img = img.resize((new_short, new_long) if w <= h else (new_long, new_short), self.resample)
            if self.crop:
                ch, cw = self.crop
                left, top = (img.width - cw) // 2, (img.height - ch) // 2  # transformers' center_crop
                img = img.crop((left, top, left + cw, top + ch))
        else:
            size = self.config.get("size") or {}
            h, w = int(size.get("height", self.image_size)), int(size.get("width", self.image_size))
            img = img.resize((w, h), self.resample)
        return img

    def __call__(self, img: Any) -> np.ndarray:
        """The encoder's uint8 HxWx3 input: RGB, resized as the family's processor does it (families.py)."""
        img = self.strategy.resize(self, img.convert("RGB"))
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))
