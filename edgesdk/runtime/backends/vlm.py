# SPDX-License-Identifier: Apache-2.0
"""VLM backend: image decode + preprocessing (the model's own processor config), the vision encoder +
projector (F16 mmproj) and the quantized GGUF decoder, all through llama.cpp's multimodal library
(libmtmd, via llama-cpp-python's public ``llama_cpp.mtmd_cpp`` bindings).

One request: preprocess (Pillow: decode, RGB, resize / center-crop as ``preprocessor_config.json``
says) -> encode (``mtmd_encode_chunk``; skipped when the image's features are cached) -> prefill
(text chunks with ``Llama.eval``, image chunks with ``mtmd_helper_decode_image_chunk`` from the
cached features) -> decode (``Llama.generate`` sampling). Image-prefix reuse: features are cached by
(image sha256, mmproj sha256), and the decoder's KV cache is kept up to the longest common prefix of
the previous request (text tokens and image hashes), so a second question about the same image
evaluates only its own text. Telemetry: one GenAI span per request (``telemetry.inference``) with
stage child spans ``preprocess``, ``encode`` (only when the encoder runs; a cached image is an
``edgesdk.vlm.image_cached`` event), ``prefill`` and ``decode`` (``rec.stage``), and the stage times as
``edgesdk.vlm.{preprocess,encode,prefill}_s`` attributes; image tokens are counted in
``gen_ai.usage.input_tokens`` and separately as ``edgesdk.vlm.image_tokens``.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import io
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.formats.vlm import families as vlm_families
from edgesdk.native import import_llama_cpp, route_llama_logs
from edgesdk.runtime.backend import TensorSpec

FEATURE_CACHE_SIZE = 16  # images whose features are kept
ENCODE_TIMES_KEPT = 1024  # encoder run times kept per path for session.report()
# image inputs (issue 25 finding 8): a file larger than this is refused unread; decoded size is limited per model
# (ImagePreprocessor.max_pixels: 16x the model's input side, squared, at least MIN_MAX_SIDE squared)
MAX_IMAGE_BYTES = 256 * 1024 * 1024
MIN_MAX_SIDE = 4096
MAX_ASPECT = 200  # width:height (either way) at most 200:1, as Qwen2-VL's processor allows
DEFAULT_SAMPLING = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}


# ------------------------------------------------------------------ preprocessing


def decode_image(fh: Any, what: str, check_size: Callable[[int, int, str], None], max_pixels: int | None = None) -> Any:
    """Open ``fh`` with Pillow, pass the header's width x height to ``check_size`` (which raises InputError), and
    only then decode the pixels. Any failure is an InputError naming ``what``; ``max_pixels`` is quoted when
    Pillow's own decompression-bomb check refuses the header."""
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
    try:
        img.load()
    except MemoryError as exc:
        raise InputError(f"{what}: not enough memory to decode it") from exc
    except Exception as exc:  # noqa: BLE001 - truncated data, bad chunks, codec errors
        raise InputError(f"{what}: not a readable image ({type(exc).__name__}: {str(exc)[:100]})") from exc
    return img


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
        # the family record whose processor wrote this config (formats/vlm/families): its frames, prompt, layout
        self.record = vlm_families.by_processor(config)
        self.family = self.record.name
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
        size = self.config.get("size") or {}
        if self.record.frames == "dynamic":  # Qwen-VL: size holds pixel counts (min / max pixels), not edges
            most = (size.get("longest_edge") if isinstance(size, dict) else None) or self.config.get("max_pixels")
            return max(MIN_MAX_SIDE * MIN_MAX_SIDE, 16 * int(most or 0))
        edges = [self.image_size] + (
            [int(v) for v in size.values() if isinstance(v, (int, float))] if isinstance(size, dict) else []
        )
        edges += [int(v) for v in (self.config.get("max_image_size") or {}).values() if isinstance(v, (int, float))]
        return max(MIN_MAX_SIDE * MIN_MAX_SIDE, (16 * max(edges)) ** 2)

    def check_size(self, width: int, height: int, what: str) -> None:
        """InputError unless ``width x height`` is a non-empty image within :meth:`max_pixels` and the aspect limit."""
        if width <= 0 or height <= 0:
            raise InputError(f"{what}: the image is empty ({width}x{height} pixels)")
        limit = self.max_pixels()
        if width * height > limit:
            basis = (
                "16x its image processor's max_pixels"
                if self.record.frames == "dynamic"
                else f"16x its {self.image_size} px input per side"
            )
            raise InputError(
                f"{what}: {width}x{height} pixels is more than this model takes ({limit:,} pixels, "
                f"{basis}): refused before decoding "
                "(a decompression bomb or a very large image; resize it first)"
            )
        if max(width, height) > MAX_ASPECT * min(width, height):
            raise InputError(f"{what}: {width}x{height} pixels has an aspect ratio above {MAX_ASPECT}:1")

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
        return self.record.frames == "tiles" and bool(self.config.get("do_image_splitting", False))

    def _longest_edge(self, img: Any) -> Any:
        """Idefics3ImageProcessor.resize with ``size.longest_edge``: the longest edge to it (aspect kept, the
        other edge truncated then rounded up to even, at most 4096 px), with the processor's filter."""
        size = self.config.get("size") or {}
        if self.config.get("do_resize", True) and isinstance(size, dict) and size.get("longest_edge"):
            edge, (w, h) = int(size["longest_edge"]), img.size
            if w >= h:
                nw, nh = edge, int(edge / (w / h))
                nh += nh % 2
            else:
                nh, nw = edge, int(edge * (w / h))
                nw += nw % 2
            if max(nw, nh) > 4096:  # transformers' MAX_IMAGE_SIZE
                nw, nh = (4096, int(4096 / (nw / nh))) if nw >= nh else (int(4096 * (nw / nh)), 4096)
            img = img.resize((max(nw, 1), max(nh, 1)), self.resample)
        return img

    def _idefics3(self, img: Any) -> Any:
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
        import math

        img = img.convert("RGB")
        if not self.splitting:
            return 0, 0, [self(img)]
        t = self.tile
        img = self._longest_edge(img)
        w, h = img.size
        aspect = w / h
        if w >= h:
            w = math.ceil(w / t) * t
            h = math.ceil(int(w / aspect) / t) * t
        else:
            h = math.ceil(h / t) * t
            w = math.ceil(int(h * aspect) / t) * t
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

    def __call__(self, img: Any) -> np.ndarray:
        img = img.convert("RGB")
        if self.record.frames == "tiles":
            img = self._idefics3(img)
        elif self.record.frames == "dynamic" and self.record.resize is not None:
            # dynamic resolution (Qwen2.5-VL): the processor's own size for this image (aspect kept, multiples of
            # its token side), with its filter; libmtmd is told image-token limits under which it keeps this size
            h, w = self.record.resize(img.height, img.width, self.config)
            if (w, h) != img.size:
                img = img.resize((w, h), self.resample)
        elif self.shortest_edge:
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
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


