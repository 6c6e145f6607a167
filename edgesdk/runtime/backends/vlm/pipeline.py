# SPDX-License-Identifier: Apache-2.0
"""The VLM pipeline: a prompt with images becomes the engine's prompt. Decoder GGUF weights (loaded once,
:class:`~edgesdk.runtime.batching.Weights`) + mmproj GGUF through libmtmd (llama-cpp-python's public
``llama_cpp.mtmd_cpp`` bindings): preprocess the images, tokenize the prompt with them, collapse libmtmd's chunks to the
family's token layout, encode each image once (libmtmd's mmproj or the ONNX encoder; features cached). The result,
:class:`VLMPrompt`, holds the text's token ids and :class:`ImageChunk` objects between them, which the
:class:`~edgesdk.runtime.batching.BatchEngine` evaluates inside the request's slot (``mtmd_helper_decode_image_chunk``
on the slot's sequence, as llama-server evaluates an image); the engine's prefix reuse keeps image positions keyed by
the image's hash. libmtmd's own log lines go to the ``edgesdk.llama_cpp.mtmd`` logger (:func:`_route_mtmd_logs`). The
request flow and its telemetry: :mod:`edgesdk.runtime.backends.vlm`.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.host import default_threads
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.backends.vlm.families import frames_for, image_frames
from edgesdk.runtime.backends.vlm.preprocess import ImagePreprocessor, record_for
from edgesdk.runtime.batching import Weights

FEATURE_CACHE_SIZE = 16  # images whose features are kept
ENCODE_TIMES_KEPT = 1024  # encoder run times kept per path for session.report()
FRAMES_CACHE_SIZE = 4  # image inputs whose preprocessed frames are kept (a 4096-token Qwen image: ~10 MB)
N_BATCH = 512  # the engine's batch: an image's embeddings go in in pieces this large (Gemma-3's, non-causal: whole)

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


class ImageChunk:
    """One image chunk of a prompt as the engine evaluates it (:class:`edgesdk.runtime.batching.PromptImage`): a copy
    of libmtmd's chunk (this object frees it) and its features; :meth:`decode` puts them into the engine's context on
    the request's sequence with libmtmd's ``mtmd_helper_decode_image_chunk`` (which handles M-RoPE positions and
    Gemma-3's non-causal image attention), as llama-server evaluates an image in a slot."""

    def __init__(self, pipe: VLMPipeline, chunk: Any, key: str, n_pos: int, n_tokens: int, features: np.ndarray):
        mtmd = pipe._mtmd
        own = mtmd.mtmd_input_chunk_copy(chunk)
        if not own:
            raise BackendUnavailableError("llama.cpp could not copy an image chunk (mtmd_input_chunk_copy)")
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, own)
        self._pipe, self._chunk = pipe, own
        self.key, self.n_pos, self.n_tokens = key, n_pos, n_tokens
        self.features = np.ascontiguousarray(features, dtype=np.float32)

    def decode(self, ctx: Any, pos: int, seq_id: int, n_batch: int) -> int:
        pipe = self._pipe
        mtmd, ll = pipe._mtmd, pipe._llama_cpp
        new_n_past = ll.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            pipe.mctx,
            ctx,
            self._chunk,
            self.features.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            ll.llama_pos(pos),
            ll.llama_seq_id(seq_id),
            n_batch,
            ctypes.byref(new_n_past),
            mtmd.mtmd_helper_post_decode_callback(),
            None,
        )
        if rc != 0:
            raise BackendUnavailableError(f"llama.cpp could not decode the image (error {rc})")
        return int(new_n_past.value)


@dataclass
class VLMPrompt:
    """A prompt with its images, ready for the engine: the text's token ids and the image chunks between them
    (``(i, chunk)``: before ``tokens[i]``), with what it took to make them."""

    tokens: list[int]
    images: list[tuple[int, ImageChunk]]
    image_tokens: int
    n_images: int
    images_cached: int
    stages: dict[str, float]

    @property
    def input_tokens(self) -> int:
        return len(self.tokens) + self.image_tokens


