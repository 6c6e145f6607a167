# SPDX-License-Identifier: Apache-2.0
"""Continuous batching over one llama.cpp context (issue 20, part 1): the engine, not the server.

:class:`BatchEngine` owns one llama.cpp model and one context with ``n_seq_max = slots`` and one KV buffer
for them all (``kv_unified``; ``llama-server -np N`` gives each slot a buffer of its own, and llama.cpp then
splits a step into one micro-batch per run of consecutive busy slots: 2 to 4 clients in scattered slots got
no more in total than one client alone). One engine thread loops:

1. admit waiting requests into free slots, the lowest first (a bounded queue waits behind the slots);
2. build one ``llama_batch``: the last sampled token of every generating sequence (one each), then prompt
   chunks within a per-step budget of ``prefill_chunk`` tokens, shared so that a short prompt behind long
   ones is evaluated in the next step and a long one never stalls the others for more than one budget;
3. one ``llama_decode``;
4. per sequence with an output row: sample from its own sampler chain (``llama_sampler_sample`` reads
   that row, ``llama_get_logits_ith``), detokenise UTF-8-safely, check end-of-generation, stop strings
   and ``max_tokens``, hand the text to the request's own queue (a slow reader never blocks the loop);
   (``listener`` events; a server collects a step's events and hands them over at once,
   :meth:`BatchEngine.add_step_listener`);
5. a finished or cancelled sequence leaves at once: its KV cells are removed (``llama_memory_seq_rm``),
   its sampler freed, its slot free for the next request at the next step.

The interpreter lock: the engine thread shares it with the server's event loop. ``llama_decode`` and
``llama_synchronize`` release it (the loop then formats and sends the previous step's pieces while the device
computes); the microsecond calls of the host work (logits, a sampler step, a token's piece) keep it
(:func:`_holding_gil`), since every release lets the busy loop thread in and the engine waits to get it back.
Pieces and end-of-generation flags are remembered per token; a plain greedy request has no sampler at all.

The sampler chain per sequence is the one ``llama_cpp.Llama.generate`` builds (logit bias when given,
penalties (repeat, frequency, presence), then greedy at
temperature 0, else top-k, typical 1.0, top-p, min-p, temperature, dist(seed)), so a request asks the
same thing here as through :class:`~edgesdk.runtime.backends.llamacpp.LlamaCppBackend`. A request run
alone through the engine gives the same greedy tokens as ``Llama.generate``; run together with others
it can diverge after some tokens: a decode micro-batch of several sequences computes logits that differ
in the last bits from one sequence alone (measured on the CPU build: 4 of 8 short prompts diverged within
24 tokens; llama.cpp, when it splits such a batch into one micro-batch per sequence, gives identical
tokens at a tenth of the speed). tests/test_batching.py and tools/bench/bench_batching.py count the
divergences.

A request with a ``grammar`` (llama.cpp GBNF) has a grammar sampler besides its chain, used as llama.cpp's
common sampler uses it: the chain picks a token from the raw candidates, the grammar checks that one token,
and only when the grammar rejects it are all candidates masked by the grammar and the chain picks again.
The token is the one a chain starting with the grammar would pick, without checking a 262k vocabulary
against the grammar at every step (Gemma-3-270M, 2 CPU cores, a ``json_object`` grammar, greedy: 25.7 ms
per token without a grammar, 28.4 ms with it, 83.6 ms with the grammar first in the chain).

A request asking for ``logprobs`` gets, per generated token, the log-softmax of the raw logits row the
sampler reads (before logit bias, grammar, penalties or temperature: the model's own distribution) at the
chosen token, and its ``k`` most likely tokens; a request without it costs nothing extra.

A VLM's request is a :class:`MultimodalRequest`: text token ids with image chunks (:class:`PromptImage`) between
them. When a slot's prompt reaches an image, the image is evaluated in that slot on its own, before the step's
batched decode (libmtmd's ``mtmd_helper_decode_image_chunk`` on the slot's sequence id, as llama-server does),
counted against the step's prompt budget (one image per step at least); its positions are keyed by the image's hash,
so the prefix reuse keeps an image whole or not at all, and M-RoPE images take fewer positions than KV cells.

llama-cpp-python is imported only through :func:`edgesdk.native.import_llama_cpp`.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgesdk.contracts.speculative import ASSUMED_ACCEPTANCE, VERIFY_COST, best_k
from edgesdk.errors import BackendUnavailableError, EdgeSDKError, InputError, ShapeError
from edgesdk.host import default_threads
from edgesdk.native import import_llama_cpp, route_llama_logs
from edgesdk.runtime.draft import Drafter
from edgesdk.runtime.grammar_limits import big_stack_thread, compile_grammar
from edgesdk.runtime.requests import GenerationRequest

_DONE = object()  # end of a request's event queue
#: Per-slot KV buffers (``kv_unified`` off): a free slot out of the busy slots' run is taken for a prefix this long
FRAGMENT_MIN_PREFIX = 64


PREFILL_BUDGET_GPU = 512  # prompt tokens per step on a GPU
PREFILL_BUDGET_CPU = 128  # and on the CPU


def prefill_budget(on_gpu: bool, n_batch: int, planned: int | None = None) -> tuple[int, str]:
    """The engine's prompt-token budget per step for a session on a GPU or the CPU, and why (at most ``n_batch``,
    the llama_batch's size). A step costs the generating sequences their next token until its prompt chunk is
    evaluated, so the budget bounds how long a long prompt holds the others. ``planned``: the bundle's plan
    decision ``serving.prefill_chunk`` (sized from the profile's compute figures and the model), used when given;
    without one (a bundle built before the decision): on a GPU a step of 512 prompt tokens costs a few decode
    steps (the weights are read once for all of them); on the CPU a prompt token costs nearly what a generated
    one does, and 128 keeps a step near 0.2 s with a sub-billion model on 2 cores."""
    if planned is not None:
        budget = min(n_batch, planned)
        capped = f", capped at n_batch {n_batch}" if budget < planned else ""
        return budget, f"{budget} prompt tokens per step (the plan's serving.prefill_chunk {planned}{capped})"
    if on_gpu:
        budget = min(n_batch, PREFILL_BUDGET_GPU)
        why = (
            f"{budget} prompt tokens per step (GPU: a step's cost grows little with its tokens until the "
            "micro-batch fills the device; a short prompt behind a long one waits one such step)"
        )
    else:
        budget = min(n_batch, PREFILL_BUDGET_CPU)
        why = (
            f"{budget} prompt tokens per step (CPU: every prompt token costs compute, so a smaller step keeps the "
            "generating requests' tokens coming while a long prompt is evaluated)"
        )
    return budget, why


def _common_prefix(held: list[int], prompt: list[int], limit: int) -> int:
    """How many leading tokens ``held`` and ``prompt`` share, at most ``limit``."""
    n = 0
    for a, b in zip(held, prompt[:limit], strict=False):
        if a != b:
            break
        n += 1
    return n


PENALTY_LAST_N = 64  # llama_cpp.Llama's default last_n_tokens_size: the same penalty window


def _holding_gil(fn: Any) -> Any:
    """``fn`` (a llama-cpp-python foreign function) called without giving up the interpreter lock.

    ctypes releases the lock around every foreign call; the engine thread then has to win it back, and under a
    server the event loop thread usually has it: each microsecond call (a token's piece, a sampler step) can
    cost the engine up to the interpreter's switch interval (5 ms). Calls that take microseconds and never
    wait for the device go through a ``ctypes.PYFUNCTYPE`` prototype of the same address, which keeps the
    lock; ``llama_decode`` and ``llama_synchronize`` (the waits) keep releasing it. Falls back to ``fn``."""
    try:
        proto = ctypes.PYFUNCTYPE(fn.restype, *fn.argtypes)
        address = ctypes.cast(fn, ctypes.c_void_p).value
    except (AttributeError, TypeError, ctypes.ArgumentError):
        return fn
    return proto(address) if address else fn


def _with_images(tokens: list[int], request: GenerationRequest) -> tuple[list[Any], dict[int, PromptImage], int]:
    """A request's prompt one entry per position (a multimodal prompt's images as ``("img", key, j)`` entries),
    its images by first position, and the KV cells they take beyond their positions."""
    if not isinstance(request, MultimodalRequest) or not request.images:
        return tokens, {}, 0
    prompt: list[Any] = []
    images: dict[int, PromptImage] = {}
    extra, done = 0, 0
    for at, img in request.images:
        prompt += tokens[done:at]
        done = at
        images[len(prompt)] = img
        prompt += [("img", img.key, j) for j in range(img.n_pos)]
        extra += img.n_tokens - img.n_pos
    return prompt + tokens[done:], images, extra


class EngineSaturated(EdgeSDKError):
    """Every slot is busy and the queue behind them is full (or the engine is closing)."""

    exit_code = 8


class EngineClosed(EngineSaturated):
    """The engine was closed; the request did not (or will not) finish."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model's raw distribution (log-softmax of its
    logits row), its bytes, and the ``k`` most likely tokens at that step (``(token, bytes, logprob)``,
    most likely first)."""

    token: int
    text: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


@dataclass
class GenerationResult:
    """What one request produced (``BatchHandle.result()``)."""

    text: str
    tokens: list[int]
    # "stop" (end-of-generation token or stop string), "length", "cancelled", "error", "timeout" (past the
    # deadline ``submit(timeout_s=...)`` set: ``error`` says after how long)
    finish_reason: str
    prompt_tokens: int
    ttft_s: float | None
    total_s: float
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV cells a slot kept from its previous request (reuse_prefix)
    first_token_at: float | None = None  # perf_counter() instants
    finished_at: float | None = None
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when the request asked for them
    # time in the llama_decode steps this request took part in: prompt_eval_tokens/_ms (steps with its prompt
    # tokens), eval_tokens/_ms (steps with its generated tokens); a step shared with other requests counts whole
    timings: dict[str, float] = field(default_factory=dict)
    logits: np.ndarray | None = None  # BatchEngine.logits(): the last prompt position's raw logits
    drafted_tokens: int = 0  # speculative decoding: tokens drafted (prompt lookup) and verified
    accepted_tokens: int = 0  # of them, the ones the model's own sampling agreed with (emitted for free)
    speculative: str = "off"  # what this request got: "lookup", "off", or "off (<why>)"
    # adaptive k: the most tokens a step drafted for this request at its first drafted step and at its end (0: it
    # drafted nothing), the cap moved between them with the measured acceptance (BatchEngine._adapt_k)
    draft_k_start: int = 0
    draft_k: int = 0


class PromptImage(Protocol):
    """An image of a multimodal prompt, evaluated inside its request's slot (as llama-server does): ``decode`` puts
    its embeddings into the engine's context at positions from ``pos`` on sequence ``seq_id`` (libmtmd's helper:
    llama_decode calls of its own, on the engine thread, before the step's batched decode) and returns the next
    position. ``key`` identifies the image (a hash of its pixels and encoder): the prefix reuse keeps an image's
    cells only where the same key stands at the same place. ``n_pos`` positions, ``n_tokens`` KV cells (M-RoPE:
    fewer positions than tokens)."""

    key: str
    n_pos: int
    n_tokens: int

    def decode(self, ctx: Any, pos: int, seq_id: int, n_batch: int) -> int: ...


@dataclass(frozen=True)
class MultimodalRequest(GenerationRequest):
    """A :class:`GenerationRequest` whose ``prompt_tokens`` are the prompt's text and ``images`` go between them:
    ``(i, image)`` puts ``image`` before ``prompt_tokens[i]``. The prompt ends with text (the first token is
    sampled from its last position)."""

    images: tuple[tuple[int, PromptImage], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        n = len(self.prompt_tokens or ())
        at = [i for i, _ in self.images]
        if self.images and (self.prompt_tokens is None or at != sorted(at) or not 0 <= at[0] <= at[-1] < n):
            raise InputError("a prompt's images go before its text tokens, in order, and the prompt ends with text")

    @property
    def input_tokens(self) -> int:
        """The KV cells the prompt takes: its text tokens and every image's tokens."""
        return len(self.prompt_tokens or ()) + sum(img.n_tokens for _, img in self.images)


