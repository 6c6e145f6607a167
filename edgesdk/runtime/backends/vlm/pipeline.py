# SPDX-License-Identifier: Apache-2.0
"""The VLM pipeline: decoder GGUF + mmproj GGUF in one llama.cpp context through libmtmd (llama-cpp-python's public
``llama_cpp.mtmd_cpp`` bindings): tokenize a prompt with its images, encode them (libmtmd's mmproj or the ONNX
encoder; features cached), collapse libmtmd's chunks to the family's token layout, prefill reusing the KV prefix.
libmtmd's own log lines go to the ``edgesdk.llama_cpp.mtmd`` logger (:func:`_route_mtmd_logs`). The request flow and
its telemetry: :mod:`edgesdk.runtime.backends.vlm`.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from collections import OrderedDict
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.backends.llama_core import close_quietly, open_llama
from edgesdk.runtime.backends.vlm.families import frames_for, image_frames
from edgesdk.runtime.backends.vlm.preprocess import ImagePreprocessor, record_for

FEATURE_CACHE_SIZE = 16  # images whose features are kept
ENCODE_TIMES_KEPT = 1024  # encoder run times kept per path for session.report()
FRAMES_CACHE_SIZE = 4  # image inputs whose preprocessed frames are kept (a 4096-token Qwen image: ~10 MB)

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
            self.llm = open_llama(
                llama_cpp,
                str(decoder),
                n_ctx=n_ctx,
                n_gpu_layers=n_gpu_layers,
                threads=threads,
                flash_attn=flash_attn,
                use_mmap=use_mmap,
            )
        except ValueError as exc:
            raise BackendUnavailableError(f"llama.cpp cannot load the decoder {decoder}: {exc}") from exc
        params = mtmd.mtmd_context_params_default()
        # with the ONNX encoder, libmtmd only tokenizes image chunks: its mmproj need not take GPU memory
        params.use_gpu = bool(use_gpu) and image_encoder is None
        params.n_threads = int(threads or self.llm.n_threads)
        params.print_timings = False
        params.warmup = False
        # the family's image-token limits for libmtmd (families.py: a dynamic-resolution family's)
        limits = frames_for(record_for(preprocessor)).mtmd_image_tokens(preprocessor)
        if limits is not None:
            params.image_min_tokens, params.image_max_tokens = limits
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
        # the ONNX FP16 encoder (vlm/onnx_session.py) when chosen at load; None: libmtmd's mmproj
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
        # an image given again (the same file unchanged, or the same bytes: a chat client re-sends the image every
        # turn) is not decoded and resized again: its frames, layout and frame keys by the input's identity
        self._frames: OrderedDict[tuple[Any, ...], tuple[list[np.ndarray], str | None, list[str]]] = OrderedDict()
        self.frames_reused = 0

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

    def _tokenize(self, text: str, images: list[Any], rec: Any = telemetry.NOOP_RECORDER) -> tuple[Any, list[str], int]:
        mtmd = self._mtmd
        keys, bitmaps = [], []
        self._pixels = {}
        t0 = perf_counter()
        stage = rec.stage("preprocess", {"edgesdk.vlm.images": len(images)}) if images else telemetry.NOOP_STAGE
        try:
            frames: list[np.ndarray] = []
            frame_keys: list[str] = []
            layouts: list[str] = []
            for image in images:
                got, layout, got_keys = self._image_frames(image)
                frames.extend(got)
                frame_keys.extend(got_keys)
                if layout is not None:  # the family writes each image's own layout
                    layouts.append(layout)
            if layouts:  # each image marker becomes the processor's layout, one marker per frame
                parts = text.split(self.marker)
                if len(parts) == len(layouts) + 1:
                    text = parts[0] + "".join(lay + part for lay, part in zip(layouts, parts[1:], strict=True))
            for pixels, key in zip(frames, frame_keys, strict=True):
                h, w = pixels.shape[:2]
                buf = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
                bm = mtmd.mtmd_bitmap_init(w, h, buf)
                if not bm:
                    raise BackendUnavailableError("mtmd_bitmap_init failed")
                bitmaps.append(bm)
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
        """Evaluate the prompt, reusing the KV prefix (never its last token, whose logits the first sampled token
        comes from: evaluated in the same batch as the rest of the text, not as a decode step of its own); returns
        the last token id, the token/image counts and stage timings. The caller samples from the context's logits
        (``Llama.generate([], reset=False)``).
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
                "prefill", {"edgesdk.inference.stage.tokens": n_total - keep, "edgesdk.vlm.kv_reused_tokens": keep}
            )
            mem = self._llama_cpp.llama_get_memory(llm.ctx)
            self._llama_cpp.llama_memory_seq_rm(mem, -1, keep, -1)
            llm.n_tokens = keep
            self._kv = list(seq[:keep])
            pos = 0
            for kind, val in plan:
                if kind == "text":  # the prompt's last token too: its logits are the first token's
                    ids = val
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
        if not self.pre.strategy.collapse_layout:  # families.py: tiles only
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

    def forget(self) -> None:
        """Drop the cached image features, the preprocessed frames and the record of the KV prefix, so the next
        request starts cold (what a benchmark's cold rounds need)."""
        with self._cache_lock:
            self.features.clear()
            self._frames.clear()
        self._kv = []

    def note_generated(self, generated: list[int]) -> None:
        """Record what the KV cache holds after generation (the prompt, then the generated tokens except the very
        last sampled one, which llama.cpp has not evaluated)."""
        self._kv.extend(generated[:-1])
        self._kv = self._kv[: self.llm.n_tokens]

    def close(self) -> None:
        if getattr(self, "mctx", None):
            self._mtmd.mtmd_free(self.mctx)
            self.mctx = None
        close_quietly(self.llm)
