# SPDX-License-Identifier: Apache-2.0
"""llama.cpp backend for GGUF bundles: generate / stream / chat with GenAI telemetry, and eager fallbacks.

Load order (each step down is recorded with ``ctx.record_fallback``):
  planned settings (flash attention per the profile's kernel table, all layers on the GPU, sized to
  the free device memory) -> flash attention off -> half the layers -> CPU only.
Each attempt is a load plus a first decode. Where the profile marks the platform risky (sm_87:
llama.cpp issue #24457, flash attention crashing on Orin), the attempt first runs in a child
process, so a segfault there costs one fallback record instead of the host process.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import itertools
import subprocess
import sys
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.formats.gguf.chat_limits import render as render_chat
from edgesdk.formats.gguf.types import DEFAULT_KV_TYPE, kv_bytes
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.backend import LoadContext, TensorSpec
from edgesdk.runtime.backends.llama_core import close_quietly, eog_check, load_llama_cpp, open_llama
from edgesdk.runtime.requests import DEFAULT_SAMPLING, GenerationRequest, check_logit_bias, check_sampling

if TYPE_CHECKING:
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_types import ChatCompletionRequestMessage

    from edgesdk.bundle import Bundle
    from edgesdk.runtime.batching import BatchEngine

RISKY_SMS = {"8.7"}  # llama.cpp FA/offload crashes reported on Orin (docs/devices.md)
GPU_RESERVE_BYTES = 512 * 1024 * 1024  # CUDA context + cuBLAS workspace, kept free when sizing offload


def free_device_bytes() -> tuple[int | None, str]:
    """Free memory llama.cpp can offload into: NVML on discrete GPUs, MemAvailable on Jetson (unified).

    Reads only the device tree and NVML: no :func:`edgesdk.host.probe` (which imports ONNX Runtime and
    TensorRT to list providers), so a GGUF load brings no library into the process that it does not use."""
    from edgesdk import host

    if host.read_jetson_identity() is not None:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            with open("/proc/meminfo") as fh:
                kb = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
            return kb * 1024, "MemAvailable (Jetson unified memory)"
    free = host.gpu_free_bytes(0)
    if free is not None:
        return free, "NVML free memory of GPU 0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(out.stdout.strip().splitlines()[0]) * 1024 * 1024, "nvidia-smi memory.free of GPU 0"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None, "free device memory unknown (no NVML, nvidia-smi or Jetson meminfo)"


def _layers_that_fit(llm_info: Mapping[str, Any], n_ctx: int, free: int) -> int:
    """Transformer layers whose weights + KV fit in ``free`` bytes (output layer counted as one)."""
    layers = int(llm_info["layers"])
    kv_per_layer = kv_bytes({**llm_info, "layers": 1}, n_ctx)
    per_layer = int(llm_info["file_bytes"]) / (layers + 1) + kv_per_layer
    return max(0, min(layers + 1, int((free - GPU_RESERVE_BYTES) // per_layer)))


# ------------------------------------------------------------------ chat templates


def chat_template_names() -> list[str]:
    """Named chat templates shipped in ``edgesdk/data/chat_templates`` (``NAME.jinja``)."""
    from edgesdk.formats.gguf.chat_templates import names

    return names()


def resolve_chat_template(spec: str) -> tuple[str, str, list[str]]:
    """``NAME`` (a shipped template) or a path to a Jinja file -> (label, template text, stop strings).

    A template's stop strings come from ``{# edgesdk-stop: TEXT #}`` lines in it (besides the model's
    end-of-generation tokens, which always stop). :mod:`edgesdk.formats.gguf.chat_templates` is the resolver."""
    from edgesdk.formats.gguf.chat_templates import resolve

    return resolve(spec)


class SupersededStreamError(InputError):
    """A stream was paused while another request used the session's llama.cpp context."""


# ------------------------------------------------------------------ sampling options

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