class VLMPipeline:
    """Decoder weights + mmproj: a prompt with images -> :class:`VLMPrompt` (see the module docstring). Thread-safe:
    libmtmd's context tokenizes and encodes one prompt at a time (``_media``), the caches have their own lock."""

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
            self.weights = Weights(decoder, n_gpu_layers=n_gpu_layers, use_mmap=use_mmap)
        except (InputError, BackendUnavailableError) as exc:
            raise BackendUnavailableError(f"llama.cpp cannot load the decoder {decoder}: {exc}") from exc
        threads = int(threads or default_threads())
        # the engine's settings (runtime/backends/llamacpp.make_engine): one slot per request, each n_ctx long
        self.settings: dict[str, Any] = {
            "n_ctx": int(n_ctx),
            "n_gpu_layers": int(n_gpu_layers),
            "flash_attn": bool(flash_attn),
            "threads": threads,
            "n_batch": N_BATCH,
            "n_ubatch": N_BATCH,
            "speculative": "off",
        }
        params = mtmd.mtmd_context_params_default()
        # with the ONNX encoder, libmtmd only tokenizes image chunks: its mmproj need not take GPU memory
        params.use_gpu = bool(use_gpu) and image_encoder is None
        params.n_threads = threads
        params.print_timings = False
        params.warmup = False
        # the family's image-token limits for libmtmd (families.py: a dynamic-resolution family's)
        limits = frames_for(record_for(preprocessor)).mtmd_image_tokens(preprocessor)
        if limits is not None:
            params.image_min_tokens, params.image_max_tokens = limits
        self.mctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.weights.model, params)
        if not self.mctx:
            self.weights.close()
            raise BackendUnavailableError(
                f"llama.cpp's multimodal library cannot load the mmproj {mmproj} "
                "(mtmd_init_from_file returned NULL; run with verbose=True for its log)"
            )
        if not mtmd.mtmd_support_vision(self.mctx):
            self.close()
            raise BackendUnavailableError(f"{mmproj} has no vision encoder")
        self._vocab = llama_cpp.llama_model_get_vocab(self.weights.model)
        self.n_embd = int(llama_cpp.llama_model_n_embd(self.weights.model))
        self.marker = mtmd.mtmd_default_marker().decode("utf-8")
        cfg_size = int(preprocessor.get("_image_size") or 0)
        self.pre = ImagePreprocessor(preprocessor, cfg_size)
        self._media = threading.Lock()  # libmtmd's context: one tokenize + encode at a time
        # image features by (preprocessed pixels' sha256, encoder sha256), shared by every request to this model;
        # this lock guards the caches and counters (readers such as report() come from other threads)
        self.features: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.encoder_runs = 0
        # the ONNX FP16 encoder (vlm/onnx_session.py) when chosen at load; None: libmtmd's mmproj
        self.image_encoder = image_encoder
        # the feature cache key's component part: the encoder file's sha256 (load_vlm passes the manifest's,
        # verified at load, so a large encoder is not hashed twice)
        if encoder_id is None:
            path = Path(mmproj) if image_encoder is None else Path(image_encoder.path)
            encoder_id = hashlib.sha256(path.read_bytes()).hexdigest()
        self.encoder_id = encoder_id if image_encoder is None else "onnx-" + encoder_id
        # per encoder path: the last ENCODE_TIMES_KEPT run times (seconds) and the number of runs
        self.encode_s: dict[str, list[float]] = {"onnx": [], "mmproj": []}
        self.encode_runs: dict[str, int] = {"onnx": 0, "mmproj": 0}
        self._layout_ids: tuple[int | None, ...] | None = None  # Idefics3 layout token ids
        # an image given again (the same file unchanged, or the same bytes: a chat client re-sends the image every
        # turn) is not decoded and resized again: its frames, layout and frame keys by the input's identity
        self._frames: OrderedDict[tuple[Any, ...], tuple[list[np.ndarray], str | None, list[str]]] = OrderedDict()
        self.frames_reused = 0

    # ---------------------------------------------------------------- images
    def _features(self, key: str, chunk: Any, pixels: np.ndarray | None) -> tuple[np.ndarray, bool]:
        """The features of one image chunk (cached by ``key``), and whether they came from the cache. Under
        ``_media``."""
        with self._cache_lock:
            cached = self.features.get(key)
            if cached is not None:
                self.features.move_to_end(key)
                return cached, True
        mtmd = self._mtmd
        n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        t0 = perf_counter()
        if self.image_encoder is not None and pixels is not None:
            # ONNX Runtime on the same resized pixels; the decoder gets them via mtmd_helper_decode_image_chunk
            feats = self.image_encoder(pixels)
            if feats.shape != (n, self.n_embd):
                raise ShapeError(
                    f"the ONNX vision encoder returned features {list(feats.shape)}; the decoder "
                    f"expects {[n, self.n_embd]}"
                )
            path = "onnx"
        else:
            rc = mtmd.mtmd_encode_chunk(self.mctx, chunk)
            if rc != 0:
                raise BackendUnavailableError(f"llama.cpp's vision encoder failed (mtmd_encode_chunk returned {rc})")
            ptr = mtmd.mtmd_get_output_embd(self.mctx)
            feats = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
            path = "mmproj"
        seconds = perf_counter() - t0
        with self._cache_lock:
            times = self.encode_s[path]
            times.append(seconds)
            if len(times) > ENCODE_TIMES_KEPT:  # a long-running server must not grow this without bound
                del times[0]
            self.encode_runs[path] += 1
            self.encoder_runs += 1
            self.features[key] = feats
            while len(self.features) > FEATURE_CACHE_SIZE:
                self.features.popitem(last=False)
        return feats, False

    def image_features(self, image: Any) -> np.ndarray:
        """The encoder + projector output for one image (n_image_tokens x n_embd), as the decoder gets it; for a
        split Idefics3 / SmolVLM image its frames' features one after the other (tiles row by row, then the global
        image, the processor's order)."""
        text, frames = self._frames_of(self.marker, [image])
        with self._media:
            chunks = self._tokenize(text, frames)
            try:
                plan = [val for kind, val in self._chunk_plan(chunks, [k for k, _ in frames]) if kind == "image"]
                feats = [self._features(v[0], v[1], px)[0] for v, (_, px) in zip(plan, frames, strict=False)]
            finally:
                self._mtmd.mtmd_input_chunks_free(chunks)
        if not feats:
            raise BackendUnavailableError("llama.cpp produced no image chunk")
        return feats[0] if len(feats) == 1 else np.concatenate(feats)

    def _chunk_plan(self, chunks: Any, keys: list[str]) -> list[tuple[str, Any]]:
        """libmtmd's chunks as ``("text", [ids])`` / ``("image", (key, chunk, n_pos, n_tokens))`` in prompt order,
        after the family's layout (:meth:`_image_layout`), each image chunk given its frame's feature-cache key."""
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
                n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
                plan.append(("image", (None, chunk, n_pos, int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)))))
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

    @staticmethod
    def _source_id(image: Any) -> tuple[Any, ...] | None:
        """What identifies an image input without decoding it: a file by its resolved path, size and mtime, bytes
        by their sha256; None for other inputs (PIL images, arrays: not cached)."""
        if isinstance(image, (str, Path)):
            path = Path(str(image).removeprefix("file://"))
            try:
                st = path.stat()
            except OSError:
                return None  # load() says what is wrong with it
            return ("file", str(path.resolve()), st.st_size, st.st_mtime_ns)
        if isinstance(image, (bytes, bytearray, memoryview)):
            return ("bytes", hashlib.sha256(image).hexdigest())
        return None

    def _image_frames(self, image: Any) -> tuple[list[np.ndarray], str | None, list[str]]:
        """One image's frames (the encoder's inputs), its prompt layout (None: one marker) and each frame's feature
        cache key, from the frames cache when the same input was preprocessed before."""
        sid = self._source_id(image)
        if sid is not None:
            with self._cache_lock:
                hit = self._frames.get(sid)
                if hit is not None:
                    self._frames.move_to_end(sid)
                    self.frames_reused += 1
                    return hit
        _, img = self.pre.load(image)
        got, layout = image_frames(self.pre, self.pre.record, img, self.marker)
        keys = [
            hashlib.sha256(px.tobytes() + f"{px.shape[1]}x{px.shape[0]}".encode()).hexdigest() + ":" + self.encoder_id
            for px in got
        ]
        if sid is not None:
            with self._cache_lock:
                self._frames[sid] = (got, layout, keys)
                while len(self._frames) > FRAMES_CACHE_SIZE:
                    self._frames.popitem(last=False)
        return got, layout, keys

    def _frames_of(self, text: str, images: list[Any]) -> tuple[str, list[tuple[str, np.ndarray]]]:
        """Preprocess ``images`` (no libmtmd call: outside ``_media``): the prompt text with each image's layout
        written in (one marker per frame), and each frame's feature-cache key and pixels, in prompt order."""
        frames: list[tuple[str, np.ndarray]] = []
        layouts: list[str] = []
        for image in images:
            got, layout, keys = self._image_frames(image)
            frames += zip(keys, got, strict=True)
            if layout is not None:  # the family writes each image's own layout
                layouts.append(layout)
        if layouts:  # each image marker becomes the processor's layout, one marker per frame
            parts = text.split(self.marker)
            if len(parts) == len(layouts) + 1:
                text = parts[0] + "".join(lay + part for lay, part in zip(layouts, parts[1:], strict=True))
        return text, frames

    def _tokenize(self, text: str, frames: list[tuple[str, np.ndarray]]) -> Any:
        """libmtmd's chunks of ``text`` with its image frames (the caller frees them). Under ``_media``."""
        mtmd = self._mtmd
        bitmaps = []
        try:
            for key, pixels in frames:
                h, w = pixels.shape[:2]
                buf = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
                bm = mtmd.mtmd_bitmap_init(w, h, buf)
                if not bm:
                    raise BackendUnavailableError("mtmd_bitmap_init failed")
                bitmaps.append(bm)
                mtmd.mtmd_bitmap_set_id(bm, key[:64].encode())
            data = text.encode("utf-8")
            inp = mtmd.mtmd_input_text()
            inp.text, inp.text_len, inp.add_special, inp.parse_special = data, len(data), True, True
            chunks = mtmd.mtmd_input_chunks_init()
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = mtmd.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
        finally:
            for bm in bitmaps:
                mtmd.mtmd_bitmap_free(bm)
        if rc != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            why = {
                1: "the number of images does not match the image markers in the prompt",
                2: "image preprocessing failed",
            }.get(rc, f"error {rc}")
            raise InputError(f"cannot tokenize the prompt with its images: {why}")
        return chunks

    # ---------------------------------------------------------------- a prompt for the engine
    def prompt(self, text: str, images: list[Any], rec: Any = telemetry.NOOP_RECORDER) -> VLMPrompt:
        """``text`` (image markers in it) and ``images`` as the engine's prompt: the text's token ids and the image
        chunks between them, each image encoded once (libmtmd's mmproj or the ONNX encoder; features cached by the
        preprocessed pixels' and the encoder's sha256, so the same image in a later request is not encoded again).
        ``rec``: the request's telemetry recorder (stage child spans preprocess and encode; a cached image is an
        ``edgesdk.vlm.image_cached`` event)."""
        stages: dict[str, float] = {}
        t0 = perf_counter()
        with rec.stage("preprocess", {"edgesdk.vlm.images": len(images)}) if images else telemetry.NOOP_STAGE:
            text, frames = self._frames_of(text, images)
        stages["preprocess_s"] = perf_counter() - t0
        tokens: list[int] = []
        chunks_out: list[tuple[int, ImageChunk]] = []
        image_tokens = reused = 0
        t0 = perf_counter()
        with self._media:
            chunks = self._tokenize(text, frames)
            try:
                plan = self._chunk_plan(chunks, [k for k, _ in frames])
                pixels = iter(px for _, px in frames)
                for kind, val in plan:
                    if kind == "text":
                        tokens += val
                        continue
                    key, chunk, n_pos, n_tokens = val
                    cached = key in self.features  # a cached image gets an event, not an encode span
                    with (
                        telemetry.NOOP_STAGE
                        if cached
                        else rec.stage("encode", {"edgesdk.inference.stage.tokens": n_tokens})
                    ):
                        feats, hit = self._features(key, chunk, next(pixels))
                    if hit:
                        rec.add_event(
                            "edgesdk.vlm.image_cached",
                            {"edgesdk.vlm.image.sha256": key[:64], "edgesdk.vlm.image_tokens": n_tokens},
                        )
                    reused += int(hit)
                    image_tokens += n_tokens
                    chunks_out.append((len(tokens), ImageChunk(self, chunk, key, n_pos, n_tokens, feats)))
            finally:
                self._mtmd.mtmd_input_chunks_free(chunks)
        stages["encode_s"] = perf_counter() - t0
        if not tokens or (chunks_out and chunks_out[-1][0] >= len(tokens)):
            raise InputError("the prompt must end with text after its images")
        return VLMPrompt(tokens, chunks_out, image_tokens, len(images), reused, stages)

    def _token_id(self, text: str) -> int | None:
        """The one vocabulary token ``text`` is (special tokens parsed), else None."""
        data = text.encode()
        buf = (self._llama_cpp.llama_token * 8)()
        n = self._llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, 8, False, True)
        return int(buf[0]) if n == 1 else None

    def _image_layout(self, plan: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The family's token layout around each image. For Idefics3 / SmolVLM the prompt already holds the HF
        processor's layout (``families.idefics3.image_text``: ``<fake_token_around_image><row_R_col_C>`` before each
        tile, ``\\n`` after each row, ``\\n<fake_token_around_image><global-img>`` before the global image,
        ``<fake_token_around_image>`` after it) with one marker per frame, each frame already one encoder tile.
        libmtmd's Idefics3 template wraps every marker's image as a 1x1 grid: ``<fake_token_around_image>
        <row_1_col_1>`` + tile + ``\\n\\n<fake_token_around_image><global-img>`` + overview +
        ``<fake_token_around_image>``, tile and overview holding the same pixels. Each such group becomes its
        overview chunk alone (the encoder runs once per frame), which leaves exactly the HF token sequence."""
        if not self.pre.strategy.collapse_layout:  # families.py: tiles only
            return plan

        if self._layout_ids is None:  # the marker token ids, looked up once
            self._layout_ids = tuple(
                self._token_id(t) for t in ("<fake_token_around_image>", "<row_1_col_1>", "<global-img>", "\n\n")
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

    def forget(self) -> None:
        """Drop the cached image features and the preprocessed frames, so the next request's images are decoded and
        encoded anew (a benchmark's cold rounds; the engine's KV prefix: the backend's ``forget``)."""
        with self._cache_lock:
            self.features.clear()
            self._frames.clear()

    def close(self) -> None:
        """Free libmtmd's context and the decoder weights (every engine on them closed first)."""
        if getattr(self, "mctx", None):
            self._mtmd.mtmd_free(self.mctx)
            self.mctx = None
        self.weights.close()
