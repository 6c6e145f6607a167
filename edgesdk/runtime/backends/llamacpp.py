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

import contextlib
import dataclasses
import subprocess
import sys
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgesdk import telemetry
from edgesdk.contracts.gguf_types import DEFAULT_KV_TYPE, kv_bytes
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.formats.gguf.chat_limits import render as render_chat
from edgesdk.host import default_threads
from edgesdk.native import import_llama_cpp
from edgesdk.runtime.backend import LoadContext, RequestStats, TensorSpec
from edgesdk.runtime.backends.llama_core import EngineFront, RecordedPieces, load_llama_cpp
from edgesdk.runtime.draft import DRAFT_K_DEFAULT
from edgesdk.runtime.options import GgufLoadOptions
from edgesdk.runtime.requests import GenerationRequest

if TYPE_CHECKING:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_types import ChatCompletionRequestMessage
    from typing_extensions import Unpack

    from edgesdk.bundle import Bundle
    from edgesdk.manifest import DraftRecord
    from edgesdk.runtime.backend import BatchingBackend, GenerationOptions, LLMBackend
    from edgesdk.runtime.batching import BatchEngine, BatchHandle, GenerationResult, Weights

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


class LlamaCppBackend(EngineFront):
    """One loaded GGUF model. ``generate``/``stream``/``chat`` go through ``telemetry.inference`` and the model's one
    :class:`~edgesdk.runtime.batching.BatchEngine`: the only code that calls ``llama_decode``.

    The engine has one slot when the session is loaded (as ``llama-server -np 1``); ``edgesdk serve`` asks for more
    (:meth:`batch_engine`), on the same weights. Requests are :class:`~edgesdk.runtime.requests.GenerationRequest`
    objects, checked once. Thread-safe: concurrent callers (threads, interleaved streams) are slots of the engine,
    or wait in its queue when every slot is busy; a stream that is closed early frees its slot at the next step.
    """

    name = "llama.cpp"
    provider = "llama.cpp"

    def __init__(
        self,
        engine: BatchEngine,
        weights: Weights,
        *,
        settings: dict[str, Any],
        report: dict[str, Any],
        model: str,
        attributes: dict[str, Any],
        chat_template: str | None = None,
        path: str = "",
        llm_info: Mapping[str, Any] | None = None,
        draft_weights: Weights | None = None,
    ) -> None:
        self._engine = engine
        self._weights = weights
        self._draft_weights = draft_weights  # the bundle's draft model (edgesdk build --draft), loaded once
        self._engine_lock = threading.Lock()  # replacing the engine (another slot count) vs. using it
        self._path = path
        self._info = dict(llm_info or {})  # the manifest's llm section: the model shape
        self.settings = settings
        self._report = report
        self._model = model
        self._attrs = attributes
        self._eos = engine.eos
        self._formatters: dict[str | None, tuple[Jinja2ChatFormatter, list[str]]] = {}
        self._tool_templates: dict[int, bool] = {}  # id(formatter) -> whether its template renders tools
        self._default_template = chat_template
        self.device = "cpu" if settings["n_gpu_layers"] == 0 else f"cuda:0 ({report['placement']})"
        # run(): token ids of any rank (flattened) -> the last position's logits.
        self.inputs: Sequence[TensorSpec] = (TensorSpec("input_ids", "int64", None),)
        self.outputs: Sequence[TensorSpec] = (TensorSpec("logits", "float32", (1, engine.n_vocab)),)
        self.last_stats: RequestStats | None = None  # the last finished request's figures

    @property
    def last(self) -> dict[str, Any]:
        """:attr:`last_stats` as a dict (``{}`` before the first request): the names ``report()["last_request"]``
        shows."""
        return self.last_stats.as_dict() if self.last_stats is not None else {}

    @property
    def context_length(self) -> int:
        """Tokens one sequence holds (the session's context, ``n_ctx``)."""
        return int(self.settings["n_ctx"])

    @property
    def engine(self) -> BatchEngine:
        return self._engine

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"text must be a string, got {type(text).__name__}")
        return self._engine.tokenize(text, add_bos=True, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._engine.detokenize(list(tokens)).decode("utf-8", "replace")

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Raw forward pass: ``{"input_ids": [...]}`` -> ``{"logits": last-position logits}`` (a slot of the
        engine, so it runs beside generation requests)."""
        raw = feeds.get("input_ids")
        if raw is None:
            raise ShapeError("llama.cpp run() takes {'input_ids': token ids}")
        ids = [int(t) for t in np.asarray(raw).reshape(-1)]
        if not ids:
            raise ShapeError("llama.cpp run() needs at least one token id")
        n_vocab = self._engine.n_vocab
        if min(ids) < 0 or max(ids) >= n_vocab:
            raise ShapeError(f"token ids must be in [0, {n_vocab}), got {min(ids)}..{max(ids)}")
        self._check_fits(len(ids))
        return {"logits": self._engine.logits(ids)[None, :]}

    def _check_fits(self, n_prompt: int) -> None:
        n_ctx = self._engine.n_ctx_seq
        if n_prompt >= n_ctx:
            raise ShapeError(
                f"prompt is {n_prompt} tokens; the context holds {n_ctx} "
                "(shorten the prompt or rebuild with a longer --context-length)"
            )

    # ------------------------------------------------------------------ generation
    def generate(
        self, prompt: str | Sequence[int], *, stream: bool = False, **options: Unpack[GenerationOptions]
    ) -> str | Iterator[str]:
        """Completion text for ``prompt`` (text, or token ids used as given); ``stream=True`` returns an iterator of
        text pieces."""
        if stream:
            return self.stream(prompt, **options)
        return "".join(self._run(prompt, "text_completion", stream=False, special=False, options=options))

    def stream(self, prompt: str | Sequence[int], **options: Unpack[GenerationOptions]) -> Iterator[str]:
        return self._run(prompt, "text_completion", stream=True, special=False, options=options)

    def _chat(
        self, messages: list[dict[str, Any]], chat_template: str | None, stream: bool, options: GenerationOptions
    ) -> Iterator[str]:
        """The reply to ``messages`` (:meth:`EngineFront.chat`), formatted with ``chat_template`` (a shipped name or a
        Jinja file), else the session's default (``load(..., chat_template=)``), else the GGUF's own
        ``tokenizer.chat_template``."""
        _check_messages(messages)
        prompt, template_stops, add_bos = self._format_chat(messages, chat_template)
        given = options.get("stop")
        if given is not None and not isinstance(given, (str, list, tuple)):
            raise InputError("stop must be a string or a list of strings")
        stop = [given] if isinstance(given, str) else list(given or [])
        stop += [s for s in template_stops if s not in stop]
        return self._run(
            prompt,
            "chat",
            stream=stream,
            special=True,
            add_bos=add_bos,
            capture=messages,
            options={**options, "stop": stop},
        )

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
            tokens = self._engine.tokenize(prompt, add_bos=add_bos, special=True)
            stops = list(request.stop) + [s for s in extra if s not in request.stop]
        else:
            assert request.prompt is not None
            tokens = self._engine.tokenize(request.prompt, add_bos=True, special=False)
            stops = list(request.stop)
        if not tokens:
            raise InputError("the prompt is empty (no tokens)")
        return dataclasses.replace(
            request, prompt=None, messages=None, prompt_tokens=tuple(tokens), stop=tuple(stops), tools=()
        )

    def batch_engine(
        self, *, slots: int, max_queue: int, reuse_prefix: bool = True, prefill_chunk: int | None = None
    ) -> BatchEngine:
        """The model's engine with ``slots`` sequences (``edgesdk serve --parallel N``): this session's own when it
        has that many slots, else a new one on the same weights (a new llama.cpp context of ``slots`` sequences,
        each as long as this session's context; the weights are not loaded again) that replaces it, once the
        old one is idle. ``generate``/``stream``/``chat``/``run`` go through whichever engine is current.
        ``prefill_chunk``: prompt tokens per step (default: the plan's ``serving.prefill_chunk``, else
        :func:`~edgesdk.runtime.batching.prefill_budget`'s)."""
        if prefill_chunk is not None and (
            isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1
        ):
            raise InputError(f"prefill_chunk must be a positive integer, got {prefill_chunk!r}")
        with self._engine_lock:
            old = self._engine
            n_batch = int(self.settings["n_batch"])
            chunk_now = min(prefill_chunk, n_batch) if prefill_chunk is not None else self.prefill_budget()[0]
            if old.slots != slots or old.closed or chunk_now != old.prefill_chunk:
                old.retire(self._model)
                self._engine = make_engine(
                    self._weights,
                    self.settings,
                    self._report,
                    slots=slots,
                    prefill_chunk=prefill_chunk,
                    draft=self._draft_weights,
                )
            self._engine.max_queue = int(max_queue)
            self._engine.reuse_prefix = bool(reuse_prefix)
            return self._engine

    def prefill_budget(self) -> tuple[int, str]:
        """The batch engine's prompt tokens per step on this session's device, and why
        (:func:`edgesdk.runtime.batching.prefill_budget`)."""
        from edgesdk.runtime.batching import prefill_budget

        return prefill_budget(self._on_gpu(), int(self.settings["n_batch"]), self.settings.get("prefill_chunk"))

    def planned_slots(self) -> tuple[int | None, str]:
        """The plan's ``serving.slots`` for this session (``edgesdk serve``'s default ``--parallel``) and where it
        came from; None where the bundle has none (built before the decision) or the load placed the model
        elsewhere than planned (a GPU plan running on the CPU), and why."""
        return self.settings.get("planned_slots"), str(self._report.get("serving_source") or "")

    def speculative_plan(self) -> tuple[str, int, str]:
        """Speculative decoding on this session: the engine's default mode, how many generating requests "auto" drafts
        for, and why (:func:`speculative_plan`)."""
        return speculative_plan(self._on_gpu(), self.settings.get("speculative"), self.settings.get("draft"))

    def _on_gpu(self) -> bool:
        """Layers offloaded to a GPU by a llama.cpp build that can offload."""
        return int(self.settings["n_gpu_layers"]) != 0 and bool(self._report.get("gpu_offload_supported"))

    @property
    def on_gpu(self) -> bool:
        """Layers offloaded to a GPU by a llama.cpp build that can offload (:class:`BatchingBackend`)."""
        return self._on_gpu()

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
            template = self._engine.meta("tokenizer.chat_template")
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
        try:
            fmt = Jinja2ChatFormatter(
                template=template,
                eos_token=self._engine.token_text(self._eos),
                bos_token=self._engine.token_text(self._engine.bos),
                stop_token_ids=[self._eos],
            )
        except Exception as exc:  # noqa: BLE001 - jinja syntax errors: one line
            raise InputError(
                f"chat template {spec or '(GGUF)'} is not valid Jinja ({type(exc).__name__}: {exc})"
            ) from exc
        self._formatters[spec] = (fmt, extra)
        return fmt, extra

    def _run(
        self,
        prompt: str | Sequence[int],
        operation: str,
        *,
        stream: bool,
        special: bool,
        options: GenerationOptions,
        add_bos: bool = True,
        capture: list[dict[str, Any]] | None = None,
    ) -> Iterator[str]:
        """``prompt``: text, or a list of token ids used as given (no BOS added). ``options``: what
        :meth:`GenerationRequest.from_options` takes (checked there, once)."""
        if not isinstance(prompt, str) and not (
            isinstance(prompt, (list, tuple))
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise InputError(f"prompt must be a string or a non-empty list of token ids, got {type(prompt).__name__}")
        engine = self._engine
        n_vocab = engine.n_vocab
        if isinstance(prompt, str):
            tokens = engine.tokenize(prompt, add_bos=add_bos, special=special)
            text = prompt
        else:
            tokens = list(prompt)
            if min(tokens) < 0 or max(tokens) >= n_vocab:
                raise ShapeError(
                    f"prompt token ids must be from 0 to {n_vocab - 1} (the vocabulary), "
                    f"got {min(tokens) if min(tokens) < 0 else max(tokens)}"
                )
            text = engine.detokenize(tokens).decode("utf-8", "replace")  # for telemetry's capture
        request = GenerationRequest.from_options(prompt_tokens=tokens, **options)
        if request.logit_bias and request.logit_bias[-1][0] >= n_vocab:
            raise InputError(
                f"logit_bias token ids must be < {n_vocab} (the vocabulary), got {request.logit_bias[-1][0]}"
            )
        self._check_fits(len(tokens))
        rec = telemetry.inference(
            operation,
            self._model,
            self.provider,
            stream=stream,
            request=request.telemetry_record(),
            attributes=self._attrs,
            attach=False,
        )
        handle = engine.submit(request)
        return self._consume(handle, rec, text if capture is None else capture)

    def _consume(self, handle: BatchHandle, rec: Any, capture: Any) -> Generator[str, None, None]:
        """The pieces of one engine request under its GenAI span; ``self.last_stats`` from its result. Closing the
        generator early cancels the request (its slot is free at the engine's next step)."""
        finish = "error"
        with rec:
            rec.set_input_tokens(len(handle.request.prompt_tokens or ()))
            rec.capture_input(capture)  # chat: the roles, not the template
            pieces = RecordedPieces(handle, rec)
            try:
                yield from pieces
            finally:
                res = pieces.result
                if res is not None:
                    finish = res.finish_reason
                    rec.set_output_tokens(len(res.tokens))
                    speculative_attributes(rec, res)
                    rec.capture_output(res.text)
                    self.last_stats = RequestStats.of_result(res)
                rec.finish([finish])

    # ------------------------------------------------------------------ report / close
    def report(self) -> dict[str, Any]:
        return {**self._report, "engine": dict(self._engine.settings), "last_request": self.last}

    def close(self) -> None:
        with self._engine_lock:
            self._engine.close()
            if self._engine.closed:  # never free the weights under a decode that did not stop
                self._weights.close()
                if self._draft_weights is not None:
                    self._draft_weights.close()


def speculative_attributes(rec: Any, res: GenerationResult) -> None:
    """Speculative decoding's figures on a request's GenAI span (when it drafted at all)."""
    if res.drafted_tokens:
        rec.set_attribute("edgesdk.speculative.drafted_tokens", res.drafted_tokens)
        rec.set_attribute("edgesdk.speculative.accepted_tokens", res.accepted_tokens)
        rec.set_attribute("edgesdk.speculative.acceptance", round(res.accepted_tokens / res.drafted_tokens, 4))
        rec.set_attribute("edgesdk.speculative.k_start", res.draft_k_start)  # adaptive k: first and last cap
        rec.set_attribute("edgesdk.speculative.k", res.draft_k)
    rec.set_attribute("edgesdk.speculative", res.speculative)


def make_engine(
    weights: Weights,
    settings: Mapping[str, Any],
    report: Mapping[str, Any],
    *,
    slots: int,
    prefill_chunk: int | None = None,
    draft: Weights | None = None,
) -> BatchEngine:
    """The engine of a loaded GGUF session on ``weights``: ``slots`` sequences, each as long as the session's context,
    with the settings the load chose (GPU layers, flash attention, threads, batch sizes, K/V types). Prompt tokens per
    step: ``prefill_chunk`` when given, else the plan's (``settings["prefill_chunk"]``, decision
    ``serving.prefill_chunk``), else :func:`~edgesdk.runtime.batching.prefill_budget`'s device default.

    On a GPU: one KV buffer for all slots, every waiting prompt eligible per step, prompt chunks in the generating
    tokens' llama_decode (BatchEngine's defaults; measured: docs/benchmarks.md "The load curve"). On the CPU: a KV
    buffer per slot and one prompt per step in a decode of its own, with the busy slots kept compact
    (BatchEngine._pick_slot). With one shared buffer a sequence's cells interleave with others' and its attention
    sums round differently from the same request alone; greedy replies then differ from a request alone more often
    (test_serve_batching's 16-client guard fell to 7 of 16 identical in 1 of 3 runs), and on the CPU nothing is
    gained: its curve was the same both ways (serve_curve_cpu.json).

    ``draft``: the bundle's draft model's weights (``edgesdk build --draft``): the engine gets a draft context on them
    (edgesdk/runtime/draft.py) with the plan's ``k``, used by ``draft`` requests and, where the plan's method is
    ``draft``, by ``auto`` ones."""
    from edgesdk.runtime.batching import BatchEngine, prefill_budget

    on_gpu = int(settings["n_gpu_layers"]) != 0 and bool(report.get("gpu_offload_supported"))
    chunk, _why = prefill_budget(
        on_gpu, int(settings["n_batch"]), prefill_chunk if prefill_chunk is not None else settings.get("prefill_chunk")
    )
    draft_rec = settings.get("draft") if draft is not None else None
    spec, spec_active, _spec_why = speculative_plan(on_gpu, settings.get("speculative"), draft_rec)
    return BatchEngine(
        weights.path,
        model=weights.model,
        slots=slots,
        prompts_per_step=None if on_gpu else 1,
        mixed_prefill=on_gpu,
        kv_unified=on_gpu,
        n_ctx=int(settings["n_ctx"]),
        n_gpu_layers=int(settings["n_gpu_layers"]),
        flash_attn=bool(settings["flash_attn"]),
        threads=settings.get("threads"),
        n_batch=int(settings["n_batch"]),
        n_ubatch=int(settings["n_ubatch"]),
        prefill_chunk=chunk,
        type_k=str(report.get("type_k") or "f16"),
        type_v=str(report.get("type_v") or "f16"),
        reuse_prefix=False,
        speculative=spec,
        spec_max_active=spec_active,
        draft_model=draft.model if draft is not None else None,
        draft_k=draft_rec.k if draft_rec is not None else DRAFT_K_DEFAULT,
        draft_auto=draft_rec is not None and draft_rec.method == "draft",
    )


SPEC_ACTIVE_GPU = 4  # "auto" drafts while at most this many requests generate on a GPU
SPEC_ACTIVE_CPU = 1  # and on the CPU (when turned on there)


def speculative_plan(on_gpu: bool, requested: str | None, draft: DraftRecord | None = None) -> tuple[str, int, str]:
    """Speculative decoding for a session (prompt lookup, or the bundle's draft model; ``--speculative``): the
    engine's default mode, the most generating requests "auto" drafts for, and why.

    ``draft``: the bundle's draft record (manifest ``extras.llm.draft``, the plan's decision ``gguf.draft``): its
    ``method`` says what "auto" drafts with (``draft``: the draft model, ``k`` tokens a step; ``lookup``: the plan
    predicted no gain from the draft model) and ``speculative="draft"`` is refused without one.

    On a GPU one user's decode is memory-bound: verifying 9 tokens reads the weights once, as one token does, so
    "auto" drafts while at most 4 requests generate (a busier step is compute-bound already) and stops for a request
    whose drafts are rarely accepted. On the CPU "off" unless asked: a verify step of 9 tokens cost about 1.5 plain
    steps with Gemma-3-270M on 2 cores, so grounded text gains (docs/benchmarks.md "Speculative decoding"), but the
    verify step's logits differ in the last bits from one token's, and greedy replies then differ from a decode
    without drafts where two tokens are nearly tied."""
    if requested not in (None, "auto", "lookup", "draft", "off"):
        raise InputError(f"speculative must be auto, lookup, draft or off, got {requested!r}")
    if requested == "draft" and draft is None:
        raise InputError(
            "speculative 'draft' needs a draft model in the bundle (edgesdk build --draft SMALL_MODEL); this one has "
            "none: use auto, lookup or off"
        )
    active = SPEC_ACTIVE_GPU if on_gpu else SPEC_ACTIVE_CPU
    auto_with = "prompt lookup"
    note = ""
    if draft is not None:
        agree = draft.agreement
        figures = f"k={draft.k}, predicted {draft.predicted_gain}x" + (
            f", {agree:.0%} greedy agreement at build" if agree is not None else ""
        )
        if draft.method == "draft":
            auto_with = f"the bundle's draft model ({figures})"
        else:
            note = f"; the bundle's draft model only for 'draft' requests (the plan kept prompt lookup: {figures})"
    if requested is not None:
        return (
            requested,
            active,
            f"{requested} (--speculative)"
            + (f"; 'auto' drafts with {auto_with}" if requested == "auto" else "")
            + note,
        )
    if on_gpu:
        return "auto", active, f"auto: {auto_with} while at most {active} requests generate (memory-bound decode){note}"
    return (
        "off",
        active,
        "off (CPU default: turn on with --speculative auto|lookup" + ("|draft)" if draft is not None else ")") + note,
    )


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
    from edgesdk.runtime.batching import Weights

    opts = GgufLoadOptions.narrow(ctx.options)  # typed: a field left None is the plan's (or the default)
    llama_cpp = load_llama_cpp("a GGUF bundle", verbose=bool(opts.verbose))  # llama_core.py
    planned_llm = bundle.manifest.llm or LLMConfig()  # the plan's llama.cpp settings and the model shape (typed)
    info = planned_llm.model_shape()
    chat_template = opts.chat_template
    draft_rec = planned_llm.draft if bundle.has_artifact("draft") else None  # edgesdk build --draft
    speculative_plan(False, opts.speculative, draft_rec)  # a bad mode fails at load (exit 3)
    if chat_template is not None:
        resolve_chat_template(chat_template)  # a bad name/file fails at load (exit 3), not at the first chat
    elif bundle.has_artifact("chat_template"):  # chosen at build time (plan decision gguf.chat_template)
        chat_template = str(bundle.artifact_path("chat_template"))
    path = str(bundle.artifact_path("model"))
    layers = planned_llm.layers
    n_ctx = int(opts.n_ctx or planned_llm.n_ctx or 2048)
    profile = ctx.profile
    planned = opts.n_gpu_layers if opts.n_gpu_layers is not None else planned_llm.n_gpu_layers
    ngl = layers + 1 if planned in ("all", -1) else int(planned)
    if profile is not None and opts.flash_attn is None:
        fa = bool(profile.is_gpu and profile.kernel("flash_attention").supported)
    else:
        fa = bool(opts.flash_attn if opts.flash_attn is not None else planned_llm.flash_attn)
    planned_threads = planned_llm.thread_count  # the profile's cores, capped by what this host gives (host.py)
    threads = opts.threads or (default_threads(planned=planned_threads) if planned_threads else None)
    # Batch sizes and K/V cache types: the plan's (manifest llm section: n_batch, n_ubatch, type_k, type_v);
    # load options n_batch / n_ubatch override. A bundle built before these decisions has none of the keys
    # and keeps llama-cpp-python's defaults (n_batch 512, n_ubatch 512, f16 cache).
    batch: dict[str, int] = {}
    given = {"n_batch": opts.n_batch, "n_ubatch": opts.n_ubatch}
    for key, option in given.items():
        value, where = (
            (option, f"load option {key}")
            if option is not None
            else (planned_llm.planned(key), f"{bundle.path}: manifest extras.llm.{key}")
        )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if where.startswith("load option"):
                raise InputError(f"{where} must be a positive integer, got {value!r}")
            raise BundleIntegrityError(f"{where}: expected a positive integer, got {value!r}")
        batch[key] = value
    explicit_batch = {k for k, v in given.items() if v is not None}
    # The plan's serving decisions (serving.slots, serving.prefill_chunk; manifest extras.llm.slots / prefill_chunk):
    # for the placement they were planned for; a bundle built before them has neither (serve's defaults).
    serving: dict[str, int] = {}
    for key in ("slots", "prefill_chunk"):
        value = planned_llm.planned(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BundleIntegrityError(
                f"{bundle.path}: manifest extras.llm.{key}: expected a positive integer, got {value!r}"
            )
        serving[key] = value
    planned_gpu = planned_llm.n_gpu_layers == "all" or (
        isinstance(planned_llm.n_gpu_layers, int) and planned_llm.n_gpu_layers != 0
    )
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
    risky = bool(opts.probe_in_child) or bool(profile is not None and profile.sm in RISKY_SMS)
    errors: list[str] = []
    draft_weights: Weights | None = None
    tried = _attempts(fa, ngl)
    for i, (a_fa, a_ngl) in enumerate(tried):
        why = _probe_in_child(path, a_ngl, a_fa, n_ctx) if risky else None
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
        engine = weights = None
        settings: dict[str, Any] = {}
        report: dict[str, Any] = {}
        if why is None:
            n_batch = min(a_batch.get("n_batch", 512), n_ctx)  # as llama-cpp-python caps them
            report = {
                "runtime": f"llama-cpp-python {llama_cpp.__version__}",
                "n_gpu_layers": a_ngl,
                "layers": layers,
                "flash_attn": a_fa,
                "n_ctx": n_ctx,
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
            }
            on_planned = bool(serving) and (a_ngl != 0) == planned_gpu
            report["serving_source"] = (
                f"the plan's serving.slots {serving['slots']} for profile {bundle.manifest.profile.name or '?'}"
                if on_planned and "slots" in serving
                else "none planned (bundle built before the serving decisions)"
                if not serving
                else f"not the plan's: planned for the {'GPU' if planned_gpu else 'CPU'}, running on the "
                f"{'GPU' if a_ngl else 'CPU'}"
            )
            settings = {
                "planned_slots": serving.get("slots") if on_planned else None,
                "prefill_chunk": serving.get("prefill_chunk") if on_planned else None,
                "n_gpu_layers": a_ngl,
                "flash_attn": a_fa,
                "n_ctx": n_ctx,
                "threads": threads,
                "n_batch": n_batch,
                "n_ubatch": min(a_batch.get("n_ubatch", 512), n_batch),
                "verbose": bool(opts.verbose),
                "speculative": opts.speculative,
                "draft": draft_rec,
            }
            try:
                weights = Weights(path, n_gpu_layers=a_ngl, verbose=settings["verbose"])
                if draft_rec is not None and draft_weights is None:  # all of the draft where the model's layers go
                    draft_weights = Weights(
                        bundle.artifact_path("draft"), n_gpu_layers=-1 if a_ngl else 0, verbose=settings["verbose"]
                    )
                engine = make_engine(weights, settings, report, slots=1, draft=draft_weights)
                engine.logits(engine.tokenize("Hello"))  # the first decode is where bad kernels fail
            except Exception as exc:  # noqa: BLE001 - llama.cpp loads and decodes fail as several types
                why = f"{type(exc).__name__}: {str(exc)[:160]}"
                if engine is not None:
                    engine.close()
                if weights is not None and (engine is None or engine.closed):
                    weights.close()
                    if draft_weights is not None:
                        draft_weights.close()
                        draft_weights = None
                engine = None
        if engine is not None and weights is not None:
            settings["threads"] = report["threads"] = engine.settings["threads"]
            report["n_batch"], report["n_ubatch"] = engine.settings["n_batch"], engine.settings["n_ubatch"]
            report["attempts"] = errors + [f"{_label(a_fa, a_ngl, layers)}: ok"]
            report["notes"] = notes + a_notes
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
                engine,
                weights,
                settings=settings,
                report=report,
                model=bundle.model_name,
                attributes=attrs,
                chat_template=chat_template,
                path=path,
                llm_info=info,
                draft_weights=draft_weights,
            )
        assert why is not None  # set whenever the attempt did not load
        errors.append(f"{_label(a_fa, a_ngl, layers)}: {why}")
        if i + 1 < len(tried):
            ctx.record_fallback(_label(a_fa, a_ngl, layers), _label(*tried[i + 1], layers), why)
    raise BackendUnavailableError(f"llama.cpp could not load {path}: " + "; ".join(errors))


if TYPE_CHECKING:  # mypy holds the backend to the contracts the session and serve ask for with isinstance

    def _contracts(backend: LlamaCppBackend) -> tuple[LLMBackend, BatchingBackend]:
        return backend, backend