class LlamaCppBackend:
    """One loaded GGUF model. ``generate``/``stream``/``chat`` go through ``telemetry.inference``.

    Thread safety: one llama.cpp context serves every request, so access to it is serialised by one
    lock. ``generate``/``chat`` hold it for the whole request; a ``stream`` holds it for each step
    (one token: decode, sample, detokenise), so other requests may run between its tokens. A request
    that runs while a stream is paused takes over the context (its KV cache, sampler, token history);
    the paused stream's next ``next()`` then raises :class:`SupersededStreamError` instead of
    continuing on foreign state. Concurrent callers therefore never crash the process or mix
    outputs; they wait for each other. For concurrent streams, load one session per stream.
    """

    name = "llama.cpp"
    provider = "llama.cpp"

    def __init__(
        self,
        llm: Llama,
        *,
        settings: dict[str, Any],
        report: dict[str, Any],
        model: str,
        attributes: dict[str, Any],
        chat_template: str | None = None,
        path: str = "",
        llm_info: Mapping[str, Any] | None = None,
    ) -> None:
        llama_cpp = import_llama_cpp()

        self._llm = llm
        self._path = path
        self._info = dict(llm_info or {})  # the manifest's llm section: the model shape
        self.settings = settings
        self._report = report
        self._model = model
        self._attrs = attributes
        self._eos = llm.token_eos()
        self._formatters: dict[str | None, tuple[Jinja2ChatFormatter, list[str]]] = {}
        self._tool_templates: dict[int, bool] = {}  # id(formatter) -> whether its template renders tools
        self._default_template = chat_template
        self.device = "cpu" if settings["n_gpu_layers"] == 0 else f"cuda:0 ({report['placement']})"
        # run(): token ids of any rank (flattened) -> the last position's logits.
        self.inputs = (TensorSpec("input_ids", "int64", None),)
        self.outputs = (TensorSpec("logits", "float32", (1, int(llm.n_vocab()))),)
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._is_eog: Callable[[int], bool] = eog_check(llama_cpp, self._vocab)
        self._random_seed = int(llama_cpp.LLAMA_DEFAULT_SEED)
        # llama.cpp's own per-context timers (what llama-bench reports): prompt evaluation and
        # token-by-token evaluation, without Python, sampling or detokenising in between.
        perf, reset = (
            getattr(llama_cpp, "llama_perf_context", None),
            getattr(llama_cpp, "llama_perf_context_reset", None),
        )
        self._perf = (perf, reset) if perf and reset else None
        self._lock = threading.RLock()  # the context; see the class docstring
        self._owner = 0  # id of the request that last used the context
        self._next_id = itertools.count(1)
        self.last: dict[str, Any] = {}
        # Opt-in prompt prefix cache (edgesdk.serve.prompt_cache.PromptCache or None): restore(llm, tokens)
        # after the reset, save(llm) after a request. With it, outputs may differ in the last bits (below).
        self.prompt_cache: Any = None

    def _perf_reset(self) -> None:
        if self._perf is not None:
            with contextlib.suppress(Exception):
                self._perf[1](self._llm.ctx)

    def _perf_read(self) -> dict[str, float]:
        """Prompt-eval and eval time/tokens of the last request, from llama.cpp (empty when unavailable)."""
        if self._perf is None:
            return {}
        try:
            data = self._perf[0](self._llm.ctx)
        except Exception:  # noqa: BLE001 - timing is a bonus, never a failure
            return {}
        out: dict[str, float] = {}
        if data.n_p_eval > 0 and data.t_p_eval_ms > 0:
            out["prompt_eval_tokens"], out["prompt_eval_ms"] = int(data.n_p_eval), round(float(data.t_p_eval_ms), 3)
        if data.n_eval > 0 and data.t_eval_ms > 0:
            out["eval_tokens"], out["eval_ms"] = int(data.n_eval), round(float(data.t_eval_ms), 3)
        return out

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        with self._lock:
            return self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Raw forward pass: ``{"input_ids": [...]}`` -> ``{"logits": last-position logits}``."""
        raw = feeds.get("input_ids")
        if raw is None:
            raise ShapeError("llama.cpp run() takes {'input_ids': token ids}")
        ids = [int(t) for t in np.asarray(raw).reshape(-1)]
        if not ids:
            raise ShapeError("llama.cpp run() needs at least one token id")
        n_vocab = int(self._llm.n_vocab())
        if min(ids) < 0 or max(ids) >= n_vocab:
            raise ShapeError(f"token ids must be in [0, {n_vocab}), got {min(ids)}..{max(ids)}")
        self._check_fits(len(ids), 0)
        with self._lock:
            self._owner = next(self._next_id)
            self._llm.reset()
            self._llm.eval(ids)
            return {"logits": np.asarray(self._llm.scores[len(ids) - 1], dtype=np.float32)[None, :]}

    def _check_fits(self, n_prompt: int, max_tokens: int) -> int:
        n_ctx = self._llm.n_ctx()
        if n_prompt >= n_ctx:
            raise ShapeError(
                f"prompt is {n_prompt} tokens; the context holds {n_ctx} "
                "(shorten the prompt or rebuild with a longer --context-length)"
            )
        return min(max_tokens, n_ctx - n_prompt)

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: str, **kw: Any) -> str | Iterator[str]:
        """Completion text for ``prompt`` (``stream=True`` returns an iterator of text pieces)."""
        if kw.pop("stream", False):
            return self.stream(prompt, **kw)
        return self._complete(self._run(prompt, "text_completion", stream=False, special=False, **kw))

    def stream(self, prompt: str, **kw: Any) -> Iterator[str]:
        return self._run(prompt, "text_completion", stream=True, special=False, **kw)

    def chat(
        self, messages: list[dict[str, str]], *, chat_template: str | None = None, **kw: Any
    ) -> str | Iterator[str]:
        """Reply to ``messages``, formatted with ``chat_template`` (a shipped name or a Jinja file), else the
        session's default (``load(..., chat_template=)``), else the GGUF's own ``tokenizer.chat_template``."""
        _check_messages(messages)
        prompt, template_stops, add_bos = self._format_chat(messages, chat_template)
        stop = kw.pop("stop", None)
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        stop += template_stops
        stream = kw.pop("stream", False)
        gen = self._run(
            prompt, "chat", stream=stream, special=True, stop=stop, add_bos=add_bos, _capture_messages=messages, **kw
        )
        return gen if stream else self._complete(gen)

    def _format_chat(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None,
        tools: Sequence[Mapping[str, Any]] = (),
        tool_choice: str | None = None,
    ) -> tuple[str, list[str], bool]:
        """Chat messages -> (prompt text, the template's stop strings, whether to add BOS).

        ``tools`` go to the template as ``tools=`` when it renders them; a template that ignores them (Gemma's)
        gets them as a system turn instead, and earlier tool calls and results as JSON turns
        (:mod:`edgesdk.runtime.grammar`, llama.cpp's generic tool format)."""
        from edgesdk.runtime import grammar

        fmt, extra_stops = self._chat_formatter(chat_template or self._default_template)
        kw: dict[str, Any] = {}
        native = self._renders_tools(fmt)
        if tools:
            if native:
                kw["tools"] = list(tools)
                messages = grammar.with_system(
                    list(messages), grammar.tool_preamble(tools, tool_choice, list_tools=False)
                )
            else:
                messages = grammar.with_system(
                    grammar.generic_tool_messages(messages), grammar.tool_preamble(tools, tool_choice)
                )
        elif not native and any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            messages = grammar.generic_tool_messages(messages)
        try:  # within chat_limits' budget: a GGUF's own template is the model author's code
            result = render_chat(fmt, messages=cast("list[ChatCompletionRequestMessage]", messages), **kw)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - jinja errors on malformed messages: one line
            raise InputError(f"chat template failed on these messages ({type(exc).__name__}: {exc})") from exc
        stops = [s for s in ([result.stop] if isinstance(result.stop, str) else (result.stop or [])) if s]
        return result.prompt, stops + extra_stops, not getattr(result, "added_special", False)

    def _renders_tools(self, fmt: Jinja2ChatFormatter) -> bool:
        """Whether a chat template renders ``tools`` (rendering a probe with and without one differs)."""
        known = self._tool_templates.get(id(fmt))
        if known is None:
            probe: Any = [{"role": "user", "content": "x"}]
            tool: Any = [
                {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
            ]
            try:
                known = "probe_tool_name" in render_chat(fmt, messages=probe, tools=tool).prompt
            except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
                known = False
            self._tool_templates[id(fmt)] = known
        return known

    def encode(self, request: GenerationRequest) -> GenerationRequest:
        """The request with its prompt as token ids, as ``generate``/``chat`` would evaluate it: a chat is
        formatted with this session's template, its stop strings join the request's. For a
        :class:`~edgesdk.runtime.batching.BatchEngine` on this model (:meth:`batch_engine`)."""
        if request.prompt_tokens is not None:
            tokens, stops = list(request.prompt_tokens), list(request.stop)
        elif request.messages is not None:
            prompt, extra, add_bos = self._format_chat(
                [m.as_dict() for m in request.messages], None, request.tools, request.tool_choice
            )
            with self._lock:
                tokens = self._llm.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True)
            stops = list(request.stop) + [s for s in extra if s not in request.stop]
        else:
            assert request.prompt is not None
            with self._lock:
                tokens = self._llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=False)
            stops = list(request.stop)
        if not tokens:
            raise InputError("the prompt is empty (no tokens)")
        return dataclasses.replace(
            request, prompt=None, messages=None, prompt_tokens=tuple(tokens), stop=tuple(stops), tools=()
        )

    def recorder(self, request: GenerationRequest) -> Any:
        """The telemetry recorder (GenAI span and metrics) of one request that a batch engine runs: not yet
        started, never made the current span (it ends on the engine's thread)."""
        operation = "chat" if request.messages is not None else "text_completion"
        return telemetry.inference(
            operation,
            self._model,
            self.provider,
            stream=request.stream,
            request={
                "max_tokens": request.max_tokens,
                "temperature": request.temperature,
                "top_p": request.top_p,
                "top_k": request.top_k,
                "stop_sequences": list(request.stop) or None,
                "seed": request.seed,
                "frequency_penalty": request.frequency_penalty or None,
                "presence_penalty": request.presence_penalty or None,
            },
            attributes=self._attrs,
            attach=False,
        )

    def batch_engine(self, *, slots: int, max_queue: int, reuse_prefix: bool = True) -> BatchEngine:
        """A continuous-batching engine on this backend's model (the weights are not loaded again): its own
        llama.cpp context of ``slots`` sequences, each as long as this session's context, with the settings
        this session got (GPU layers, flash attention, threads, batch sizes, K/V types)."""
        from edgesdk.runtime.batching import BatchEngine

        st, rep = self.settings, self._report
        # On a GPU: one KV buffer for all slots, every waiting prompt eligible per step, prompt chunks in the
        # generating tokens' llama_decode (BatchEngine's defaults; measured: docs/benchmarks.md "The load curve").
        # On the CPU: a KV buffer per slot and one prompt per step in a decode of its own, as before, with the
        # busy slots kept compact (BatchEngine._pick_slot). With one shared buffer a sequence's cells interleave
        # with others' and its attention sums round differently from the same request alone; greedy replies then
        # differ from `edgesdk run` more often (test_serve_batching's 16-client guard fell to 7 of 16 identical in
        # 1 of 3 runs), and on the CPU nothing is gained: its curve was the same both ways (serve_curve_cpu.json).
        chunk, _why = self.prefill_budget()
        on_gpu = self._on_gpu()
        return BatchEngine(
            self._path,
            model=self._llm.model,
            slots=slots,
            max_queue=max_queue,
            prompts_per_step=None if on_gpu else 1,
            mixed_prefill=on_gpu,
            kv_unified=on_gpu,
            n_ctx=int(st["n_ctx"]),
            n_gpu_layers=int(st["n_gpu_layers"]),
            flash_attn=bool(st["flash_attn"]),
            threads=int(st["threads"]),
            n_batch=int(st["n_batch"]),
            n_ubatch=int(st["n_ubatch"]),
            prefill_chunk=chunk,
            type_k=str(rep.get("type_k") or "f16"),
            type_v=str(rep.get("type_v") or "f16"),
            reuse_prefix=reuse_prefix,
        )

    def prefill_budget(self) -> tuple[int, str]:
        """The batch engine's prompt tokens per step on this session's device, and why
        (:func:`edgesdk.runtime.batching.prefill_budget`)."""
        from edgesdk.runtime.batching import prefill_budget

        return prefill_budget(self._on_gpu(), int(self.settings["n_batch"]))

    def _on_gpu(self) -> bool:
        """Layers offloaded to a GPU by a llama.cpp build that can offload."""
        return int(self.settings["n_gpu_layers"]) != 0 and bool(self._report.get("gpu_offload_supported"))

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cache one token takes in one sequence (all layers), by the planner's arithmetic on
        the manifest's model shape (0 when a bundle's manifest does not record it)."""
        info = self._info
        if not all(info.get(k) for k in ("layers", "kv_heads", "head_dim")):
            return 0
        k, v = (str(self._report.get(t) or DEFAULT_KV_TYPE) for t in ("type_k", "type_v"))
        return (kv_bytes(info, 1, k) + kv_bytes(info, 1, v)) // 2

    def _chat_formatter(self, spec: str | None) -> tuple[Jinja2ChatFormatter, list[str]]:
        if spec in self._formatters:
            return self._formatters[spec]
        Jinja2ChatFormatter = import_llama_cpp("llama_chat_format").Jinja2ChatFormatter

        if spec is None:
            template = self._llm.metadata.get("tokenizer.chat_template")
            if not template:
                raise InputError(
                    f"{self._model} has no chat template (none in its GGUF's tokenizer.chat_template "
                    f"nor bundled at build time): pass chat_template= one of "
                    f"{', '.join(chat_template_names())} or a Jinja file (CLI: edgesdk run/serve "
                    "--chat-template NAME|FILE, or rebuild with edgesdk build --chat-template), or "
                    "use generate() with your own prompt format"
                )
            extra: list[str] = []
        else:
            _, template, extra = resolve_chat_template(spec)
        llama_cpp = import_llama_cpp()

        def piece(tok: int) -> str:
            text = llama_cpp.llama_vocab_get_text(self._vocab, tok)
            return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text or "")

        try:
            fmt = Jinja2ChatFormatter(
                template=template,
                eos_token=piece(self._eos),
                bos_token=piece(self._llm.token_bos()),
                stop_token_ids=[self._eos],
            )
        except Exception as exc:  # noqa: BLE001 - jinja syntax errors: one line
            raise InputError(
                f"chat template {spec or '(GGUF)'} is not valid Jinja ({type(exc).__name__}: {exc})"
            ) from exc
        self._formatters[spec] = (fmt, extra)
        return fmt, extra

    def _complete(self, gen: Iterable[str]) -> str:
        """A non-streaming request: the whole generation under the context lock."""
        with self._lock:
            return "".join(gen)

    def _run(
        self,
        prompt: str,
        operation: str,
        *,
        stream: bool,
        special: bool,
        max_tokens: int = 128,
        stop: list[str] | str | None = None,
        seed: int | None = None,
        add_bos: bool = True,
        _capture_messages: list[dict[str, str]] | None = None,
        logit_bias: Any = None,
        **sampling: float | None,
    ) -> Iterator[str]:
        """``prompt``: text, or a list of token ids used as given (no BOS added)."""
        if not isinstance(prompt, str) and not (
            isinstance(prompt, (list, tuple))
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise InputError(f"prompt must be a string or a non-empty list of token ids, got {type(prompt).__name__}")
        n_vocab = int(self._llm.n_vocab())
        params, max_tokens, seed, bias = sampling_options(
            sampling, max_tokens=max_tokens, seed=seed, logit_bias=logit_bias, n_vocab=n_vocab
        )
        if (
            stop is not None
            and not isinstance(stop, str)
            and not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop))
        ):
            raise InputError("stop must be a string or a list of strings")
        stops = [stop] if isinstance(stop, str) and stop else [s for s in (stop or []) if s]
        if isinstance(prompt, str):
            with self._lock:
                tokens = self._llm.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=special)
        else:
            tokens = list(prompt)
            if min(tokens) < 0 or max(tokens) >= n_vocab:
                raise ShapeError(
                    f"prompt token ids must be from 0 to {n_vocab - 1} (the vocabulary), "
                    f"got {min(tokens) if min(tokens) < 0 else max(tokens)}"
                )
            with self._lock:
                prompt = self._llm.detokenize(tokens).decode("utf-8", "replace")  # for telemetry's capture
        budget = self._check_fits(len(tokens), max_tokens)
        request = request_record(params, max_tokens, stops, seed)
        body = self._decode(
            prompt, tokens, budget, stops, params, operation, stream, request, seed, _capture_messages, bias
        )
        return self._stepwise(body) if stream else body

    def _stepwise(self, body: Generator[str, None, None]) -> Iterator[str]:
        return stepwise(body, self._lock)

    def _decode(
        self,
        prompt: str,
        tokens: list[int],
        budget: int,
        stops: list[str],
        params: Mapping[str, float],
        operation: str,
        stream: bool,
        request: dict[str, Any],
        seed: int | None,
        messages: list[dict[str, str]] | None = None,
        logit_bias: tuple[tuple[int, float], ...] = (),
    ) -> Generator[str, None, None]:
        llm = self._llm
        me = next(self._next_id)
        hold = max((len(s) for s in stops), default=1) - 1  # chars kept back while they may start a stop
        superseded = False

        def check_owner() -> None:
            nonlocal superseded
            if self._owner != me:
                superseded = True
                raise SupersededStreamError(
                    "this stream was superseded: another request on the same session used the llama.cpp "
                    "context while the stream was paused, so it cannot continue (finish or close a stream "
                    "before the next request, or load one session per concurrent stream)"
                )

        with telemetry.inference(
            operation, self._model, self.provider, stream=stream, request=request, attributes=self._attrs
        ) as rec:
            rec.set_input_tokens(len(tokens))
            rec.capture_input(prompt if messages is None else messages)  # chat: the roles, not the template
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text, emitted, n_out, finish, cut_at_stop = "", 0, 0, "length", False
            chunk, is_eog, detok = rec.chunk, self._is_eog, llm.detokenize
            self._owner = me  # from here on this request owns the context
            llm.set_seed(seed if seed is not None else self._random_seed)  # the sampler is built at first next()
            # The whole prompt is evaluated for every request (no KV reuse from the previous one): llama.cpp's
            # logits differ in the last bits between a prompt evaluated whole and a cached prefix + the rest,
            # enough to flip greedy tokens, so reuse would make a request's text depend on what ran before.
            llm.reset()
            cache = self.prompt_cache
            cached = cache.restore(llm, tokens) if cache is not None else 0
            self._perf_reset()
            t0 = perf_counter()
            t_first: float | None = None
            try:
                if budget > 0:
                    gen = llm.generate(
                        tokens,
                        top_k=int(params["top_k"]),
                        top_p=float(params["top_p"]),
                        min_p=float(params["min_p"]),
                        temp=float(params["temperature"]),
                        repeat_penalty=float(params["repeat_penalty"]),
                        frequency_penalty=float(params["frequency_penalty"]),
                        presence_penalty=float(params["presence_penalty"]),
                        logits_processor=_bias_processor(logit_bias),
                    )
                    try:
                        for tok in gen:
                            chunk()
                            if t_first is None:
                                t_first = perf_counter()
                                rec.first_chunk()
                            if is_eog(tok):
                                finish = "stop"
                                break
                            n_out += 1
                            text += decoder.decode(detok([tok]))
                            if stops:
                                cut = min(
                                    (i for i in (text.find(s, max(0, emitted - len(s))) for s in stops) if i >= 0),
                                    default=-1,
                                )
                                if cut >= 0:
                                    text, finish, cut_at_stop = text[:cut], "stop", True
                                    break
                            if n_out >= budget:
                                break
                            if stream and len(text) - hold > emitted:
                                yield text[emitted : len(text) - hold]
                                emitted = len(text) - hold
                                check_owner()  # resumed: was the context used by another request meanwhile?
                    finally:
                        gen.close()
                if not cut_at_stop:
                    text += decoder.decode(b"", final=True)
                if len(text) > emitted:
                    yield text[emitted:]
            except GeneratorExit:
                finish = "cancelled"
                raise
            except SupersededStreamError:
                finish = "error"
                raise
            finally:
                t_end = perf_counter()
                rec.set_output_tokens(n_out)
                rec.finish([finish])
                rec.capture_output(text)
                if not superseded and self._owner == me:  # else self.last holds a later request's figures
                    if cache is not None and finish in ("stop", "length", "cancelled"):
                        cache.save(llm)
                    self.last = {
                        "input_tokens": len(tokens),
                        "output_tokens": n_out,
                        "finish_reason": finish,
                        "ttft_s": round(t_first - t0, 6) if t_first else None,
                        "decode_tok_s": round((n_out - 1) / (t_end - t_first), 2)
                        if t_first and n_out > 1 and t_end > t_first
                        else None,
                        # perf_counter() instants, for callers timing tokens (not text chunks:
                        # a token may yield no text, so chunk times can lag token times).
                        "first_token_at": t_first,
                        "last_token_at": t_end if t_first else None,
                        "llama_cpp_timings": self._perf_read(),
                        "cached_tokens": cached,
                    }

    # ------------------------------------------------------------------ report / close
    def report(self) -> dict[str, Any]:
        return {**self._report, "last_request": dict(self.last)}

    def close(self) -> None:
        with self._lock:
            close_quietly(self._llm)


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"messages[{i}] must be a mapping with string 'role' and 'content'")
        if not m["role"]:
            raise InputError(f"messages[{i}]: empty role")


# ---------------------------------------------------------------------------------------------
# Loader with eager fallbacks


def _probe_in_child(path: str, ngl: int, fa: bool, n_ctx: int) -> str | None:
    """Load + first decode in a child process; None when it worked, else why (signal or last error line)."""
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgesdk.runtime.backends.llamacpp_probe",
                path,
                str(ngl),
                "1" if fa else "0",
                str(min(n_ctx, 512)),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "probe timed out after 600 s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        import signal

        with contextlib.suppress(ValueError):
            return f"crashed in a child probe ({signal.Signals(-proc.returncode).name})"
        return f"crashed in a child probe (signal {-proc.returncode})"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return f"failed in a child probe: {lines[-1][:160] if lines else 'exit ' + str(proc.returncode)}"


def _attempts(fa: bool, ngl: int) -> list[tuple[bool, int]]:
    out = [(fa, ngl)]
    if fa:
        out.append((False, ngl))
    if ngl > 1:
        out.append((False, max(1, ngl // 2)))
    if ngl != 0:
        out.append((False, 0))
    return out


def _label(fa: bool, ngl: int, layers: int) -> str:
    where = "CPU" if ngl == 0 else f"{min(ngl, layers + 1)}/{layers + 1} layers on GPU"
    return f"llama.cpp ({where}, flash attention {'on' if fa else 'off'})"


def load_gguf(bundle: Bundle, ctx: LoadContext) -> LlamaCppBackend:
    """Loader registered for format ``gguf`` (see edgesdk.runtime.backends)."""
    from edgesdk.errors import BundleIntegrityError
    from edgesdk.manifest import LLMConfig

    opts = dict(ctx.options or {})
    llama_cpp = load_llama_cpp("a GGUF bundle", verbose=bool(opts.get("verbose")))  # llama_core.py
    planned_llm = bundle.manifest.llm or LLMConfig()  # the plan's llama.cpp settings and the model shape (typed)
    info = planned_llm.model_shape()
    chat_template = opts.get("chat_template")
    if chat_template is not None:
        resolve_chat_template(chat_template)  # a bad name/file fails at load (exit 3), not at the first chat
    elif bundle.has_artifact("chat_template"):  # chosen at build time (plan decision gguf.chat_template)
        chat_template = str(bundle.artifact_path("chat_template"))
    path = str(bundle.artifact_path("model"))
    layers = planned_llm.layers
    n_ctx = int(opts.get("n_ctx") or planned_llm.n_ctx or 2048)
    profile = ctx.profile
    planned = opts.get("n_gpu_layers", planned_llm.n_gpu_layers)
    ngl = layers + 1 if planned in ("all", -1) else int(planned)
    if profile is not None and "flash_attn" not in opts:
        fa_entry = profile.kernels.get("flash_attention") or {}
        fa = bool(profile.is_gpu and fa_entry.get("supported"))
    else:
        fa = bool(opts.get("flash_attn", planned_llm.flash_attn))
    threads = opts.get("threads") or planned_llm.thread_count
    # Batch sizes and K/V cache types: the plan's (manifest llm section: n_batch, n_ubatch, type_k, type_v);
    # load options n_batch / n_ubatch override. A bundle built before these decisions has none of the keys
    # and keeps llama-cpp-python's defaults (n_batch 512, n_ubatch 512, f16 cache).
    batch: dict[str, int] = {}
    for key in ("n_batch", "n_ubatch"):
        value, where = (
            (opts[key], f"load option {key}")
            if opts.get(key) is not None
            else (planned_llm.planned(key), f"{bundle.path}: manifest extras.llm.{key}")
        )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if where.startswith("load option"):
                raise InputError(f"{where} must be a positive integer, got {value!r}")
            raise BundleIntegrityError(f"{where}: expected a positive integer, got {value!r}")
        batch[key] = value
    explicit_batch = {k for k in ("n_batch", "n_ubatch") if opts.get(k) is not None}
    kv: dict[str, int] = {}
    for key in ("type_k", "type_v"):
        name = planned_llm.planned(key)
        if name is None:
            continue
        ggml_type = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None) if isinstance(name, str) else None
        if not isinstance(ggml_type, int):
            raise BundleIntegrityError(
                f"{bundle.path}: manifest extras.llm.{key}: {name!r} is not a ggml type this llama-cpp-python knows"
            )
        kv[key] = ggml_type
    f16_kv = {int(getattr(llama_cpp, f"GGML_TYPE_{t}", -1)) for t in ("F16", "F32", "BF16")}
    notes: list[str] = []
    if ngl and not llama_cpp.llama_supports_gpu_offload():
        ctx.record_fallback(
            _label(fa, ngl, layers),
            _label(False, 0, layers),
            "this llama-cpp-python build has no GPU offload (llama_supports_gpu_offload() is "
            "false: CPU-only build or no GPU)",
        )
        ngl, fa = 0, False
    elif ngl:
        free, how = free_device_bytes()
        if free is not None and layers:
            fit = _layers_that_fit({**info, "layers": layers}, n_ctx, free)
            notes.append(f"{how}: {free / 1e9:.2f} GB -> {fit}/{layers + 1} layers fit")
            if fit < ngl:
                ctx.record_fallback(
                    _label(fa, ngl, layers),
                    _label(fa, fit, layers),
                    f"free device memory {free / 1e9:.2f} GB ({how}) holds {fit} of {layers + 1} "
                    "layers with their KV cache",
                )
                ngl = fit
        else:
            notes.append(how)
    risky = bool(opts.get("probe_in_child")) or bool(profile is not None and profile.sm in RISKY_SMS)
    errors: list[str] = []
    tried = _attempts(fa, ngl)
    for i, (a_fa, a_ngl) in enumerate(tried):
        why = _probe_in_child(path, a_ngl, a_fa, n_ctx) if risky else None
        llm = None
        a_batch, a_kv, a_notes = dict(batch), dict(kv), []
        if not a_fa and any(t not in f16_kv for t in a_kv.values()):
            # llama.cpp refuses a quantized V cache without flash attention ("V cache quantization requires
            # flash_attn"): this attempt caches f16
            a_kv = {}
            a_notes.append(
                f"{_label(a_fa, a_ngl, layers)}: K/V cache f16 instead of the planned "
                f"{planned_llm.planned('type_k')}/{planned_llm.planned('type_v')} (a quantized cache needs "
                "flash attention)"
            )
        if a_ngl == 0 and any(v > 512 and k not in explicit_batch for k, v in a_batch.items()):
            # the plan's large micro-batch is for a GPU; on the CPU it costs compute-buffer memory, no speed
            a_batch = {k: (v if k in explicit_batch else min(v, 512)) for k, v in a_batch.items()}
            a_notes.append(
                f"{_label(a_fa, a_ngl, layers)}: n_batch/n_ubatch {a_batch.get('n_batch', 512)}/"
                f"{a_batch.get('n_ubatch', 512)} on the CPU instead of the planned "
                f"{batch.get('n_batch', 512)}/{batch.get('n_ubatch', 512)}"
            )
        if why is None:
            try:
                llm = open_llama(
                    llama_cpp,
                    path,
                    n_ctx=n_ctx,
                    n_gpu_layers=a_ngl,
                    threads=threads,
                    flash_attn=a_fa,
                    **a_batch,
                    **a_kv,
                )
                llm.eval(llm.tokenize(b"Hello", add_bos=True))  # the first decode is where bad kernels fail
                llm.reset()
            except Exception as exc:  # noqa: BLE001 - llama.cpp raises ValueError/RuntimeError/OSError
                why = f"{type(exc).__name__}: {str(exc)[:160]}"
                if llm is not None:
                    close_quietly(llm)
                llm = None
        if llm is not None:
            report = {
                "runtime": f"llama-cpp-python {llama_cpp.__version__}",
                "n_gpu_layers": a_ngl,
                "layers": layers,
                "flash_attn": a_fa,
                "n_ctx": n_ctx,
                "threads": llm.n_threads,
                # what the context got (llama-cpp-python caps n_batch at n_ctx, n_ubatch at n_batch)
                "n_batch": int(llm.n_batch),
                "n_ubatch": int(llm.context_params.n_ubatch),
                "type_k": str(planned_llm.planned("type_k")) if "type_k" in a_kv else "f16",
                "type_v": str(planned_llm.planned("type_v")) if "type_v" in a_kv else "f16",
                "batch_source": "load options"
                if explicit_batch
                else "plan (manifest)"
                if batch
                else "llama-cpp-python defaults (bundle without planned batch sizes)",
                "gpu_offload_supported": bool(llama_cpp.llama_supports_gpu_offload()),
                "placement": "CPU" if a_ngl == 0 else f"{min(a_ngl, layers + 1)}/{layers + 1} layers on GPU",
                "probe": "child process first (risky platform)" if risky else "in-process",
                "attempts": errors + [f"{_label(a_fa, a_ngl, layers)}: ok"],
                "notes": notes + a_notes,
            }
            settings = {
                "n_gpu_layers": a_ngl,
                "flash_attn": a_fa,
                "n_ctx": n_ctx,
                "threads": llm.n_threads,
                "n_batch": int(llm.n_batch),
                "n_ubatch": int(llm.context_params.n_ubatch),
            }
            attrs = {
                "edgesdk.backend": "llama.cpp",
                "edgesdk.gguf.quant_type": planned_llm.quant_type,
                "edgesdk.device.profile": profile.name if profile is not None else "",
                "edgesdk.precision": bundle.precision or planned_llm.quant_type,
                "edgesdk.gguf.n_gpu_layers": a_ngl,
                "edgesdk.gguf.flash_attn": a_fa,
                "edgesdk.bundle.id": bundle.bundle_id,
            }
            return LlamaCppBackend(
                llm,
                settings=settings,
                report=report,
                model=bundle.model_name,
                attributes=attrs,
                chat_template=chat_template,
                path=path,
                llm_info=info,
            )
        assert why is not None  # set whenever the attempt did not load
        errors.append(f"{_label(a_fa, a_ngl, layers)}: {why}")
        if i + 1 < len(tried):
            ctx.record_fallback(_label(a_fa, a_ngl, layers), _label(*tried[i + 1], layers), why)
    raise BackendUnavailableError(f"llama.cpp could not load {path}: " + "; ".join(errors))