def prompt_size(request: GenerationRequest) -> int:
    """The tokens a request's prompt takes in the context (a multimodal prompt's image tokens included)."""
    if isinstance(request, MultimodalRequest):
        return request.input_tokens
    return len(request.prompt_tokens or ())


@dataclass
class _Seq:
    """Engine-side state of one request (touched by the engine thread only, after admission)."""

    handle: BatchHandle
    prompt: list[Any]  # token ids, one per position; a multimodal prompt's image positions as ("img", key, j)
    budget: int
    stops: tuple[str, ...]
    slot: int = -1
    n_fed: int = 0  # prompt tokens already in the KV cache
    pos: int = 0  # next position
    pending: int | None = None  # sampled token not yet decoded
    sampler: Any = None
    decoder: Any = None
    text: str = ""
    emitted: int = 0
    out: list[int] = field(default_factory=list)
    hold: int = 0
    kv: list[int] = field(default_factory=list)  # the tokens whose KV cells this sequence holds, in order
    argmax: bool = False  # greedy with no penalty: pick the largest logit directly
    spec: str = "off"  # speculative decoding for this request: "lookup", "auto" (the engine decides) or "off"
    spec_note: str = ""  # why it was switched off mid-request
    spec_by: str = "lookup"  # what drafted: "lookup" (prompt lookup) or "draft" (the draft model)
    drafts: list[int] = field(default_factory=list)  # this step's drafted tokens (after ``pending``)
    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0
    k: int = 0  # the most tokens a step drafts for it now (0: not drafted yet), moved by the measured acceptance
    k_start: int = 0
    k_hits: float = ASSUMED_ACCEPTANCE * 4  # decayed counts of drafted tokens accepted and of rejections (the prior:
    k_misses: float = (1 - ASSUMED_ACCEPTANCE) * 4  # the plan's assumed acceptance, worth 4 tries)
    step_accepted: int = 0  # ``accepted`` before this step's drafts were verified
    cached: int = 0
    logprobs: list[TokenLogprob] | None = None  # all of them (the request asked for logprobs)
    grammar: Any = None  # the request's grammar sampler, compiled at submit (beside the chain: _sample_grammar)
    lp_sent: int = 0  # how many of them went out with a piece
    deadline: float | None = None  # perf_counter() instant past which the request ends with "timeout"
    timeout_s: float | None = None
    want_logits: bool = False  # BatchEngine.logits(): end after the prompt with its last row of logits
    logits: np.ndarray | None = None
    prompt_s: float = 0.0  # decode time of the steps with this request's prompt tokens
    prompt_n: int = 0
    eval_s: float = 0.0  # and of the steps with its generated tokens
    eval_n: int = 0
    images: dict[int, PromptImage] = field(default_factory=dict)  # a multimodal prompt's images by first position
    extra_cells: int = 0  # KV cells its images take beyond their positions (M-RoPE)


SPEC_PROBE_STEPS = 4  # "auto": drafted steps before a request's acceptance is judged
SPEC_MIN_RATE = 0.25  # "auto": below this share of drafted tokens accepted, a request stops drafting
K_DECAY = 0.8  # adaptive k: the weight of a step's acceptance counts one step later (the last ~5 steps matter)


def lookup_draft(history: list[int], k: int, ngram_max: int = 3, ngram_min: int = 2, window: int = 8192) -> list[int]:
    """Prompt lookup: the ``k`` tokens that followed the latest earlier occurrence of the last ``n`` tokens of
    ``history`` (n from ``ngram_max`` down to ``ngram_min``; the last ``window`` tokens searched), or none. The
    drafts of input-grounded text (summaries, edits, extraction) are the input's own continuations."""
    arr = np.asarray(history[-window:], dtype=np.int64)
    size = len(arr)
    for n in range(ngram_max, ngram_min - 1, -1):
        if size <= n:
            continue
        key = arr[size - n :]
        hit = arr[: size - n] == key[0]  # start i < size - n: an occurrence before the suffix, with a next token
        for j in range(1, n):
            hit &= arr[j : size - n + j] == key[j]
        starts = np.flatnonzero(hit)
        if starts.size:
            i = int(starts[-1]) + n
            return [int(t) for t in arr[i : i + k]]
    return []


