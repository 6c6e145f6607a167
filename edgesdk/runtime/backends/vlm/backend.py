# SPDX-License-Identifier: Apache-2.0
"""The VLM backend: :class:`VLMBackend` (generate / stream / chat through the model's one
:class:`~edgesdk.runtime.batching.BatchEngine`, the GenAI span per request), its loader :func:`load_vlm` (registered
for format ``vlm``), the build's :func:`parity_backend` and the ONNX encoder's choice at load (:func:`_onnx_encoder`).
The request flow and its telemetry: :mod:`edgesdk.runtime.backends.vlm`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk import telemetry
from edgesdk.contracts.gguf_types import DEFAULT_KV_TYPE, kv_bytes
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.host import default_threads
from edgesdk.runtime.backend import ImageLimits, TensorSpec, VisionRequestStats
from edgesdk.runtime.backends.llama_core import EngineFront, RecordedPieces, load_llama_cpp
from edgesdk.runtime.backends.vlm.pipeline import VLMPipeline, VLMPrompt
from edgesdk.runtime.batching import BatchEngine, MultimodalRequest, prefill_budget
from edgesdk.runtime.options import VlmLoadOptions
from edgesdk.runtime.requests import GenerationRequest

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from edgesdk.bundle import Bundle
    from edgesdk.runtime.backend import BatchingBackend, GenerationOptions, LoadContext, VisionBackend
    from edgesdk.runtime.batching import GenerationResult


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


class VLMBackend(EngineFront):
    """One loaded VLM bundle: ``generate(prompt, images=[...])``, ``stream``, ``chat`` with image parts. Every request
    is a :class:`~edgesdk.runtime.batching.MultimodalRequest` (the prompt's text tokens and image chunks,
    :meth:`VLMPipeline.prompt`) run by the model's one :class:`~edgesdk.runtime.batching.BatchEngine`: one slot at
    load (its prefix reuse on: a second question about the same image evaluates only its text), ``slots`` with
    :meth:`batch_engine` (``edgesdk serve --parallel N``), so image chats batch with each other. Thread-safe: concurrent
    callers are slots of the engine or wait in its queue; their prompts are made one at a time, in arrival order."""

    name = "llama.cpp+mtmd"
    provider = "llama.cpp"

    def __init__(
        self,
        pipe: VLMPipeline,
        *,
        report: dict[str, Any],
        model: str,
        attributes: dict[str, Any],
        llm_info: Mapping[str, Any] | None = None,
    ):
        self.pipe = pipe
        self.settings = dict(pipe.settings)
        self._report = report
        self._model = model
        self._attrs = attributes
        self._info = dict(llm_info or {})  # the manifest's model shape (kv_bytes_per_token)
        self.device = "cpu" if self.settings["n_gpu_layers"] == 0 else "cuda:0"
        self.inputs: Sequence[TensorSpec] = (TensorSpec("input_ids", "int64", None),)
        self.outputs: Sequence[TensorSpec] = (TensorSpec("logits", "float32", None),)
        try:
            self._engine = self._new_engine(slots=1)
        except BaseException:
            pipe.close()
            raise
        self._engine.reuse_prefix = True
        self._engine_lock = threading.Lock()  # replacing the engine (another slot count) vs. using it
        self._order = threading.Lock()  # a prompt is made and submitted before the next one: arrival order
        self.last_stats: VisionRequestStats | None = None  # the last finished request's figures

    @property
    def last(self) -> dict[str, Any]:
        """:attr:`last_stats` as a dict (``{}`` before the first request)."""
        return self.last_stats.as_dict() if self.last_stats is not None else {}

    @property
    def context_length(self) -> int:
        """Tokens one sequence holds (a slot's context, ``n_ctx``)."""
        return int(self.settings["n_ctx"])

    def image_limits(self) -> ImageLimits:
        """The preprocessor's size check, the image tokens one image costs and a slot's context (a server checks a
        chat's images with them before it queues the request)."""
        pre = self.pipe.pre
        return ImageLimits(check_size=pre.check_size, image_tokens=pre.image_tokens, context=self.context_length)

    def planned_slots(self) -> tuple[int | None, str]:
        """A VLM bundle's plan has no serving decisions: serve's defaults (no reason to add to theirs)."""
        return None, ""

    @property
    def on_gpu(self) -> bool:
        """The decoder's layers are offloaded to a GPU."""
        return int(self.settings["n_gpu_layers"]) != 0

    @property
    def engine(self) -> BatchEngine:
        return self._engine

    def tokenize(self, text: str) -> list[int]:
        return self._engine.tokenize(text, add_bos=True, special=False)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        raise ShapeError("a VLM bundle runs generate(prompt, images=[...]) or chat(messages)")

    def image_features(self, image: Any) -> np.ndarray:
        return self.pipe.image_features(image)

    def forget(self) -> None:
        """Start the next request cold: no cached image features or frames, no KV prefix kept in any slot."""
        self.pipe.forget()
        self._engine.forget_prefixes()

    def _prompt(self, prompt: str, images: list[Any]) -> str:
        marker = self.pipe.marker
        if marker in prompt or "<image>" in prompt:
            return prompt.replace("<image>", marker)
        return self.pipe.pre.record.user_prompt(prompt, len(images), marker)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt: str | Sequence[int],
        images: Sequence[Any] | None = None,
        *,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> str | Iterator[str]:
        """Answer ``prompt`` (text: a VLM takes no token ids) about ``images`` (paths, bytes, PIL images or arrays).
        A prompt without ``<image>`` markers is wrapped in the family's user turn (LLaVA's ``USER: <image>\\n...
        ASSISTANT:``)."""
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, got {type(prompt).__name__}")
        pictures = list(images or [])
        gen = self._run(self._prompt(prompt, pictures), pictures, "chat", prompt, stream, options)
        return gen if stream else "".join(gen)

    def stream(
        self, prompt: str | Sequence[int], images: Sequence[Any] | None = None, **options: Unpack[GenerationOptions]
    ) -> Iterator[str]:
        gen = self.generate(prompt, images, stream=True, **options)
        assert not isinstance(gen, str)
        return gen

    def _chat(
        self, messages: list[dict[str, Any]], chat_template: str | None, stream: bool, options: GenerationOptions
    ) -> Iterator[str]:
        """The reply to ``messages`` (:meth:`EngineFront.chat`) in the model family's own turn format (``chat_template``
        applies to GGUF bundles: None only)."""
        if chat_template is not None:
            raise InputError(
                "chat_template applies to GGUF bundles: a VLM formats chats with its model family's "
                "own turn format (docs/vlm.md)"
            )
        text, images = self._chat_text(messages)
        return self._run(text, images, "chat", messages, stream, options)

    def _chat_text(self, messages: list[dict[str, Any]]) -> tuple[str, list[Any]]:
        _, images = _split_content(messages)  # validates the messages and collects the images in order
        return self.pipe.pre.record.chat(messages, self.pipe.marker), images

    def _run(
        self, text: str, images: list[Any], operation: str, capture: Any, stream: bool, options: GenerationOptions
    ) -> Iterator[str]:
        request = GenerationRequest.from_options(prompt=text, stream=stream, **options)  # checked before any image
        rec = self.recorder(request, operation)
        return self._consume(request, images, rec, capture)

    def encode(self, request: GenerationRequest, inputs: Any = None, rec: Any = telemetry.NOOP_RECORDER) -> Any:
        """``request`` as the engine's :class:`MultimodalRequest`: its chat (``inputs``: the messages with their
        image parts, as the server parsed them; else the request's own text messages) in the family's turn format,
        or its prompt text wrapped as :meth:`generate` wraps it; the images preprocessed and encoded (cached).
        ``rec``: the request's recorder (stages preprocess and encode). For :meth:`batch_engine`'s engine."""
        if request.tools:
            raise InputError("tools need a GGUF bundle's chat template: a VLM formats chats with its family's own")
        if request.prompt_tokens is not None:
            raise InputError("a VLM takes its prompt as text or chat messages, not token ids")
        if request.messages is not None:
            text, images = self._chat_text(inputs if inputs is not None else [m.as_dict() for m in request.messages])
        else:
            assert request.prompt is not None
            text, images = self._prompt(request.prompt, []), []
        vp = self.pipe.prompt(text, images, rec)
        self._record_prompt(rec, vp)
        return self._multimodal(request, vp)

    def _consume(
        self, request: GenerationRequest, images: list[Any], rec: Any, capture: Any
    ) -> Generator[str, None, None]:
        """One request under its GenAI span: its prompt made (stages preprocess, encode) and run by the engine
        (stages prefill: until the first piece, decode: after it); ``self.last_stats`` from its result. Closing the
        generator early cancels the request (its slot is free at the engine's next step)."""
        finish, decode = "error", None
        with rec:
            rec.capture_input(capture)
            t0 = perf_counter()
            assert request.prompt is not None
            with self._order:
                vp = self.pipe.prompt(request.prompt, images, rec)
                mm = self._multimodal(request, vp)
                handle = self._engine.submit(mm)
            self._record_prompt(rec, vp)
            prefill = rec.stage("prefill", {"edgesdk.inference.stage.tokens": vp.input_tokens})

            def first() -> None:
                nonlocal decode
                prefill.end()
                rec.first_chunk()
                decode = rec.stage("decode")

            pieces = RecordedPieces(handle, rec, first)
            try:
                yield from pieces
            finally:
                res = pieces.result
                prefill.end()
                decode = decode or rec.stage("decode")
                if res is not None:
                    finish = res.finish_reason
                    decode.set_attribute("edgesdk.inference.stage.tokens", len(res.tokens))
                    rec.set_attribute("edgesdk.vlm.kv_reused_tokens", res.cached_tokens)
                    rec.set_output_tokens(len(res.tokens))
                    rec.capture_output(res.text)
                    self.last_stats = self._stats(vp, res, t0)
                decode.end()
                rec.finish([finish])

    @staticmethod
    def _record_prompt(rec: Any, vp: VLMPrompt) -> None:
        rec.set_input_tokens(vp.input_tokens)
        rec.set_attribute("edgesdk.vlm.image_tokens", vp.image_tokens)
        rec.set_attribute("edgesdk.vlm.images", vp.n_images)
        rec.set_attribute("edgesdk.vlm.images_cached", vp.images_cached)
        for k, v in vp.stages.items():
            rec.set_attribute(f"edgesdk.vlm.{k}", round(v, 6))

    @staticmethod
    def _multimodal(request: GenerationRequest, vp: VLMPrompt) -> MultimodalRequest:
        fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(GenerationRequest)}
        fields.update(prompt=None, messages=None, prompt_tokens=tuple(vp.tokens), tools=())
        return MultimodalRequest(**fields, images=tuple(vp.images))

    def _stats(self, vp: VLMPrompt, res: GenerationResult, t0: float) -> VisionRequestStats:
        """A finished request's figures (``last_stats``): counts, its images, token instants and stage times; TTFT
        from the call (preprocessing and encoding included)."""
        first, end = res.first_token_at, res.finished_at or perf_counter()
        stats: VisionRequestStats = VisionRequestStats.of_result(
            res,
            end,
            ttft_s=round(first - t0, 6) if first else None,
            image_tokens=vp.image_tokens,
            output_ids=tuple(res.tokens),
            images_cached=vp.images_cached,
            encoder_runs=self.pipe.encoder_runs,
            stages_s={
                **{k: round(v, 6) for k, v in vp.stages.items()},
                "prefill_s": round((first or end) - (end - res.total_s), 6),
                "decode_s": round(end - (first or end), 6),
            },
        )
        return stats

    # ------------------------------------------------------------------ the engine (BatchingBackend)
    def batch_engine(self, *, slots: int, max_queue: int, reuse_prefix: bool = True) -> BatchEngine:
        """The model's engine with ``slots`` sequences (``edgesdk serve --parallel N``): the current one when it has
        that many, else a new context on the same weights that replaces it once the old one is idle."""
        with self._engine_lock:
            old = self._engine
            if old.slots != slots or old.closed:
                old.retire(self._model)
                self._engine = self._new_engine(slots)
            self._engine.max_queue = int(max_queue)
            self._engine.reuse_prefix = bool(reuse_prefix)
            return self._engine

    def _new_engine(self, slots: int) -> BatchEngine:
        """An engine of ``slots`` sequences on the decoder weights, set up as the GGUF backend's (llamacpp.make_engine):
        on a GPU one KV buffer and every waiting prompt per step in the generating tokens' decode; on the CPU a buffer
        per slot and one prompt per step, in a decode of its own."""
        st, on_gpu = self.settings, self.settings["n_gpu_layers"] != 0
        return BatchEngine(
            self.pipe.weights.path,
            model=self.pipe.weights.model,
            slots=slots,
            prompts_per_step=None if on_gpu else 1,
            mixed_prefill=on_gpu,
            kv_unified=on_gpu,
            n_ctx=st["n_ctx"],
            n_gpu_layers=st["n_gpu_layers"],
            flash_attn=st["flash_attn"],
            threads=st["threads"],
            n_batch=st["n_batch"],
            n_ubatch=st["n_ubatch"],
            prefill_chunk=self.prefill_budget()[0],
        )

    def prefill_budget(self) -> tuple[int, str]:
        return prefill_budget(self.settings["n_gpu_layers"] != 0, int(self.settings["n_batch"]))

    def speculative_plan(self) -> tuple[str, int, str]:
        return "off", 0, "off (a VLM's prompts hold images; prompt lookup drafts from token ids)"

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cache one token takes in one sequence (all layers, F16), from the manifest's model shape
        (0 when it does not record it)."""
        info = self._info
        if not all(info.get(k) for k in ("layers", "kv_heads", "head_dim")):
            return 0
        return int(kv_bytes(info, 1, DEFAULT_KV_TYPE))

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
            for k, v in list(self.pipe.encode_s.items())
            if v
        }
        return {
            **self._report,
            "vision_encoder": enc,
            "engine": dict(self._engine.settings),
            "encoder_runs": self.pipe.encoder_runs,
            "cached_images": len(self.pipe.features),
            "last_request": self.last,
        }

    def close(self) -> None:
        with self._engine_lock:
            self._engine.close()
            if self._engine.closed:  # never free the weights under a decode that did not stop
                self.pipe.close()


def load_vlm(bundle: Bundle, ctx: LoadContext) -> VLMBackend:
    """Loader registered for format ``vlm``."""
    opts = VlmLoadOptions.narrow(ctx.options)  # typed: a field left None is the plan's (or the default)
    llama_cpp = load_llama_cpp("a VLM bundle", verbose=bool(opts.verbose))  # as the GGUF loader (llama_core.py)
    from edgesdk.manifest import LLMConfig

    planned_llm = bundle.manifest.llm or LLMConfig(n_ctx=512)  # the plan's llama.cpp settings (typed)
    raw = bundle.read_bytes("preprocessor_config.json")
    if raw is None:
        raise BackendUnavailableError(f"bundle {bundle.path} has no preprocessor_config.json")
    pre = json.loads(raw)
    pre["_image_size"] = bundle.manifest.vlm_image_size
    if bundle.manifest.vlm_family:
        pre["_family"] = bundle.manifest.vlm_family
    if bundle.manifest.vlm_image_tokens:  # image tokens per frame: a request's images are counted before decoding
        pre["_image_tokens"] = bundle.manifest.vlm_image_tokens
    planned = opts.n_gpu_layers if opts.n_gpu_layers is not None else planned_llm.n_gpu_layers
    ngl = planned_llm.layers + 1 if planned in ("all", -1) else int(planned)
    if ngl and not llama_cpp.llama_supports_gpu_offload():
        ctx.record_fallback(
            "llama.cpp (GPU offload)", "llama.cpp (CPU)", "this llama-cpp-python build has no GPU offload"
        )
        ngl = 0
    planned_threads = planned_llm.thread_count  # the profile's cores, capped by what this host gives (host.py)
    threads = opts.threads or (default_threads(planned=planned_threads) if planned_threads else None)
    use_mmap = opts.use_mmap is not False  # default: memory-mapped
    t0 = perf_counter()
    encoder, enc_report = _onnx_encoder(bundle, ctx, pre, threads, opts.vision_encoder)
    pipe = VLMPipeline(
        bundle.artifact_path("model"),
        bundle.artifact_path("mmproj"),
        pre,
        n_ctx=int(opts.n_ctx or planned_llm.n_ctx or 512),
        n_gpu_layers=ngl,
        threads=threads,
        use_gpu=ngl > 0,
        use_mmap=use_mmap,
        image_encoder=encoder,
        encoder_id=bundle.artifacts("mmproj" if encoder is None else "vision_encoder")[0].sha256,
    )
    report = {
        "runtime": f"llama-cpp-python {llama_cpp.__version__} (libmtmd)",
        "n_gpu_layers": ngl,
        "n_ctx": pipe.settings["n_ctx"],
        "threads": pipe.settings["threads"],
        "load_s": round(perf_counter() - t0, 4),
        "mmap": "llama.cpp memory-maps the decoder GGUF (use_mmap default)"
        if use_mmap
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
    return VLMBackend(pipe, report=report, model=bundle.model_name, attributes=attrs, llm_info=planned_llm.details)


def parity_backend(
    decoder: str | Path, mmproj: str | Path, preprocessor: dict[str, Any], *, n_ctx: int, onnx: str | Path | None = None
) -> VLMBackend:
    """The runtime's own VLM path as the build's parity stage measures it (``formats/vlm/build.py``, which may not
    import the runtime: the VLM format names this function as its ``parity_backend`` and ``edgesdk.build`` hands
    it over): decoder + mmproj on the CPU, with ``onnx`` the FP16 ONNX encoder forced onto the CPU provider."""
    image_encoder = None
    if onnx is not None:
        from edgesdk.runtime.backends.vlm.onnx_session import OnnxImageEncoder

        image_encoder = OnnxImageEncoder(Path(onnx), preprocessor, "CPUExecutionProvider")
    pipe = VLMPipeline(decoder, mmproj, preprocessor, n_ctx=n_ctx, image_encoder=image_encoder)
    return VLMBackend(pipe, report={}, model="parity", attributes={})


def _onnx_encoder(
    bundle: Bundle, ctx: LoadContext, pre: dict[str, Any], threads: int | None, choice: str | None
) -> tuple[Any, dict[str, Any]]:
    """The ONNX FP16 vision encoder when the bundle has one and a provider suits it (onnx_session.choose:
    TensorRT > CUDA, the CPU only when asked with ``vision_encoder="onnx"``), else None: libmtmd's mmproj."""
    from edgesdk.runtime.backends.vlm import onnx_session

    path = bundle.artifact_path("vision_encoder") if bundle.has_artifact("vision_encoder") else None
    # a class-token (CLIP) tower: the mmproj only tokenizes image chunks, the ONNX encoder must encode (docs/vlm.md)
    required = not bundle.manifest.mmproj_encodes
    provider, reason = onnx_session.choose(choice, path, ctx.record_fallback, required=required)
    if provider is None or path is None:
        return None, {"path": "mmproj", "runtime": "llama.cpp libmtmd (F16 mmproj)", "reason": reason}
    enc = onnx_session.OnnxImageEncoder(path, pre, provider, threads=threads)
    if enc.active != provider:
        ctx.record_fallback(provider, enc.active, f"onnxruntime placed the vision encoder on {enc.active}")
    logging.getLogger("edgesdk.vlm").info("VLM vision encoder: ONNX FP16 on %s (%s)", enc.active, reason)
    return enc, {"path": "onnx", "runtime": "onnxruntime (FP16 ONNX encoder + projector)", "reason": reason}


if TYPE_CHECKING:  # mypy holds the backend to the contracts the session and serve ask for with isinstance

    def _contracts(backend: VLMBackend) -> tuple[VisionBackend, BatchingBackend]:
        return backend, backend
