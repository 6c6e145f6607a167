# SPDX-License-Identifier: Apache-2.0
"""The VLM backend: :class:`VLMBackend` (generate / stream / chat over one :class:`VLMPipeline`, the GenAI span per
request), its loader :func:`load_vlm` (registered for format ``vlm``), the build's :func:`parity_backend` and the
ONNX encoder's choice at load (:func:`_onnx_encoder`). The request flow and its telemetry:
:mod:`edgesdk.runtime.backends.vlm`.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.backend import TensorSpec
from edgesdk.runtime.backends.llama_core import eog_check, load_llama_cpp
from edgesdk.runtime.backends.vlm.pipeline import VLMPipeline
from edgesdk.runtime.requests import DEFAULT_SAMPLING, check_logit_bias, check_sampling

# ------------------------------------------------------------------ sampling options (this backend's own decode loop)

_SAMPLING_ALIASES = {"temp": "temperature"}


def _check_sampling(max_tokens: int, seed: int | None, params: Mapping[str, float]) -> tuple[int, int | None]:
    """Range-check generation options at the boundary: a bad value is one InputError (exit 3).
    The rule set is :func:`edgesdk.runtime.requests.check_sampling`, shared with GenerationRequest."""
    return check_sampling(max_tokens, seed, params)


def _bias_processor(logit_bias: tuple[tuple[int, float], ...]) -> Any:
    """``logit_bias`` as a llama-cpp-python logits processor list (None when empty). ``Llama.generate``
    runs it as the first sampler of its chain, on the whole vocabulary in token-id order."""
    if not logit_bias:
        return None
    ids = np.array([t for t, _ in logit_bias], dtype=np.intp)
    add = np.array([b for _, b in logit_bias], dtype=np.float32)

    def apply(_input_ids: Any, scores: np.ndarray) -> np.ndarray:
        out = np.array(scores, dtype=np.float32, copy=True)
        out[ids] += add
        return out

    return [apply]


def sampling_options(
    sampling: Mapping[str, Any], *, max_tokens: int, seed: int | None, logit_bias: Any, n_vocab: int
) -> tuple[dict[str, Any], int, int | None, Any]:
    """A request's sampling keyword options checked the same way for every llama.cpp backend (GGUF and VLM):
    (params = the defaults overlaid with the options given, max_tokens, seed, the checked logit bias). Unknown
    names, out-of-range values and bias ids outside the vocabulary are one InputError each."""
    named = {_SAMPLING_ALIASES.get(k, k): v for k, v in sampling.items()}
    unknown = set(named) - set(DEFAULT_SAMPLING)
    if unknown:
        raise InputError(
            f"unknown generation option(s): {', '.join(sorted(unknown))} "
            f"(known: max_tokens, stop, seed, stream, logit_bias, {', '.join(DEFAULT_SAMPLING)})"
        )
    params: dict[str, Any] = {**DEFAULT_SAMPLING, **{k: v for k, v in named.items() if v is not None}}
    max_tokens, seed = _check_sampling(max_tokens, seed, params)
    bias = check_logit_bias(logit_bias)
    if bias and bias[-1][0] >= n_vocab:
        raise InputError(f"logit_bias token ids must be < {n_vocab} (the vocabulary), got {bias[-1][0]}")
    return params, max_tokens, seed, bias


def request_record(params: Mapping[str, Any], max_tokens: int, stops: list[str], seed: int | None) -> dict[str, Any]:
    """The request options telemetry records (GenAI ``gen_ai.request.*``); penalties only when set (0 is off)."""
    request: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": params["temperature"],
        "top_p": params["top_p"],
        "top_k": params["top_k"],
        "stop_sequences": stops or None,
        "seed": seed,
    }
    for k in ("frequency_penalty", "presence_penalty"):
        if params[k]:
            request[k] = params[k]
    return request


def stepwise(body: Generator[str, None, None], lock: threading.Lock | threading.RLock) -> Iterator[str]:
    """A stream: each step of ``body`` runs under the context lock, released between pieces (so other
    requests can interleave whole steps, never half a llama.cpp call)."""
    try:
        while True:
            with lock:
                try:
                    piece = next(body)
                except StopIteration:
                    return
            yield piece
    finally:
        with lock:
            body.close()


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

        self._is_eog: Callable[[int], bool] = eog_check(llama_cpp, llama_cpp.llama_model_get_vocab(pipe.llm.model))

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
        params, max_tokens, seed, bias = sampling_options(
            sampling, max_tokens=max_tokens, seed=seed, logit_bias=logit_bias, n_vocab=int(self.pipe.llm.n_vocab())
        )
        params["logits_processor"] = _bias_processor(bias)
        stops = [stop] if isinstance(stop, str) and stop else [s for s in (stop or []) if s]
        request = request_record(params, max_tokens, stops, seed)
        body = self._decode(text, images, operation, capture, stream, request, params, max_tokens, stops, seed)
        return self._stepwise(body) if stream else body

    def _stepwise(self, body: Generator[str, None, None]) -> Iterator[str]:
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
            # decode: from sampling the first token (the prompt is evaluated) to the last sampled one
            decode_stage = rec.stage("decode")
            gen = llm.generate(
                [],  # the prompt is evaluated (prefill): sample from its last token's logits
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
                pipe.note_generated(generated)
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
    opts = dict(ctx.options or {})
    llama_cpp = load_llama_cpp("a VLM bundle", verbose=bool(opts.get("verbose")))  # as the GGUF loader (llama_core.py)
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
        from edgesdk.runtime.backends.vlm.onnx_session import OnnxImageEncoder

        image_encoder = OnnxImageEncoder(Path(onnx), preprocessor, "CPUExecutionProvider")
    pipe = VLMPipeline(decoder, mmproj, preprocessor, n_ctx=n_ctx, image_encoder=image_encoder)
    return VLMBackend(pipe, report={}, model="parity", attributes={})


def _onnx_encoder(bundle: Any, ctx: Any, pre: dict[str, Any], threads: int | None) -> tuple[Any, dict[str, Any]]:
    """The ONNX FP16 vision encoder when the bundle has one and a provider suits it (onnx_session.choose:
    TensorRT > CUDA, the CPU only when asked with ``vision_encoder="onnx"``), else None: libmtmd's mmproj."""
    from edgesdk.runtime.backends.vlm import onnx_session

    path = bundle.artifact_path("vision_encoder") if bundle.has_artifact("vision_encoder") else None
    # a class-token (CLIP) tower: the mmproj only tokenizes image chunks, the ONNX encoder must encode (docs/vlm.md)
    required = not bundle.manifest.mmproj_encodes
    provider, reason = onnx_session.choose(
        (ctx.options or {}).get("vision_encoder"), path, ctx.record_fallback, required=required
    )
    if provider is None or path is None:
        return None, {"path": "mmproj", "runtime": "llama.cpp libmtmd (F16 mmproj)", "reason": reason}
    enc = onnx_session.OnnxImageEncoder(path, pre, provider, threads=threads)
    if enc.active != provider:
        ctx.record_fallback(provider, enc.active, f"onnxruntime placed the vision encoder on {enc.active}")
    logging.getLogger("edgesdk.vlm").info("VLM vision encoder: ONNX FP16 on %s (%s)", enc.active, reason)
    return enc, {"path": "onnx", "runtime": "onnxruntime (FP16 ONNX encoder + projector)", "reason": reason}