# ------------------------------------------------------------------ the pipeline

_log = logging.getLogger("edgesdk.llama_cpp.mtmd")
_MTMD_LOG: list[Any] = []  # keeps the ctypes callback alive


def _route_mtmd_logs(mtmd: Any, llama_cpp: Any) -> None:
    """libmtmd's log lines (clip loader, image slicing) go to the ``edgesdk.llama_cpp.mtmd`` logger at
    DEBUG instead of stderr (public ``mtmd_log_set`` / ``mtmd_helper_log_set``)."""
    if _MTMD_LOG:
        return

    def _on_log_py(level: int, text: bytes | None, user_data: Any) -> None:  # noqa: ARG001 - ggml_log_callback
        msg = text.decode("utf-8", "replace") if text else ""
        if msg.strip():
            _log.debug("%s", msg.rstrip("\n"))

    _on_log = llama_cpp.llama_log_callback(_on_log_py)

    _MTMD_LOG.append(_on_log)
    mtmd.mtmd_log_set(_on_log, ctypes.c_void_p(0))
    mtmd.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))


class VLMPipeline:
    """Decoder GGUF + mmproj GGUF in one llama.cpp context (see the module docstring)."""

    def __init__(
        self,
        decoder: str | Path,
        mmproj: str | Path,
        preprocessor: dict[str, Any],
        *,
        n_ctx: int = 512,
        n_gpu_layers: int = 0,
        threads: int | None = None,
        flash_attn: bool = False,
        use_gpu: bool = False,
        use_mmap: bool = True,
        image_encoder: Any = None,
        encoder_id: str | None = None,
    ):
        llama_cpp = import_llama_cpp()
        mtmd = import_llama_cpp("mtmd_cpp")

        self._mtmd = mtmd
        self._llama_cpp = llama_cpp
        _route_mtmd_logs(mtmd, llama_cpp)
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(decoder),
                n_ctx=n_ctx,
                n_gpu_layers=n_gpu_layers,
                n_threads=threads,
                n_threads_batch=threads,
                flash_attn=flash_attn,
                use_mmap=use_mmap,
                verbose=False,
            )
        except ValueError as exc:
            raise BackendUnavailableError(f"llama.cpp cannot load the decoder {decoder}: {exc}") from exc
        params = mtmd.mtmd_context_params_default()
        # with the ONNX encoder, libmtmd only tokenizes image chunks: its mmproj need not take GPU memory
        params.use_gpu = bool(use_gpu) and image_encoder is None
        params.n_threads = int(threads or self.llm.n_threads)
        params.print_timings = False
        params.warmup = False
        record = vlm_families.by_processor(preprocessor)
        if record.frames == "dynamic" and record.max_image_tokens is not None:
            # the runtime resizes each image as the HF processor does (ImagePreprocessor); these limits make
            # libmtmd's own resize of those pixels a copy (clip.cpp's defaults for Qwen-VL are 8..4096 tokens)
            params.image_min_tokens = 1
            params.image_max_tokens = int(record.max_image_tokens(preprocessor) or 0) or -1
        self.mctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.llm.model, params)
        if not self.mctx:
            self.llm.close()
            raise BackendUnavailableError(
                f"llama.cpp's multimodal library cannot load the mmproj {mmproj} "
                "(mtmd_init_from_file returned NULL; run with verbose=True for its log)"
            )
        if not mtmd.mtmd_support_vision(self.mctx):
            self.close()
            raise BackendUnavailableError(f"{mmproj} has no vision encoder")
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.llm.model))
        self.marker = mtmd.mtmd_default_marker().decode("utf-8")
        cfg_size = int(preprocessor.get("_image_size") or 0)
        self.pre = ImagePreprocessor(preprocessor, cfg_size)
        # image features by (preprocessed pixels' sha256, encoder sha256), shared by every request to this model;
        # the backend serialises requests on its context lock, and this lock guards the cache itself (readers such
        # as report() and image_features() may come from other threads)
        self.features: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.encoder_runs = 0
        # the ONNX FP16 encoder (runtime/backends/vlm_onnx.py) when chosen at load; None: libmtmd's mmproj
        self.image_encoder = image_encoder
        # the feature cache key's component part: the encoder file's sha256 (load_vlm passes the manifest's,
        # verified at load, so a large encoder is not hashed twice)
        if encoder_id is None:
            path = Path(mmproj) if image_encoder is None else Path(image_encoder.path)
            encoder_id = hashlib.sha256(path.read_bytes()).hexdigest()
        self.encoder_id = encoder_id if image_encoder is None else "onnx-" + encoder_id
        self._pixels: dict[str, np.ndarray] = {}  # resized pixels of this request's images, for the ONNX encoder
        # per encoder path: the last ENCODE_TIMES_KEPT run times (seconds) and the number of runs
        self.encode_s: dict[str, list[float]] = {"onnx": [], "mmproj": []}
        self.encode_runs: dict[str, int] = {"onnx": 0, "mmproj": 0}
        self._layout_ids: tuple[int | None, ...] | None = None  # Idefics3 layout token ids
        self._kv: list[Any] = []  # what the KV cache holds now: text token ids and ("img", hash, n) entries
        self.last_stages: dict[str, float] = {}

    # ---------------------------------------------------------------- images
    def _features(self, key: str, chunk: Any) -> tuple[np.ndarray, bool]:
        with self._cache_lock:
            cached = self.features.get(key)
            if cached is not None:
                self.features.move_to_end(key)
                return cached, True
        mtmd = self._mtmd
        n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        t0 = perf_counter()
        if self.image_encoder is not None and key in self._pixels:
            # ONNX Runtime on the same resized pixels; the decoder gets them via mtmd_helper_decode_image_chunk
            feats = self.image_encoder(self._pixels.pop(key))
            if feats.shape != (n, self.n_embd):
                raise ShapeError(
                    f"the ONNX vision encoder returned features {list(feats.shape)}; the decoder "
                    f"expects {[n, self.n_embd]}"
                )
            self._note_encode("onnx", perf_counter() - t0)
        else:
            rc = mtmd.mtmd_encode_chunk(self.mctx, chunk)
            if rc != 0:
                raise BackendUnavailableError(f"llama.cpp's vision encoder failed (mtmd_encode_chunk returned {rc})")
            ptr = mtmd.mtmd_get_output_embd(self.mctx)
            feats = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
            self._note_encode("mmproj", perf_counter() - t0)
        with self._cache_lock:
            self.encoder_runs += 1
            self.features[key] = feats
            while len(self.features) > FEATURE_CACHE_SIZE:
                self.features.popitem(last=False)
        return feats, False

    def _note_encode(self, path: str, seconds: float) -> None:
        times = self.encode_s[path]
        times.append(seconds)
        if len(times) > ENCODE_TIMES_KEPT:  # a long-running server must not grow this without bound
            del times[0]
        self.encode_runs[path] += 1

    def image_features(self, image: Any) -> np.ndarray:
        """The encoder + projector output for one image (n_image_tokens x n_embd), as the decoder gets it; for a
        split Idefics3 / SmolVLM image its frames' features one after the other (tiles row by row, then the global
        image, the processor's order)."""
        chunks, keys, _ = self._tokenize(self.marker, [image])
        try:
            feats = [
                self._features(val[0], val[1])[0] for kind, val in self._chunk_plan(chunks, keys) if kind == "image"
            ]
        finally:
            self._mtmd.mtmd_input_chunks_free(chunks)
        if not feats:
            raise BackendUnavailableError("llama.cpp produced no image chunk")
        return feats[0] if len(feats) == 1 else np.concatenate(feats)

    def _chunk_plan(self, chunks: Any, keys: list[str]) -> list[tuple[str, Any]]:
        """libmtmd's chunks as ``("text", [ids])`` / ``("image", (key, chunk, n_pos))`` in prompt order, after the
        family's layout (:meth:`_image_layout`), each image chunk given its frame's feature-cache key."""
        mtmd = self._mtmd
        plan: list[tuple[str, Any]] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n_out = ctypes.c_size_t()
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                plan.append(("text", [int(ptr[j]) for j in range(n_out.value)]))
            elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                # positions and tokens differ with M-RoPE (Qwen-VL: an image of r x c tokens takes max(r, c)
                # positions, libmtmd's mtmd_input_chunk_get_n_pos)
                plan.append(
                    (
                        "image",
                        (
                            None,
                            chunk,
                            int(mtmd.mtmd_input_chunk_get_n_pos(chunk)),
                            int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)),
                        ),
                    )
                )
            else:
                raise InputError("only images are supported as media")
        plan = self._image_layout(plan)
        img_i = 0
        for j, (kind, val) in enumerate(plan):
            if kind == "image":
                if img_i >= len(keys):
                    raise BackendUnavailableError("llama.cpp made more image chunks than images")
                plan[j] = ("image", (keys[img_i], val[1], val[2], val[3]))
                img_i += 1
        return plan

    def _tokenize(self, text: str, images: list[Any], rec: Any = telemetry.NOOP_RECORDER) -> tuple[Any, list[str], int]:
        mtmd = self._mtmd
        keys, bitmaps = [], []
        self._pixels = {}
        t0 = perf_counter()
        stage = rec.stage("preprocess", {"edgesdk.vlm.images": len(images)}) if images else telemetry.NOOP_STAGE
        try:
            frames: list[np.ndarray] = []
            layouts: list[str] = []
            for image in images:
                _, img = self.pre.load(image)
                if self.pre.record.image_text is not None:  # the family writes each image's own layout
                    rows, cols, tiles = self.pre.tiles(img)
                    frames.extend(tiles)
                    layouts.append(self.pre.record.image_text(rows, cols, self.marker))
                else:
                    frames.append(self.pre(img))
            if layouts:  # each image marker becomes the processor's layout, one marker per frame
                parts = text.split(self.marker)
                if len(parts) == len(layouts) + 1:
                    text = parts[0] + "".join(lay + part for lay, part in zip(layouts, parts[1:], strict=True))
            for pixels in frames:
                h, w = pixels.shape[:2]
                buf = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
                bm = mtmd.mtmd_bitmap_init(w, h, buf)
                if not bm:
                    raise BackendUnavailableError("mtmd_bitmap_init failed")
                bitmaps.append(bm)
                key = hashlib.sha256(pixels.tobytes() + f"{w}x{h}".encode()).hexdigest() + ":" + self.encoder_id
                keys.append(key)
                if self.image_encoder is not None:
                    self._pixels[key] = pixels
                mtmd.mtmd_bitmap_set_id(bm, key[:64].encode())
            self.last_stages["preprocess_s"] = perf_counter() - t0
            stage.end()
            data = text.encode("utf-8")
            inp = mtmd.mtmd_input_text()
            inp.text, inp.text_len, inp.add_special, inp.parse_special = data, len(data), True, True
            chunks = mtmd.mtmd_input_chunks_init()
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = mtmd.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                why = {
                    1: "the number of images does not match the image markers in the prompt",
                    2: "image preprocessing failed",
                }.get(rc, f"error {rc}")
                raise InputError(f"cannot tokenize the prompt with its images: {why}")
            return chunks, keys, len(data)
        except BaseException as exc:
            stage.end(exc)  # no-op when preprocessing finished and tokenizing failed
            raise
        finally:
            for bm in bitmaps:
                mtmd.mtmd_bitmap_free(bm)

    # ---------------------------------------------------------------- prefill
    def prefill(self, text: str, images: list[Any], rec: Any = telemetry.NOOP_RECORDER) -> dict[str, Any]:
        """Evaluate the prompt up to (not including) its last token, reusing the KV prefix; returns the
        last token id, the token/image counts and stage timings. The caller samples from there.
        ``rec``: the request's telemetry recorder (stage child spans preprocess, encode, prefill)."""
        mtmd, llm = self._mtmd, self.llm
        self.last_stages = {}
        chunks, keys, _ = self._tokenize(text, images, rec)
        prefill_stage: Any = telemetry.NOOP_STAGE
        try:
            plan = self._chunk_plan(chunks, keys)
            if not plan or plan[-1][0] != "text" or not plan[-1][1]:
                plan.append(("text", []))
            # the sequence as KV entries: one per position (an M-RoPE image has fewer positions than tokens)
            seq: list[Any] = []
            for kind, val in plan:
                if kind == "text":
                    seq.extend(val)
                else:
                    seq.extend([("img", val[0], j) for j in range(val[2])])
            if not seq or isinstance(seq[-1], tuple):
                raise InputError("the prompt must end with text after its images")
            n_total = len(seq)
            # the tokens (KV cells) the prompt takes: text tokens + each image's tokens
            image_tokens = sum(val[3] for kind, val in plan if kind == "image")
            n_cells = sum(len(val) for kind, val in plan if kind == "text") + image_tokens
            if n_cells >= llm.n_ctx():
                raise ShapeError(f"prompt is {n_cells} tokens (images included); the context holds {llm.n_ctx()}")
            # encode every image first (cached features are reused)
            t0 = perf_counter()
            feats: dict[str, np.ndarray] = {}
            reused = 0
            for kind, val in plan:
                if kind == "image":
                    cached = val[0] in self.features  # a cached image gets an event, not an encode span
                    with (
                        telemetry.NOOP_STAGE
                        if cached
                        else rec.stage("encode", {"edgesdk.inference.stage.tokens": val[3]})
                    ):
                        feats[val[0]], hit = self._features(val[0], val[1])
                    if hit:
                        rec.add_event(
                            "edgesdk.vlm.image_cached",
                            {"edgesdk.vlm.image.sha256": val[0][:64], "edgesdk.vlm.image_tokens": val[3]},
                        )
                    reused += int(hit)
            self.last_stages["encode_s"] = perf_counter() - t0
            # longest common prefix with what the KV cache holds; keep it, but never the last token
            keep = 0
            for a, b in zip(self._kv, seq[:-1]):
                if a != b:
                    break
                keep += 1
            # an image is kept whole or not at all
            while (
                keep > 0
                and isinstance(seq[keep - 1], tuple)
                and keep < n_total - 1
                and isinstance(seq[keep], tuple)
                and seq[keep][1] == seq[keep - 1][1]
            ):
                keep -= 1
            t0 = perf_counter()
            prefill_stage = rec.stage(
                "prefill", {"edgesdk.inference.stage.tokens": n_total - 1 - keep, "edgesdk.vlm.kv_reused_tokens": keep}
            )
            mem = self._llama_cpp.llama_get_memory(llm.ctx)
            self._llama_cpp.llama_memory_seq_rm(mem, -1, keep, -1)
            llm.n_tokens = keep
            self._kv = list(seq[:keep])
            pos = 0
            for kind, val in plan:
                if kind == "text":
                    ids = val if pos + len(val) < n_total else val[:-1]
                    start = max(0, keep - pos)
                    todo = ids[start:]
                    if todo:
                        llm.eval(todo)
                        self._kv.extend(todo)
                    pos += len(val)
                else:
                    key, chunk, n, _ = val
                    if pos >= keep:
                        f = np.ascontiguousarray(feats[key], dtype=np.float32)
                        new_n_past = self._llama_cpp.llama_pos(0)
                        rc = mtmd.mtmd_helper_decode_image_chunk(
                            self.mctx,
                            llm.ctx,
                            chunk,
                            f.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                            self._llama_cpp.llama_pos(pos),
                            self._llama_cpp.llama_seq_id(0),
                            llm.n_batch,
                            ctypes.byref(new_n_past),
                            mtmd.mtmd_helper_post_decode_callback(),
                            None,
                        )
                        if rc != 0:
                            raise BackendUnavailableError(f"llama.cpp could not decode the image (error {rc})")
                        llm.n_tokens = int(new_n_past.value)
                        self._kv.extend(("img", key, j) for j in range(n))
                    pos += n
            self.last_stages["prefill_s"] = perf_counter() - t0
            prefill_stage.end()
            return {
                "last_token": seq[-1],
                "input_tokens": n_cells,
                "image_tokens": image_tokens,
                "images": len(images),
                "images_cached": reused,
                "kv_reused_tokens": keep,
            }
        except BaseException as exc:
            prefill_stage.end(exc)
            raise
        finally:
            mtmd.mtmd_input_chunks_free(chunks)

    def _image_layout(self, plan: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The family's token layout around each image. For Idefics3 / SmolVLM the prompt already holds the HF
        processor's layout (``families.idefics3.image_text``: ``<fake_token_around_image><row_R_col_C>`` before each
        tile, ``\\n`` after each row, ``\\n<fake_token_around_image><global-img>`` before the global image,
        ``<fake_token_around_image>`` after it) with one marker per frame, each frame already one encoder tile.
        libmtmd's Idefics3 template wraps every marker's image as a 1x1 grid: ``<fake_token_around_image>
        <row_1_col_1>`` + tile + ``\\n\\n<fake_token_around_image><global-img>`` + overview +
        ``<fake_token_around_image>``, tile and overview holding the same pixels. Each such group becomes its
        overview chunk alone (the encoder runs once per frame), which leaves exactly the HF token sequence."""
        if self.pre.record.frames != "tiles":
            return plan

        if self._layout_ids is None:  # the marker token ids, looked up once

            def one(text: str) -> int | None:
                ids = self.llm.tokenize(text.encode(), add_bos=False, special=True)
                return ids[0] if len(ids) == 1 else None

            self._layout_ids = (
                one("<fake_token_around_image>"),
                one("<row_1_col_1>"),
                one("<global-img>"),
                one("\n\n"),
            )
        fake, row11, glob, nn = self._layout_ids
        if None in (fake, row11, glob, nn):
            raise BackendUnavailableError(
                "the decoder's vocabulary lacks a token of the Idefics3 image layout "
                "(<fake_token_around_image>, <row_1_col_1>, <global-img>, \\n\\n)"
            )
        out: list[tuple[str, Any]] = []
        i, strip_fake = 0, False
        while i < len(plan):
            kind, val = plan[i]
            if kind == "text":
                toks = list(val)
                if strip_fake:  # libmtmd's closing <fake_token_around_image> after the previous overview
                    if toks[:1] != [fake]:
                        raise BackendUnavailableError("unexpected Idefics3 image layout from llama.cpp")
                    toks, strip_fake = toks[1:], False
                if i + 1 < len(plan) and plan[i + 1][0] == "image":  # libmtmd's tile prefix
                    if toks[-2:] != [fake, row11]:
                        raise BackendUnavailableError(
                            "llama.cpp tiled an image into more than one tile; edgesdk "
                            "hands it one tile per frame (docs/vlm.md)"
                        )
                    toks = toks[:-2]
                out.append(("text", toks))
                i += 1
                continue
            nxt = plan[i + 1] if i + 2 < len(plan) else None
            if nxt is None or nxt[0] != "text" or list(nxt[1]) != [nn, fake, glob] or plan[i + 2][0] != "image":
                raise BackendUnavailableError(
                    "llama.cpp tiled an image into more than one tile; edgesdk hands it "
                    "one tile per frame (docs/vlm.md)"
                )
            out.append(plan[i + 2])
            strip_fake = True
            i += 3
        return out

    def note_generated(self, last_token: int, generated: list[int]) -> None:
        """Record what the KV cache holds after generation (the prompt's last token + generated ones,
        except the very last sampled token, which llama.cpp has not evaluated)."""
        self._kv.append(last_token)
        self._kv.extend(generated[:-1])
        self._kv = self._kv[: self.llm.n_tokens]

    def close(self) -> None:
        if getattr(self, "mctx", None):
            self._mtmd.mtmd_free(self.mctx)
            self.mctx = None
        with contextlib.suppress(Exception):
            self.llm.close()


# ------------------------------------------------------------------ the backend


def _split_content(messages: list[dict[str, Any]]) -> tuple[list[tuple[str, str, int]], list[Any]]:
    """LLaVA-1.5 conversation text with image markers, and the images in order, from OpenAI-style messages
    (content a string, or parts ``{"type": "text", "text"}`` / ``{"type": "image", "path"|"image"}`` /
    ``{"type": "image_url", "image_url": {"url": "file://..."}}``)."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
    parts_out: list[tuple[str, str, int]] = []
    images: list[Any] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InputError(f"messages[{i}] must be a mapping with a string 'role'")
        content = m.get("content")
        texts, imgs = [], []
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif kind == "image":
                    imgs.append(part.get("path") or part.get("image") or part.get("url"))
                elif kind == "image_url":
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    if not isinstance(url, str) or url.startswith(("http://", "https://")):
                        raise InputError(
                            f"messages[{i}].content[{j}]: image_url must be a local path or "
                            "file:// URL (no network access on the device)"
                        )
                    imgs.append(url)
                else:
                    raise InputError(f"messages[{i}].content[{j}]: expected a text or image part")
        else:
            raise InputError(f"messages[{i}]: content must be a string or a list of parts")
        images.extend(imgs)
        parts_out.append((m["role"], "".join(texts), len(imgs)))
    return parts_out, images