def _timings(seq: _Seq) -> dict[str, float]:
    """A request's share of the engine's decode time, as llama.cpp's own per-context counters name it."""
    out: dict[str, float] = {}
    if seq.prompt_n:
        out["prompt_eval_tokens"], out["prompt_eval_ms"] = seq.prompt_n, round(seq.prompt_s * 1e3, 3)
    if seq.eval_n:
        out["eval_tokens"], out["eval_ms"] = seq.eval_n, round(seq.eval_s * 1e3, 3)
    return out


class BatchHandle:
    """One submitted request: iterate it for text pieces (as they are generated), ``result()`` for the
    whole of it, ``cancel()`` to stop it (its slot is freed at the next step). Thread-safe."""

    def __init__(
        self,
        engine: BatchEngine,
        request: GenerationRequest,
        rid: int,
        listener: Callable[[str, Any], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self._engine = engine
        self.request = request
        self.id = rid
        self._events: queue.Queue[object] = queue.Queue()
        self._listener = listener
        self._cancel = cancel if cancel is not None else threading.Event()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.tokens: list[int] = []  # generated token ids, appended by the engine thread

    # engine side
    def _put(self, piece: str, logprobs: list[TokenLogprob] | None = None) -> None:
        if self._listener is not None:
            if logprobs:  # the tokens this piece (and any held back before it) came from
                self._listener("logprobs", logprobs)
            self._listener("chunk", piece)
        else:
            self._events.put(piece)

    def _finish(self, result: GenerationResult) -> None:
        self._result = result
        self._done.set()
        self._events.put(_DONE)
        if self._listener is not None:
            self._listener("done", result)

    # caller side
    def cancel(self) -> None:
        self._cancel.set()
        self._engine._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def __iter__(self) -> Iterator[str]:
        while True:
            item = self._events.get()
            if item is _DONE:
                self._events.put(_DONE)  # a second iteration ends at once
                res = self._result
                if res is not None and res.finish_reason == "timeout":
                    raise TimeoutError(res.error or "the request ran past its deadline")
                if res is not None and res.finish_reason == "error":
                    raise (
                        EngineClosed(res.error or "generation failed")
                        if self._engine.closed
                        else RuntimeError(res.error or "generation failed")
                    )
                return
            assert isinstance(item, str)
            yield item

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        assert self._result is not None
        return self._result


def _llama_cpp(verbose: bool) -> Any:
    """llama-cpp-python, its logs routed by :func:`~edgesdk.native.route_llama_logs`; BackendUnavailableError when
    it does not load (Weights and BatchEngine)."""
    try:
        ll = import_llama_cpp()
    except (ImportError, OSError) as exc:
        raise BackendUnavailableError(f"llama-cpp-python does not load: {exc}") from exc
    route_llama_logs(verbose)
    return ll


class Weights:
    """A GGUF model's weights loaded once by llama.cpp (``llama_model_load_from_file``, memory-mapped), on the
    GPU up to ``n_gpu_layers`` layers (-1: all). Engines borrow them (``BatchEngine(model=weights.model)``): a new
    engine for another slot count makes a new context, never a second copy of the weights. ``close()`` frees
    them; the borrowing engines must be closed first."""

    def __init__(
        self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0, verbose: bool = False, use_mmap: bool = True
    ) -> None:
        ll = self._ll = _llama_cpp(verbose)
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise InputError(f"model file {self.path} does not exist")
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 0x7FFFFFFF
        mparams.use_mmap = bool(use_mmap)
        self.model = ll.llama_model_load_from_file(self.path.encode("utf-8"), mparams)
        if not self.model:
            raise BackendUnavailableError(f"llama.cpp could not load {self.path}")

    def close(self) -> None:
        if self.model:
            with contextlib.suppress(Exception):
                self._ll.llama_model_free(self.model)
            self.model = None


class BatchEngine:
    """Continuous batching of generation requests over one llama.cpp context.

    ``slots`` sequences decode together; up to ``max_queue`` more wait (``submit`` raises
    :class:`EngineSaturated` beyond that). ``n_ctx`` is the context of each slot (the KV cache holds
    ``slots × n_ctx`` cells). ``n_gpu_layers`` and ``flash_attn`` go to llama.cpp as given (CUDA builds);
    ``threads`` for decode and prompt. ``prefill_chunk`` is a step's budget of prompt tokens (shared out by
    :meth:`_prefill_plan`) and ``prompts_per_step`` the prompts evaluated in one step (default: every slot's).
    ``kv_unified`` (default on): one KV buffer for all slots, so a step is one llama.cpp micro-batch whichever
    slots are busy, and a prefix one slot holds is shared with another without a copy; each slot still holds
    at most ``n_ctx`` tokens, so the buffer is never over-committed. ``mixed_prefill`` (default: as
    ``kv_unified``): prompt chunks in the generating tokens' ``llama_decode``."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        slots: int = 4,
        n_ctx: int = 2048,
        n_gpu_layers: int = 0,
        flash_attn: bool = False,
        threads: int | None = None,
        n_batch: int = 512,
        n_ubatch: int = 512,
        prefill_chunk: int = 512,
        prompts_per_step: int | None = None,
        mixed_prefill: bool | None = None,
        max_queue: int = 64,
        kv_unified: bool = True,
        type_k: str | None = None,
        type_v: str | None = None,
        reuse_prefix: bool = False,
        speculative: str = "off",
        draft_max: int = 8,
        spec_max_active: int = 2,
        model: Any = None,
        verbose: bool = False,
        draft_model: Any = None,
        draft_k: int = 4,
        draft_auto: bool = True,
        adaptive_k: bool = True,
    ) -> None:
        for name, value, lo in (
            ("slots", slots, 1),
            ("n_ctx", n_ctx, 16),
            ("n_batch", n_batch, 1),
            ("n_ubatch", n_ubatch, 1),
            ("prefill_chunk", prefill_chunk, 1),
            ("prompts_per_step", slots if prompts_per_step is None else prompts_per_step, 1),
            ("max_queue", max_queue, 0),
            ("n_gpu_layers", n_gpu_layers, -1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise InputError(f"{name} must be an integer >= {lo}, got {value!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(f"threads must be a positive integer, got {threads!r}")
        ll = self._ll = _llama_cpp(verbose)
        self.slots = slots
        self.max_queue = max_queue
        self.prefill_chunk = min(prefill_chunk, n_batch)
        self.prompts_per_step = slots if prompts_per_step is None else prompts_per_step
        self.kv_unified = bool(kv_unified)
        # one KV buffer: a step's tokens are one micro-batch whatever their sequences, so prompt chunks ride in the
        # generating tokens' llama_decode; per-slot buffers split such a batch by sequence (see _step)
        self.mixed_prefill = self.kv_unified if mixed_prefill is None else bool(mixed_prefill)
        self.n_batch = max(n_batch, slots)  # room for one token per slot at least
        self.reuse_prefix = bool(reuse_prefix)
        if speculative not in ("auto", "lookup", "off", "draft"):
            raise InputError(f"speculative must be auto, lookup, draft or off, got {speculative!r}")
        if speculative == "draft" and draft_model is None:
            raise InputError("speculative 'draft' needs a draft model (draft_model=, a bundle built with --draft)")
        for name, value in (("draft_max", draft_max), ("spec_max_active", spec_max_active)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{name} must be an integer >= 0, got {value!r}")
        # the default of requests that do not say (GenerationRequest.speculative); a session's engine gets the
        # planner's (runtime/backends/llamacpp.speculative_plan: auto on a GPU, off on the CPU)
        self.speculative = speculative
        self.draft_max = draft_max  # drafted tokens per step at most
        self.spec_max_active = spec_max_active  # "auto": draft only while at most this many requests generate
        # each request's k follows its measured acceptance (_adapt_k), else it stays at the start: draft_max for
        # prompt lookup, the plan's k for the draft model
        self.adaptive_k = bool(adaptive_k)
        threads = threads or default_threads()  # OMP_NUM_THREADS, else half the usable CPUs (host.default_threads)
        kv_types = {}
        for name, kv in (("type_k", type_k), ("type_v", type_v)):
            if kv is not None:
                code = getattr(ll, f"GGML_TYPE_{str(kv).upper()}", None)
                if not isinstance(code, int):
                    raise InputError(f"{name} must be a ggml type name such as f16 or q8_0, got {kv!r}")
                kv_types[name] = code

        path = os.fspath(model_path)
        # ``model``: a llama_model the caller already loaded (:class:`Weights`), borrowed: this engine creates
        # its own context on it and never frees it, so the weights are in memory once.
        self._own_weights = Weights(path, n_gpu_layers=n_gpu_layers, verbose=verbose) if model is None else None
        self._model = self._own_weights.model if self._own_weights is not None else model
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx * slots
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = min(n_ubatch, self.n_batch)
        cparams.n_seq_max = slots
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.kv_unified = kv_unified
        cparams.no_perf = True
        for name, code in kv_types.items():
            setattr(cparams, name, code)
        self._ctx = ll.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            if self._own_weights is not None:
                self._own_weights.close()
            raise BackendUnavailableError(
                f"llama.cpp could not create a context with {slots} sequences x {n_ctx} tokens for {path}"
            )
        self._mem = ll.llama_get_memory(self._ctx)
        # the short calls of the engine thread's host work, which keep the interpreter lock (_holding_gil)
        self._get_logits = _holding_gil(ll.llama_get_logits)
        self._sampler_sample = _holding_gil(ll.llama_sampler_sample)
        self._token_to_piece = _holding_gil(ll.llama_token_to_piece)
        self._vocab_is_eog = _holding_gil(ll.llama_vocab_is_eog)
        self._n_swa = int(ll.llama_model_n_swa(self._model)) if hasattr(ll, "llama_model_n_swa") else 0
        # a slot holds at most n_ctx tokens, in a unified buffer too (llama.cpp's per-sequence limit there is the
        # whole buffer): slots x n_ctx cells are never over-committed, whatever the slots hold
        self.n_ctx_seq = min(n_ctx, int(ll.llama_n_ctx_seq(self._ctx))) if hasattr(ll, "llama_n_ctx_seq") else n_ctx
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self._bos = int(ll.llama_vocab_bos(self._vocab))
        self.bos = self._bos
        self.eos = int(ll.llama_vocab_eos(self._vocab))
        self._random_seed = int(ll.LLAMA_DEFAULT_SEED)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        # a draft model's context (edgesdk/runtime/draft.py): one sequence per slot, on the draft's own weights
        self._drafter: Drafter | None = None
        if draft_model is not None:
            self._drafter = Drafter(
                draft_model, slots=slots, n_ctx=self.n_ctx_seq, n_vocab=self.n_vocab, k=draft_k, auto=draft_auto,
                threads=threads, n_batch=self.n_batch,
            )  # fmt: skip
        # the cost model of the plan's gguf.draft decision (contracts/speculative.best_k) for adaptive k: a verify
        # step's cost per drafted token on this placement, and a draft-model step's cost (its weights over the
        # model's; prompt lookup costs no model step)
        on_gpu = n_gpu_layers != 0 and bool(ll.llama_supports_gpu_offload())
        self._verify_cost = VERIFY_COST["gpu" if on_gpu else "cpu"]
        self._draft_cost = (
            float(ll.llama_model_size(draft_model)) / max(float(ll.llama_model_size(self._model)), 1.0)
            if draft_model is not None
            else 0.0
        )
        self.settings = {
            "slots": slots,
            "n_ctx_per_slot": self.n_ctx_seq,
            "n_gpu_layers": n_gpu_layers,
            "flash_attn": flash_attn,
            "threads": threads,
            "n_batch": self.n_batch,
            "n_ubatch": int(cparams.n_ubatch),
            "prefill_chunk": self.prefill_chunk,
            "prompts_per_step": self.prompts_per_step,
            "mixed_prefill": self.mixed_prefill,
            "kv_unified": kv_unified,
            "type_k": type_k or "f16",
            "type_v": type_v or "f16",
            "reuse_prefix": self.reuse_prefix,
            "speculative": speculative,
            "draft_max": draft_max,
            "spec_max_active": spec_max_active,
            "draft_k": draft_k if draft_model is not None else None,
            "draft_auto": bool(draft_auto) if draft_model is not None else None,
            "adaptive_k": self.adaptive_k,
        }
        self._pieces: dict[int, bytes] = {}  # token -> bytes (piece), filled as tokens are generated
        self._eog: dict[int, bool] = {}  # token -> end of generation
        self._cand: Any = None  # the candidates buffer of grammar sampling (n_vocab llama_token_data)
        self._short_run = 0  # one prompt per step: steps in a row given to a shorter prompt (_prefill_plan)

        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._free = list(range(slots - 1, -1, -1))
        self._slot_kv: list[list[int]] = [[] for _ in range(slots)]  # what each free slot's KV cells hold
        self._closing = False
        self._users = 0  # threads inside submit()/tokenize(), using the model outside the engine thread
        self.closed = False
        self._ids = itertools.count(1)
        self._step_listeners: list[Callable[[], None]] = []
        # decode_s: time in llama_decode (and the logits' transfer); host_s: sampling, detokenising and
        # handing pieces on, per step, for all sequences: what the engine adds around llama.cpp
        self.stats = {
            "steps": 0,
            "decoded_tokens": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "max_active": 0,
            "drafted_tokens": 0,
            "accepted_tokens": 0,
            "decode_s": 0.0,
            "host_s": 0.0,
        }
        # grammar samplers run on this thread: the compile thread's stack (grammar_limits)
        self._thread = big_stack_thread(self._loop, "edgesdk-batch-engine")

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        with self._using():
            return self._tokenize(text, add_bos=add_bos, special=special)

    def _tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n = len(data) + 2
        while True:
            buf = (self._ll.llama_token * n)()
            got = self._ll.llama_tokenize(self._vocab, data, len(data), buf, n, add_bos, special)
            if got >= 0:
                return list(buf[:got])
            n = -got

    def piece(self, token: int, special: bool = False) -> bytes:
        """A token's bytes (``llama_token_to_piece``), remembered: the engine thread asks for every generated
        token's piece, and each foreign call gives up the interpreter lock to whichever thread wants it (the
        server's event loop), so a call saved is a wait saved under load."""
        if not special:
            got = self._pieces.get(token)
            if got is not None:
                return got
        size = 64
        while True:
            buf = (ctypes.c_char * size)()
            n = self._token_to_piece(self._vocab, token, buf, size, 0, special)
            if n >= 0:
                out = buf.raw[:n]
                if not special:
                    self._pieces[token] = out
                return out
            size = -n

    def _is_eog(self, token: int) -> bool:
        """``llama_vocab_is_eog``, remembered per token (as :meth:`piece`)."""
        got = self._eog.get(token)
        if got is None:
            got = self._eog[token] = bool(self._vocab_is_eog(self._vocab, token))
        return got

    def detokenize(self, tokens: list[int]) -> bytes:
        """The bytes of ``tokens`` (their pieces, special tokens rendered as empty)."""
        return b"".join(self.piece(t) for t in tokens)

    def token_text(self, token: int) -> str:
        """A token's text as the vocabulary holds it (``llama_vocab_get_text``: ``<eos>``, ``<|im_end|>``)."""
        text = self._ll.llama_vocab_get_text(self._vocab, token)
        return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text or "")

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (``tokenizer.chat_template``, ``general.name``), None when absent."""
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(self._ll.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, size))
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def logits(self, tokens: list[int], timeout_s: float | None = None) -> np.ndarray:
        """The raw logits of the last position after evaluating ``tokens`` (a copy), computed in a slot like
        any request's prompt: a forward pass for callers that score text (``Session.run``), and the first
        decode a loader makes to find out whether the device's kernels work."""
        request = GenerationRequest(prompt_tokens=tuple(tokens), max_tokens=1, temperature=0.0)
        with self._using():
            handle = self._submit(request, None, None, timeout_s, want_logits=True)
        res = handle.result()
        if res.finish_reason == "timeout":
            raise TimeoutError(res.error or "the forward pass ran past its deadline")
        if res.logits is None:
            raise (EngineClosed if self.closed or self._closing else RuntimeError)(res.error or "no logits")
        return res.logits

    # ------------------------------------------------------------------ submit / cancel / close
    def submit(
        self,
        request: GenerationRequest | None = None,
        /,
        *,
        listener: Callable[[str, Any], None] | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
        **options: Any,
    ) -> BatchHandle:
        """Queue one request (a :class:`GenerationRequest`, or its fields as keywords) and return its
        handle at once. Raises InputError/ShapeError for a bad request, EngineSaturated when full.

        ``listener(kind, value)``, when given, is called on the engine thread instead of queueing the
        handle's events: ``("chunk", text)`` per piece (preceded by ``("logprobs", [TokenLogprob, ...])``
        for the tokens behind it when the request asks for logprobs), then ``("done", GenerationResult)``;
        it must not
        block (the server hands them to its event loop). ``cancel``: an event whose setting cancels the
        request (checked at every step), instead of the handle's own. ``timeout_s``: a wall-clock limit from
        submission (queueing included); a request still waiting or generating past it ends at the next step
        with finish reason ``"timeout"`` (what it generated stays in the result; iterating the handle raises
        ``TimeoutError``)."""
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf")
        ):
            raise InputError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if request is None:
            request = GenerationRequest.from_options(**options)
        elif options:
            raise InputError("pass a GenerationRequest or keyword options, not both")
        if not isinstance(request, GenerationRequest):
            raise InputError(f"submit() takes a GenerationRequest, got {type(request).__name__}")
        with self._using():  # the model stays loaded while this thread tokenizes
            return self._submit(request, listener, cancel, timeout_s)

    @contextlib.contextmanager
    def _using(self) -> Iterator[None]:
        with self._cv:
            if self._closing:
                raise EngineClosed("the batch engine is closing")
            self._users += 1
        try:
            yield
        finally:
            with self._cv:
                self._users -= 1
                self._cv.notify_all()

    def _submit(
        self,
        request: GenerationRequest,
        listener: Callable[[str, Any], None] | None = None,
        cancel: threading.Event | None = None,
        timeout_s: float | None = None,
        want_logits: bool = False,
    ) -> BatchHandle:
        stops = request.stop
        if request.speculative == "draft" and self._drafter is None:
            raise InputError(
                "speculative 'draft' needs a draft model in the bundle (edgesdk build --draft SMALL_MODEL); this one "
                "has none: use 'lookup', 'auto' or 'off'"
            )
        if request.logit_bias and request.logit_bias[-1][0] >= self.n_vocab:
            raise InputError(
                f"logit_bias token ids must be < {self.n_vocab} (the vocabulary), got {request.logit_bias[-1][0]}"
            )
        if request.prompt_tokens is not None:
            tokens = list(request.prompt_tokens)
            if max(tokens) >= self.n_vocab:
                raise ShapeError(f"prompt_tokens must be < {self.n_vocab} (the vocabulary), got {max(tokens)}")
        elif request.messages is not None:
            raise InputError(
                "the engine takes a prompt or prompt token ids: a chat is formatted by the backend first "
                "(LlamaCppBackend.encode, with the session's chat template)"
            )
        else:
            assert request.prompt is not None
            tokens = self._tokenize(request.prompt)
        if not tokens:
            raise InputError("the prompt is empty (no tokens)")
        prompt, images, extra = _with_images(tokens, request)
        if len(prompt) + extra >= self.n_ctx_seq:
            raise ShapeError(
                f"prompt is {len(prompt) + extra} tokens{' (images included)' if images else ''}; a slot's "
                f"context holds {self.n_ctx_seq}"
            )
        budget = min(request.max_tokens, self.n_ctx_seq - len(prompt) - extra)
        grammar = None
        if request.grammar is not None:  # compiled here, on the caller's thread: a bad one is refused at submit
            grammar = compile_grammar(self._ll, self._vocab, request.grammar)  # bounded, on a big stack
        with self._cv:
            if self._closing or len(self._waiting) >= self.max_queue + len(self._free):
                if grammar:
                    self._ll.llama_sampler_free(grammar)
                if self._closing:
                    raise EngineClosed("the batch engine is closing")
                raise EngineSaturated(
                    f"all {self.slots} slots are busy and {len(self._waiting)} requests wait (limit {self.max_queue})"
                )
            handle = BatchHandle(self, request, next(self._ids), listener, cancel)
            seq = _Seq(
                handle, prompt, budget, stops, hold=max((len(s) for s in stops), default=1) - 1, grammar=grammar
            )  # freed by _end, however the request ends
            seq.images, seq.extra_cells = images, extra
            if timeout_s is not None:
                seq.timeout_s, seq.deadline = float(timeout_s), handle.submitted + float(timeout_s)
            seq.want_logits = want_logits
            self._waiting.append(seq)
            self._cv.notify()
        return handle

    def generate(self, request: GenerationRequest | None = None, /, **options: Any) -> GenerationResult:
        """Submit and wait for the whole result."""
        return self.submit(request, **options).result()

    @property
    def depth(self) -> int:
        """Requests waiting or running."""
        with self._cv:
            return len(self._waiting) + len(self._active)

    @property
    def busy(self) -> int:
        """Slots holding a request now."""
        with self._cv:
            return len(self._active)

    def add_step_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` on the engine thread after every step (and after requests end outside a step), once
        the step's ``listener`` events are all out: a server hands a whole step's pieces to its event loop at
        once instead of one wake-up per token. ``fn`` must not block or raise."""
        self._step_listeners.append(fn)

    def _stepped(self) -> None:
        for fn in self._step_listeners:
            fn()

    def forget_prefixes(self) -> None:
        """Lend no free slot's cells to the next requests (they are evaluated whole: a benchmark's cold rounds)."""
        with self._cv:
            for slot in self._free:
                self._slot_kv[slot] = []

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests, cancel running and waiting ones, stop the thread, free llama.cpp memory."""
        with self._cv:
            if self.closed:
                return
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # a decode step longer than the timeout: never free under it
            return
        with self._cv:  # callers still tokenizing in submit()
            if not self._cv.wait_for(lambda: self._users == 0, timeout_s):
                return
        ll = self._ll
        with contextlib.suppress(Exception):
            ll.llama_batch_free(self._batch)
        with contextlib.suppress(Exception):
            ll.llama_free(self._ctx)
        if self._drafter is not None:
            self._drafter.close()
        if self._own_weights is not None:
            self._own_weights.close()
        self.closed = True

    def retire(self, model: str) -> None:
        """Close this engine for one that replaces it (another slot count): InputError while it holds requests
        (``model`` names it), BackendUnavailableError when it did not stop."""
        if self.depth:
            raise InputError(
                f"the engine of {model} is busy ({self.depth} requests): its slot count can change "
                "only while it is idle"
            )
        self.close()
        if not self.closed:
            raise BackendUnavailableError(f"the engine of {model} did not stop; not replacing it")

    def __enter__(self) -> BatchEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the engine thread
    def _new_sampler(self, r: GenerationRequest) -> Any:
        ll = self._ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        add = ll.llama_sampler_chain_add
        if r.logit_bias:  # first, as llama.cpp's common sampler places it
            biases = (ll.llama_logit_bias * len(r.logit_bias))()
            for i, (tok, bias) in enumerate(r.logit_bias):
                biases[i].token, biases[i].bias = tok, bias
            add(chain, ll.llama_sampler_init_logit_bias(self.n_vocab, len(r.logit_bias), biases))
        add(
            chain,
            ll.llama_sampler_init_penalties(
                self.n_vocab, PENALTY_LAST_N, r.repeat_penalty, r.frequency_penalty, r.presence_penalty
            ),
        )
        if r.temperature == 0:
            add(chain, ll.llama_sampler_init_greedy())
        else:
            add(chain, ll.llama_sampler_init_top_k(r.top_k))
            add(chain, ll.llama_sampler_init_typical(1.0, 1))
            add(chain, ll.llama_sampler_init_top_p(r.top_p, 1))
            add(chain, ll.llama_sampler_init_min_p(r.min_p, 1))
            add(chain, ll.llama_sampler_init_temp(r.temperature))
            add(chain, ll.llama_sampler_init_dist(r.seed if r.seed is not None else self._random_seed))
        return chain

    def _admit(self) -> None:
        while self._free and self._waiting:
            seq = self._waiting.popleft()
            if seq.handle.cancelled:
                self._end(seq, "cancelled")
                continue
            req = seq.handle.request
            seq.argmax = req.plain_greedy  # greedy, penalties neutral, no logit bias, no grammar
            off = seq.want_logits or self.draft_max == 0 or seq.images  # (prompt lookup reads token ids only)
            seq.spec = "off" if off else (req.speculative or self.speculative)
            # a plain greedy request never asks a sampler (its token is the row's argmax): none is made
            seq.sampler = None if seq.argmax else self._new_sampler(req)
            seq.slot, keep = self._pick_slot(seq.prompt)
            # an image is kept whole or not at all: a prefix ending inside one ends where it starts
            keep = next((at for at, img in seq.images.items() if at < keep < at + img.n_pos), keep)
            seq.logprobs = [] if req.logprobs is not None else None
            seq.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            if keep and self._n_swa > 0:
                # a sliding-window cache keeps only the last n_swa positions: reuse needs the window before
                # ``keep`` still there (llama-server makes the same check)
                if int(self._ll.llama_memory_seq_pos_min(self._mem, seq.slot)) > max(0, keep - self._n_swa):
                    keep = 0
            if keep and not self._ll.llama_memory_seq_rm(self._mem, seq.slot, keep, -1):
                keep = 0  # this cache cannot drop a tail
            if not keep:
                self._ll.llama_memory_seq_rm(self._mem, seq.slot, -1, -1)  # a fresh slot: nothing of before
            self._slot_kv[seq.slot] = []
            seq.n_fed = seq.pos = keep
            seq.cached = keep + sum(img.n_tokens - img.n_pos for at, img in seq.images.items() if at < keep)
            seq.kv = seq.prompt[:keep]
            self._active.append(seq)
        self.stats["max_active"] = max(self.stats["max_active"], len(self._active))

    def _pick_slot(self, prompt: list[int]) -> tuple[int, int]:
        """A free slot and how many leading prompt tokens its KV cells already hold (at least the last prompt
        token is evaluated again, for its logits).

        Always the lowest free slot, so the busy slots stay a compact run of sequence ids. With ``reuse_prefix``
        the free slot whose last request shares the longest prefix with ``prompt`` lends it: in a unified KV
        buffer its cells are shared with the new slot (``llama_memory_seq_cp``: no copy, the cells gain a
        sequence id); with per-slot buffers that slot is taken itself when the prefix is at least
        :data:`FRAGMENT_MIN_PREFIX` tokens (llama.cpp splits a step into one micro-batch per run of consecutive
        busy slots, so a scattered set of slots costs a whole step per run: 2 clients in slots 0 and 5 decoded
        43.0 tok/s, in slots 0 and 1 71.2, Gemma-3-270M on 2 CPU cores)."""
        slot = min(self._free)
        keep, lender = 0, slot
        if self.reuse_prefix:
            for free in sorted(self._free):
                n = _common_prefix(self._slot_kv[free], prompt, len(prompt) - 1)
                if n > keep:
                    keep, lender = n, free
        if lender != slot:
            if self.kv_unified:
                self._ll.llama_memory_seq_rm(self._mem, slot, -1, -1)
                self._ll.llama_memory_seq_cp(self._mem, lender, slot, 0, keep)
                self._slot_kv[slot] = self._slot_kv[lender][:keep]
            elif keep >= FRAGMENT_MIN_PREFIX:
                slot = lender
            else:
                keep = _common_prefix(self._slot_kv[slot], prompt, len(prompt) - 1)
        self._free.remove(slot)
        return slot, keep

    def _end(self, seq: _Seq, finish: str, error: str | None = None) -> None:
        """Release a sequence's slot, KV cells (kept for the next request with ``reuse_prefix``) and
        sampler; finish its handle."""
        with self._cv:
            if seq.slot >= 0:
                if self.reuse_prefix and finish != "error":
                    self._slot_kv[seq.slot] = list(seq.kv)
                else:
                    self._ll.llama_memory_seq_rm(self._mem, seq.slot, -1, -1)
                    self._slot_kv[seq.slot] = []
                self._free.append(seq.slot)
                seq.slot = -1
            if seq.sampler is not None:
                self._ll.llama_sampler_free(seq.sampler)
                seq.sampler = None
            if seq.grammar:
                self._ll.llama_sampler_free(seq.grammar)
            seq.grammar = None
            if seq in self._active:
                self._active.remove(seq)
        h = seq.handle
        if len(seq.text) > seq.emitted and finish in ("stop", "length"):
            h._put(seq.text[seq.emitted :], self._unsent(seq))
            seq.emitted = len(seq.text)
        now = time.perf_counter()
        h._finish(
            GenerationResult(
                text=seq.text,
                tokens=list(seq.out),
                finish_reason=finish,
                prompt_tokens=len(seq.prompt) + seq.extra_cells,
                ttft_s=(h.first_token_at - h.submitted) if h.first_token_at else None,
                total_s=now - h.submitted,
                error=error,
                cached_tokens=seq.cached,
                drafted_tokens=seq.drafted,
                accepted_tokens=seq.accepted,
                draft_k_start=seq.k_start if seq.drafted else 0,
                draft_k=seq.k if seq.drafted else 0,
                speculative=(seq.spec_by if seq.drafted else seq.spec)
                + (f" ({seq.spec_note})" if seq.spec_note else ""),
                first_token_at=h.first_token_at,
                finished_at=now,
                logprobs=seq.logprobs,
                timings=_timings(seq),
                logits=seq.logits,
            )
        )

    @staticmethod
    def _unsent(seq: _Seq) -> list[TokenLogprob] | None:
        if not seq.logprobs or seq.lp_sent >= len(seq.logprobs):
            return None
        out = seq.logprobs[seq.lp_sent :]
        seq.lp_sent = len(seq.logprobs)
        return out

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._closing and not self._active and not self._waiting:
                        self._cv.wait()
                    if self._closing:
                        break
                    self._expire()  # (the condition's lock is re-entrant: _end takes it again)
                    self._admit()
                for seq in [s for s in self._active if s.handle.cancelled]:
                    self._end(seq, "cancelled")
                if self._active:
                    self._step()
                self._stepped()
        except BaseException as exc:  # noqa: BLE001 - a failed step fails every request, never hangs them
            with self._cv:
                self._closing = True
                for seq in list(self._active):
                    self._end(seq, "error", f"batch engine step failed: {type(exc).__name__}: {exc}")
        with self._cv:
            for seq in list(self._active):
                self._end(seq, "error", "the batch engine was closed")
            while self._waiting:
                self._end(self._waiting.popleft(), "error", "the batch engine was closed")
        self._stepped()

    def _expire(self) -> None:
        """End every request, waiting or in a slot, that is past its deadline (``submit(timeout_s=...)``)."""
        now = time.perf_counter()
        with self._cv:
            late = [s for s in self._waiting if s.deadline is not None and now > s.deadline]
            for seq in late:
                self._waiting.remove(seq)
        late += [s for s in self._active if s.deadline is not None and now > s.deadline]
        for seq in late:
            where = "waiting for a slot" if seq.slot < 0 else f"after {len(seq.out)} generated tokens"
            self._end(seq, "timeout", f"the request ran past its limit of {seq.timeout_s:g} s ({where})")

    def _step(self) -> None:
        """One step: the next token of every generating sequence, and prompt chunks of admitted ones.

        Which prompt tokens: :meth:`_prefill_plan`, within ``prefill_chunk`` tokens. With one KV buffer
        (``kv_unified``, the default) llama.cpp takes the step's tokens in order into micro-batches of
        ``n_ubatch``, whatever their sequences, and prompt chunks ride in the generating tokens' decode
        (``mixed_prefill``). With per-slot buffers it splits a batch into micro-batches of consecutive
        sequence ids with as many tokens each (8 sequences x 24 tokens out of order took 94 s instead of
        9.5 s on 2 CPU cores): the generating tokens go in slot order and, with ``mixed_prefill`` off, prompt
        chunks are a second ``llama_decode``."""
        generating = [s for s in sorted(self._active, key=lambda q: q.slot) if s.pending is not None]
        gen: list[tuple[int, int, _Seq, bool]] = []
        few = len(generating) <= self.spec_max_active  # "auto" drafts only while few requests generate
        spare = self.n_batch - len(generating)  # the batch's room for drafted tokens
        for seq in generating:
            assert seq.pending is not None
            gen.append((seq.pending, seq.pos, seq, True))
            seq.drafts = self._draft(seq, few, spare) if seq.spec != "off" else []
            spare -= len(seq.drafts)
            seq.step_accepted = seq.accepted
            seq.drafted += len(seq.drafts)  # counted here: the request may end while they are verified
            self.stats["drafted_tokens"] += len(seq.drafts)
            gen += [(tok, seq.pos + 1 + i, seq, True) for i, tok in enumerate(seq.drafts)]
        fill: list[tuple[int, int, _Seq, bool]] = []
        room = min(self.prefill_chunk, self.n_batch - (len(gen) if self.mixed_prefill else 0))
        room -= self._decode_images(room)
        for seq, take in self._prefill_plan(room):
            end = len(seq.prompt)
            fill += [(seq.prompt[i], i, seq, i == end - 1) for i in range(seq.n_fed, seq.n_fed + take)]
            seq.kv += seq.prompt[seq.n_fed : seq.n_fed + take]
            seq.n_fed += take
            seq.pos = seq.n_fed
            self.stats["prompt_tokens"] += take
        if self.mixed_prefill:
            # one llama_decode, tokens in ascending sequence id (each sequence's own in position order): llama.cpp
            # takes consecutive sequence ids into one micro-batch
            self._decode(sorted(gen + fill, key=lambda e: e[2].slot))
        else:
            self._decode(gen)
            self._decode(fill)

    def _draft(self, seq: _Seq, few: bool, spare: int) -> list[int]:
        """Tokens to verify after ``seq``'s pending one in this step (prompt lookup: what followed the latest earlier
        occurrence of the text's last tokens), or none: "auto" drafts only while few requests generate (``few``)."""
        if seq.spec == "auto" and not few:
            return []
        drafter = self._drafter
        by_draft = drafter is not None and (seq.spec == "draft" or (seq.spec == "auto" and drafter.auto))
        if seq.k == 0:  # the request's first drafted step: the method's k (the plan's for the draft model)
            seq.k = seq.k_start = drafter.k if drafter is not None and by_draft else self.draft_max
        k = min(seq.k, spare, seq.budget - len(seq.out) - 1, self.n_ctx_seq - seq.pos - 2)
        if k <= 0:
            return []
        if drafter is not None and by_draft:
            seq.spec_by = "draft"  # the draft model proposes (edgesdk/runtime/draft.py)
            return drafter.propose(seq.slot, seq.prompt + seq.out, k, self._is_eog)
        return lookup_draft(seq.prompt + seq.out, k)

    def _k_max(self, by_draft: bool) -> int:
        """The largest k a request's drafting may reach: ``draft_max``, and for the draft model at least the plan's."""
        return max(self.draft_max, self._drafter.k) if by_draft and self._drafter is not None else self.draft_max

    def _adapt_k(self, seq: _Seq, drafted: int, accepted: int) -> None:
        """After a verified step of ``drafted`` tokens of which the first ``accepted`` were kept: the request's k for
        its next steps, the k of the best predicted gain (contracts/speculative.best_k, the plan's cost model) at its
        measured per-token acceptance. The acceptance is the decayed count of accepted tokens over accepted tokens
        plus rejections (a step whose drafts were all kept saw no rejection), starting from the plan's assumed
        acceptance worth 4 tries: a request whose drafts are rarely kept drafts fewer tokens a step (1 at least: the
        live switch-off of "auto" is the step below that), one whose drafts are kept drafts more, up to
        :meth:`_k_max`."""
        seq.k_hits = K_DECAY * seq.k_hits + accepted
        seq.k_misses = K_DECAY * seq.k_misses + (1 if accepted < drafted else 0)
        rate = seq.k_hits / (seq.k_hits + seq.k_misses)
        cost = self._draft_cost if seq.spec_by == "draft" else 0.0
        # (the gain rises with k to its best and falls after it, so the best k within the bound is the smaller)
        seq.k = min(best_k(rate, cost, self._verify_cost)[0], self._k_max(seq.spec_by == "draft"))

    def _verified(self, seq: _Seq) -> None:
        """After a step that verified ``seq``'s drafts: drop the KV cells of the rejected ones, count, and switch
        "auto" off for a request whose drafts are rarely accepted (a drafted step costs more than a plain one)."""
        n = len(seq.drafts)
        seq.drafts = []
        if n and self.adaptive_k:
            self._adapt_k(seq, n, seq.accepted - seq.step_accepted)
        if seq.slot >= 0 and n:
            self._ll.llama_memory_seq_rm(self._mem, seq.slot, len(seq.kv), -1)  # cells past the accepted tokens
            if self._drafter is not None and seq.spec_by == "draft":
                self._drafter.rollback(seq.slot, seq.kv)
        seq.draft_steps += 1
        if seq.spec == "auto" and seq.draft_steps >= SPEC_PROBE_STEPS and seq.accepted < SPEC_MIN_RATE * seq.drafted:
            seq.spec = "off"
            seq.spec_note = (
                f"switched off after {seq.draft_steps} drafted steps: {seq.accepted} of {seq.drafted} drafted tokens "
                f"accepted, below {SPEC_MIN_RATE:.0%}"
            )

    def _prefill_plan(self, room: int) -> list[tuple[_Seq, int]]:
        """How many prompt tokens of which admitted requests this step evaluates, ``room`` at most (the step's
        prefill budget) and ``prompts_per_step`` prompts at most.

        The oldest prompt still being evaluated gets a quarter of the budget while others wait (all of it when
        it is alone), the others are taken shortest first, and what is left goes to the oldest again: a short
        prompt arriving behind long ones is evaluated in the next step, and a long one still moves at least a
        quarter budget per step however many short ones arrive."""
        left = {id(s): n for s in self._active if (n := self._text_left(s))}  # prompt tokens before the next image
        pending = [s for s in self._active if id(s) in left]  # in admission order
        if not pending or room <= 0:
            return []
        oldest, others = pending[0], sorted(pending[1:], key=lambda s: left[id(s)])
        chosen = [oldest, *others][: self.prompts_per_step]
        if self.prompts_per_step == 1 and others:
            # one prompt per step (the CPU's per-slot buffers): the shortest waiting prompt goes in the next step
            # when all of it fits the step (twice in a row at most), and otherwise takes turns with the oldest; so a
            # short prompt behind long ones is evaluated in the step after it arrives, and a long one still moves
            # at least every third step however many short ones arrive
            short = others[0]
            if self._short_run == 0 or (left[id(short)] <= room and self._short_run < 2):
                self._short_run += 1
                chosen = [short]
                oldest = short
            else:
                self._short_run = 0
        take = dict.fromkeys((id(s) for s in chosen), 0)
        take[id(oldest)] = min(left[id(oldest)], room if len(chosen) == 1 else max(1, room // 4))
        room -= take[id(oldest)]
        for seq in [*chosen[1:], oldest]:
            more = min(left[id(seq)] - take[id(seq)], room)
            take[id(seq)] += more
            room -= more
        return [(seq, take[id(seq)]) for seq in chosen if take[id(seq)] > 0]

    @staticmethod
    def _text_left(seq: _Seq) -> int:
        """Prompt tokens of ``seq`` to evaluate before its next image (or its prompt's end)."""
        nxt = min((at for at in seq.images if at >= seq.n_fed), default=len(seq.prompt))
        return nxt - seq.n_fed

    def _decode_images(self, room: int) -> int:
        """Evaluate the images that admitted prompts have reached, oldest request first, each on its own (libmtmd's
        helper, in the request's slot, before the step's batched decode), while their tokens fit the step's prompt
        ``room`` (one image at least, however large); returns the image tokens evaluated. An image that fails ends
        its request only."""
        used = 0
        for seq in list(self._active):
            while seq.n_fed in seq.images and (used == 0 or used < room) and seq.slot >= 0:
                img = seq.images[seq.n_fed]
                t0 = time.perf_counter()
                try:
                    nxt = img.decode(self._ctx, seq.n_fed, seq.slot, self.n_batch)
                    if nxt != seq.n_fed + img.n_pos:
                        raise BackendUnavailableError(
                            f"llama.cpp placed an image of {img.n_pos} positions at {seq.n_fed} and ended at {nxt}"
                        )
                except EdgeSDKError as exc:
                    self._end(seq, "error", f"the prompt's image failed: {exc}")
                    break
                seq.kv += seq.prompt[seq.n_fed : nxt]
                seq.n_fed = seq.pos = nxt
                seq.prompt_s += time.perf_counter() - t0
                seq.prompt_n += img.n_tokens
                used += img.n_tokens
                self.stats["prompt_tokens"] += img.n_tokens
        return used

    def _decode(self, entries: list[tuple[int, int, _Seq, bool]]) -> None:
        """One ``llama_decode`` of (token, position, sequence, wants logits) entries, then sampling."""
        if not entries:
            return
        ll, b = self._ll, self._batch
        outputs: list[tuple[int, _Seq]] = []
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq.slot
            b.logits[i] = 1 if logits else 0
            if logits:
                outputs.append((i, seq))
        b.n_tokens = len(entries)
        t_dec = time.perf_counter()
        rc = ll.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(
                f"llama_decode returned {rc} for a batch of {len(entries)} tokens ({len(self._active)} sequences)"
            )
        if outputs:
            ll.llama_synchronize(self._ctx)  # the wait for the device, with the interpreter lock released
        dt = time.perf_counter() - t_dec
        counted: set[int] = set()
        for _tok, _pos, seq, _logits in entries:  # the step's time, to each request in it (per-request timings)
            if id(seq) in counted:
                if seq.pending is None:  # (a generating sequence's other entries are drafted tokens)
                    seq.prompt_n += 1
                continue
            counted.add(id(seq))
            if seq.pending is not None:  # a generating sequence: one token, its pending one
                seq.eval_s += dt
                seq.eval_n += 1
            else:
                seq.prompt_s += dt
                seq.prompt_n += 1
        self.stats["steps"] += 1
        self.stats["decoded_tokens"] += len(entries)
        now = time.perf_counter()
        t_host = None
        rows = None
        if any(seq.logprobs is not None or (seq.argmax and seq.grammar is None) for _, seq in outputs):
            # every output row at once (one foreign call, not one per sequence): llama_get_logits gives them in
            # the batch's order, which is the order of ``outputs``
            rows = np.ctypeslib.as_array(self._get_logits(self._ctx), shape=(len(outputs), self.n_vocab))
            t_host = time.perf_counter()  # reading the logits waits for the device: decode time until then
            self.stats["decode_s"] += t_host - t_dec
        seen: dict[int, int] = {}  # id(seq) -> its output rows handled so far (drafted sequences have several)
        drafted: list[_Seq] = []
        for j, (idx, seq) in enumerate(outputs):
            if seq.want_logits:  # BatchEngine.logits(): the row is the result; nothing is generated
                row = ll.llama_get_logits_ith(self._ctx, idx)
                seq.logits = np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()
                self._end(seq, "length")
                continue
            nth = seen.get(id(seq), 0)
            if nth < 0:  # a draft before this row was rejected (or the request ended): the row is not used
                continue
            if nth == 0 and seq.drafts:
                drafted.append(seq)
            if nth > 0:  # the row after drafted token nth-1: used while every draft before it was accepted
                if seq.slot < 0 or seq.pending != seq.drafts[nth - 1]:
                    seen[id(seq)] = -1
                    continue
                seq.accepted += 1
                self.stats["accepted_tokens"] += 1
            seen[id(seq)] = nth + 1
            if seq.pending is not None:
                seq.kv.append(seq.pending)
                seq.pos += 1
                seq.pending = None
            row = None
            if seq.logprobs is not None or (seq.argmax and seq.grammar is None):
                # the raw row, read before sampling (samplers work on a copy)
                assert rows is not None
                row = rows[j]
            if seq.grammar is not None:
                tok = self._sample_grammar(seq, idx)
            elif seq.argmax:
                # greedy without penalties: the first largest logit, as llama.cpp's greedy sampler picks it,
                # without copying the vocabulary into a candidates array (a 262k vocabulary costs ~1 ms)
                assert row is not None
                tok = int(row.argmax())
            else:
                tok = int(self._sampler_sample(seq.sampler, self._ctx, idx))
            if row is not None and seq.logprobs is not None and not self._is_eog(tok):
                seq.logprobs.append(self._logprob(row, tok, int(seq.handle.request.logprobs or 0)))
            if t_host is None:  # reading the first row waits for the device: decode time until then
                t_host = time.perf_counter()
                self.stats["decode_s"] += t_host - t_dec
            self._on_token(seq, tok, now)
        for seq in drafted:
            self._verified(seq)
        if t_host is not None:
            self.stats["host_s"] += time.perf_counter() - t_host

    def _candidates(self, idx: int) -> Any:
        """Every token with its raw logit at output row ``idx``, as a ``llama_token_data_array`` over a buffer
        this engine reuses (the engine thread samples one sequence at a time)."""
        ll = self._ll
        if self._cand is None:
            self._cand = np.empty(self.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        buf = self._cand
        buf["id"] = np.arange(self.n_vocab, dtype=np.int32)  # samplers sort the buffer in place
        buf["logit"] = np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, idx), shape=(self.n_vocab,))
        buf["p"] = 0.0
        return ll.llama_token_data_array(
            data=buf.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), size=self.n_vocab, selected=-1, sorted=False
        )

    def _sample_grammar(self, seq: _Seq, idx: int) -> int:
        """The chain's token under the grammar: the chain picks from all candidates; if the grammar rejects that
        token, the grammar masks all candidates and the chain picks again (llama.cpp's common sampler). Both
        samplers then accept the token."""
        ll = self._ll
        arr = self._candidates(idx)
        ll.llama_sampler_apply(seq.sampler, ctypes.byref(arr))
        tok = int(self._cand["id"][arr.selected])
        one = (ll.llama_token_data * 1)(ll.llama_token_data(tok, 1.0, 0.0))
        ll.llama_sampler_apply(
            seq.grammar, ctypes.byref(ll.llama_token_data_array(data=one, size=1, selected=-1, sorted=False))
        )
        if not np.isfinite(one[0].logit):  # rejected: the grammar first, then the chain
            arr = self._candidates(idx)
            ll.llama_sampler_apply(seq.grammar, ctypes.byref(arr))
            ll.llama_sampler_apply(seq.sampler, ctypes.byref(arr))
            tok = int(self._cand["id"][arr.selected])
        ll.llama_sampler_accept(seq.grammar, tok)
        ll.llama_sampler_accept(seq.sampler, tok)
        return tok

    def _logprob(self, row: np.ndarray, tok: int, k: int) -> TokenLogprob:
        """``tok``'s log-probability under the log-softmax of ``row`` (the raw logits), and the ``k`` most
        likely tokens."""
        m = float(row.max())  # float32 exponentials summed in float64: 0.7 ms for 262k logits, 5x float64's time
        lse = m + float(np.log(np.exp(row - np.float32(m)).sum(dtype=np.float64)))
        top: tuple[tuple[int, bytes, float], ...] = ()
        if k > 0:
            idx = np.argpartition(row, -k)[-k:]
            idx = idx[np.argsort(-row[idx], kind="stable")]
            top = tuple((int(i), self.piece(int(i)), float(row[i]) - lse) for i in idx)
        return TokenLogprob(tok, self.piece(tok), float(row[tok]) - lse, top)

    def _on_token(self, seq: _Seq, tok: int, now: float) -> None:
        h = seq.handle
        if h.first_token_at is None:
            h.first_token_at = now
        if h.cancelled:
            self._end(seq, "cancelled")
            return
        if self._is_eog(tok):
            seq.text += seq.decoder.decode(b"", final=True)
            self._end(seq, "stop")
            return
        seq.out.append(tok)
        h.tokens.append(tok)
        self.stats["generated_tokens"] += 1
        seq.text += seq.decoder.decode(self.piece(tok))
        if seq.stops:
            cut = min(
                (i for i in (seq.text.find(s, max(0, seq.emitted - len(s))) for s in seq.stops) if i >= 0), default=-1
            )
            if cut >= 0:
                seq.text = seq.text[:cut]
                self._end(seq, "stop")
                return
        if len(seq.out) >= seq.budget:
            seq.text += seq.decoder.decode(b"", final=True)
            self._end(seq, "length")
            return
        if len(seq.text) - seq.hold > seq.emitted:
            h._put(seq.text[seq.emitted : len(seq.text) - seq.hold], self._unsent(seq))
            seq.emitted = len(seq.text) - seq.hold
        seq.pending = tok