class VLMBackend:
    """One loaded VLM bundle: ``generate(prompt, images=[...])``, ``stream``, ``chat`` with image parts."""

    name = "llama.cpp+mtmd"
    provider = "llama.cpp"

    def __init__(self, pipe: VLMPipeline, *, report: dict[str, Any], model: str, attributes: dict[str, Any]):
        self.pipe = pipe
        self._report = report
        self._model = model
        self._attrs = attributes
        self.device = "cpu" if report.get("n_gpu_layers", 0) == 0 else "cuda:0"
        self.inputs = (TensorSpec("input_ids", "int64", None),)
        self.outputs = (TensorSpec("logits", "float32", None),)
        self._lock = threading.RLock()
        self.last: dict[str, Any] = {}
        llama_cpp = import_llama_cpp()

        vocab = llama_cpp.llama_model_get_vocab(pipe.llm.model)
        self._is_eog: Callable[[int], bool] = lambda tok: bool(llama_cpp.llama_vocab_is_eog(vocab, tok))

    def tokenize(self, text: str) -> list[int]:
        with self._lock:
            return list(self.pipe.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        raise ShapeError("a VLM bundle runs generate(prompt, images=[...]) or chat(messages)")

    def image_features(self, image: Any) -> np.ndarray:
        with self._lock:
            return self.pipe.image_features(image)

    def _prompt(self, prompt: str, images: list[Any]) -> str:
        marker = self.pipe.marker
        if marker in prompt or "<image>" in prompt:
            return prompt.replace("<image>", marker)
        return self.pipe.pre.record.user_prompt(prompt, len(images), marker)

    def generate(self, prompt: str, images: list[Any] | None = None, **kw: Any) -> Any:
        """Answer ``prompt`` about ``images`` (paths, bytes, PIL images or arrays). A prompt without
        ``<image>`` markers is wrapped in LLaVA's ``USER: <image>\\n... ASSISTANT:`` format."""
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, got {type(prompt).__name__}")
        images = list(images or [])
        text = self._prompt(prompt, images)
        stream = kw.pop("stream", False)
        gen = self._run(text, images, "chat", prompt, stream=stream, **kw)
        return gen if stream else self._complete(gen)

    def stream(self, prompt: str, images: list[Any] | None = None, **kw: Any) -> Iterator[str]:
        gen: Iterator[str] = self.generate(prompt, images, stream=True, **kw)
        return gen

    def chat(self, messages: list[dict[str, Any]], chat_template: str | None = None, **kw: Any) -> Any:
        """Reply to ``messages`` in the model family's own turn format (``chat_template`` applies to GGUF
        bundles: None only)."""
        if chat_template is not None:
            raise InputError(
                "chat_template applies to GGUF bundles: a VLM formats chats with its model family's "
                "own turn format (docs/vlm.md)"
            )
        _, images = _split_content(messages)  # validates the messages and collects the images in order
        text = self.pipe.pre.record.chat(messages, self.pipe.marker)
        stream = kw.pop("stream", False)
        gen = self._run(text, images, "chat", messages, stream=stream, **kw)
        return gen if stream else self._complete(gen)

    def _complete(self, gen: Iterator[str]) -> str:
        with self._lock:
            return "".join(gen)

    def _run(
        self,
        text: str,
        images: list[Any],
        operation: str,
        capture: Any,
        *,
        stream: bool,
        max_tokens: int = 128,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        logit_bias: Any = None,
        **sampling: Any,
    ) -> Iterator[str]:
        from edgesdk.runtime.backends.llamacpp import _bias_processor, _check_sampling
        from edgesdk.runtime.requests import check_logit_bias

        sampling = {("temperature" if k == "temp" else k): v for k, v in sampling.items()}
        unknown = set(sampling) - set(DEFAULT_SAMPLING)
        if unknown:
            raise InputError(
                f"unknown generation option(s): {', '.join(sorted(unknown))} "
                f"(known: max_tokens, stop, seed, stream, logit_bias, {', '.join(DEFAULT_SAMPLING)})"
            )
        params = {**DEFAULT_SAMPLING, **{k: v for k, v in sampling.items() if v is not None}}
        max_tokens, seed = _check_sampling(max_tokens, seed, params)
        bias = check_logit_bias(logit_bias)
        n_vocab = int(self.pipe.llm.n_vocab())
        if bias and bias[-1][0] >= n_vocab:
            raise InputError(f"logit_bias token ids must be < {n_vocab} (the vocabulary), got {bias[-1][0]}")
        params["logits_processor"] = _bias_processor(bias)
        stops = [stop] if isinstance(stop, str) and stop else [s for s in (stop or []) if s]
        request = {
            "max_tokens": max_tokens,
            "temperature": params["temperature"],
            "top_p": params["top_p"],
            "top_k": params["top_k"],
            "stop_sequences": stops or None,
            "seed": seed,
        }
        for k in ("frequency_penalty", "presence_penalty"):  # recorded when set (0 is off)
            if params[k]:
                request[k] = params[k]
        body = self._decode(text, images, operation, capture, stream, request, params, max_tokens, stops, seed)
        return self._stepwise(body) if stream else body

    def _stepwise(self, body: Generator[str, None, None]) -> Iterator[str]:
        from edgesdk.runtime.backends.llamacpp import stepwise

        return stepwise(body, self._lock)

    def _decode(
        self,
        text: str,
        images: list[Any],
        operation: str,
        capture: Any,
        stream: bool,
        request: dict[str, Any],
        params: dict[str, Any],
        max_tokens: int,
        stops: list[str],
        seed: int | None,
    ) -> Generator[str, None, None]:
        pipe, llm = self.pipe, self.pipe.llm
        with telemetry.inference(
            operation, self._model, self.provider, stream=stream, request=request, attributes=self._attrs
        ) as rec:
            rec.capture_input(capture)
            t0 = perf_counter()
            info = pipe.prefill(text, images, rec)
            for k, v in pipe.last_stages.items():
                rec.set_attribute(f"edgesdk.vlm.{k}", round(v, 6))
            rec.set_input_tokens(info["input_tokens"])
            rec.set_attribute("edgesdk.vlm.image_tokens", info["image_tokens"])
            rec.set_attribute("edgesdk.vlm.images", info["images"])
            rec.set_attribute("edgesdk.vlm.images_cached", info["images_cached"])
            rec.set_attribute("edgesdk.vlm.kv_reused_tokens", info["kv_reused_tokens"])
            budget = min(max_tokens, llm.n_ctx() - info["input_tokens"])
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            out_text, emitted, generated, finish, t_first = "", 0, [], "length", None
            llm.set_seed(seed if seed is not None else 0xFFFFFFFF)
            hold = max((len(s) for s in stops), default=1) - 1
            # decode: from evaluating the prompt's last token to the last sampled one
            decode_stage = rec.stage("decode")
            gen = llm.generate(
                [info["last_token"]],
                reset=False,
                top_k=int(params["top_k"]),
                top_p=float(params["top_p"]),
                min_p=float(params["min_p"]),
                temp=float(params["temperature"]),
                repeat_penalty=float(params["repeat_penalty"]),
                frequency_penalty=float(params["frequency_penalty"]),
                presence_penalty=float(params["presence_penalty"]),
                logits_processor=params["logits_processor"],
            )
            try:
                for tok in gen:
                    rec.chunk()
                    if t_first is None:
                        t_first = perf_counter()
                        rec.first_chunk()
                    if self._is_eog(tok):
                        finish = "stop"
                        break
                    generated.append(int(tok))
                    out_text += decoder.decode(llm.detokenize([tok]))
                    cut = min((i for i in (out_text.find(s) for s in stops) if i >= 0), default=-1)
                    if cut >= 0:
                        out_text, finish = out_text[:cut], "stop"
                        break
                    if len(generated) >= budget:
                        break
                    if stream and len(out_text) - hold > emitted:
                        yield out_text[emitted : len(out_text) - hold]
                        emitted = len(out_text) - hold
                if len(out_text) > emitted:
                    yield out_text[emitted:]
            except GeneratorExit:
                finish = "cancelled"
                raise
            except BaseException as exc:
                decode_stage.end(exc)
                raise
            finally:
                gen.close()
                t_end = perf_counter()
                decode_stage.set_attribute("edgesdk.inference.stage.tokens", len(generated))
                decode_stage.end()
                pipe.note_generated(info["last_token"], generated)
                rec.set_output_tokens(len(generated))
                rec.finish([finish])
                rec.capture_output(out_text)
                self.last = {
                    "input_tokens": info["input_tokens"],
                    "image_tokens": info["image_tokens"],
                    "output_tokens": len(generated),
                    "output_ids": list(generated),
                    "finish_reason": finish,
                    "images_cached": info["images_cached"],
                    "kv_reused_tokens": info["kv_reused_tokens"],
                    "encoder_runs": pipe.encoder_runs,
                    "stages_s": {
                        **{k: round(v, 6) for k, v in pipe.last_stages.items()},
                        "decode_s": round(t_end - (t_first or t_end), 6),
                    },
                    "ttft_s": round(t_first - t0, 6) if t_first else None,
                    "decode_tok_s": round((len(generated) - 1) / (t_end - t_first), 2)
                    if t_first and len(generated) > 1 and t_end > t_first
                    else None,
                }

    def report(self) -> dict[str, Any]:
        enc = dict(self._report.get("vision_encoder") or {})
        if self.pipe.image_encoder is not None:
            enc.update(self.pipe.image_encoder.report())
        # per encoder path: runs and time per image (ms); a cached image runs neither
        enc["encode_ms"] = {
            k: {
                "runs": self.pipe.encode_runs[k],
                "median": round(float(np.median(v)) * 1e3, 3),
                "min": round(min(v) * 1e3, 3),
                "last": round(v[-1] * 1e3, 3),
            }
            for k, v in self.pipe.encode_s.items()
            if v
        }
        return {
            **self._report,
            "vision_encoder": enc,
            "encoder_runs": self.pipe.encoder_runs,
            "cached_images": len(self.pipe.features),
            "last_request": dict(self.last),
        }

    def close(self) -> None:
        with self._lock:
            self.pipe.close()


def load_vlm(bundle: Any, ctx: Any) -> VLMBackend:
    """Loader registered for format ``vlm``."""
    from edgesdk.extras import require

    require("gguf", "llama_cpp", "a VLM bundle")
    try:
        llama_cpp = import_llama_cpp()
    except (ImportError, OSError) as exc:
        raise BackendUnavailableError(f"llama-cpp-python is installed but does not load: {exc}") from exc
    opts = dict(ctx.options or {})
    route_llama_logs(bool(opts.get("verbose")))
    from edgesdk.manifest import LLMConfig

    planned_llm = bundle.manifest.llm or LLMConfig(n_ctx=512)  # the plan's llama.cpp settings (typed)
    raw = bundle.read_bytes("preprocessor_config.json")
    if raw is None:
        raise BackendUnavailableError(f"bundle {bundle.path} has no preprocessor_config.json")
    pre = json.loads(raw)
    pre["_image_size"] = bundle.manifest.vlm_image_size
    ngl = opts.get("n_gpu_layers", planned_llm.n_gpu_layers)
    ngl = planned_llm.layers + 1 if ngl in ("all", -1) else int(ngl)
    if ngl and not llama_cpp.llama_supports_gpu_offload():
        ctx.record_fallback(
            "llama.cpp (GPU offload)", "llama.cpp (CPU)", "this llama-cpp-python build has no GPU offload"
        )
        ngl = 0
    threads = opts.get("threads") or planned_llm.thread_count
    t0 = perf_counter()
    encoder, enc_report = _onnx_encoder(bundle, ctx, pre, threads)
    pipe = VLMPipeline(
        bundle.artifact_path("model"),
        bundle.artifact_path("mmproj"),
        pre,
        n_ctx=int(opts.get("n_ctx") or planned_llm.n_ctx or 512),
        n_gpu_layers=ngl,
        threads=threads,
        use_gpu=ngl > 0,
        use_mmap=bool(opts.get("use_mmap", True)),
        image_encoder=encoder,
        encoder_id=bundle.artifacts("mmproj" if encoder is None else "vision_encoder")[0].sha256,
    )
    report = {
        "runtime": f"llama-cpp-python {llama_cpp.__version__} (libmtmd)",
        "n_gpu_layers": ngl,
        "n_ctx": pipe.llm.n_ctx(),
        "threads": pipe.llm.n_threads,
        "load_s": round(perf_counter() - t0, 4),
        "mmap": "llama.cpp memory-maps the decoder GGUF (use_mmap default)"
        if opts.get("use_mmap", True)
        else "decoder GGUF read into memory (use_mmap=False)",
        "components": {"decoder": planned_llm.quant_type or None, "mmproj": "F16"},
        "vision_encoder": enc_report,
    }
    attrs = {
        "edgesdk.backend": "llama.cpp+mtmd",
        "edgesdk.gguf.quant_type": planned_llm.quant_type,
        "edgesdk.precision": bundle.precision,
        "edgesdk.bundle.id": bundle.bundle_id,
        "edgesdk.device.profile": ctx.profile.name if ctx.profile is not None else "",
    }
    return VLMBackend(pipe, report=report, model=bundle.model_name, attributes=attrs)


def parity_backend(
    decoder: str | Path, mmproj: str | Path, preprocessor: dict[str, Any], *, n_ctx: int, onnx: str | Path | None = None
) -> VLMBackend:
    """The runtime's own VLM path as the build's parity stage measures it (``formats/vlm/build.py``, which may not
    import the runtime: the VLM format names this function as its ``parity_backend`` and ``edgesdk.build`` hands
    it over): decoder + mmproj on the CPU, with ``onnx`` the FP16 ONNX encoder forced onto the CPU provider."""
    image_encoder = None
    if onnx is not None:
        from edgesdk.runtime.backends.vlm_onnx import OnnxImageEncoder

        image_encoder = OnnxImageEncoder(Path(onnx), preprocessor, "CPUExecutionProvider")
    pipe = VLMPipeline(decoder, mmproj, preprocessor, n_ctx=n_ctx, image_encoder=image_encoder)
    return VLMBackend(pipe, report={}, model="parity", attributes={})


def _onnx_encoder(bundle: Any, ctx: Any, pre: dict[str, Any], threads: int | None) -> tuple[Any, dict[str, Any]]:
    """The ONNX FP16 vision encoder when the bundle has one and a provider suits it (vlm_onnx.choose:
    TensorRT > CUDA, the CPU only when asked with ``vision_encoder="onnx"``), else None: libmtmd's mmproj."""
    from edgesdk.runtime.backends import vlm_onnx

    path = bundle.artifact_path("vision_encoder") if bundle.has_artifact("vision_encoder") else None
    # a class-token (CLIP) tower: the mmproj only tokenizes image chunks, the ONNX encoder must encode (docs/vlm.md)
    required = not bundle.manifest.mmproj_encodes
    provider, reason = vlm_onnx.choose(
        (ctx.options or {}).get("vision_encoder"), path, ctx.record_fallback, required=required
    )
    if provider is None or path is None:
        return None, {"path": "mmproj", "runtime": "llama.cpp libmtmd (F16 mmproj)", "reason": reason}
    enc = vlm_onnx.OnnxImageEncoder(path, pre, provider, threads=threads)
    if enc.active != provider:
        ctx.record_fallback(provider, enc.active, f"onnxruntime placed the vision encoder on {enc.active}")
    logging.getLogger("edgesdk.vlm").info("VLM vision encoder: ONNX FP16 on %s (%s)", enc.active, reason)
    return enc, {"path": "onnx", "runtime": "onnxruntime (FP16 ONNX encoder + projector)", "reason": reason}
