# SPDX-License-Identifier: Apache-2.0
"""Continuous batching for ``edgesdk serve``: one :class:`~edgesdk.runtime.batching.BatchEngine` per GGUF model.

The engine decodes up to ``slots`` requests together in one llama.cpp context (``serve --parallel N``,
default from :func:`decide_parallel`); more wait in a bounded queue, and beyond that ``submit`` raises
:class:`~edgesdk.serve.workers.Saturated` (HTTP 429 with ``Retry-After``). The engine runs on the session's
already-loaded model, so the weights are in memory once. Generated pieces go from the engine thread to the
event loop with ``call_soon_threadsafe`` (a slow reader never holds up the batch); a client that goes away
sets the job's cancel event, which the engine checks at every step, and its slot is free at the next one.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from edgesdk.errors import EdgeSDKError, InputError, ShapeError
from edgesdk.runtime.batching import EngineClosed, EngineSaturated, GenerationResult
from edgesdk.serve.workers import Job, Saturated
from edgesdk.telemetry.serve_spans import attach_context, detach_context

GPU_SLOTS = 16  # llama-server -np 16 territory: one decode step of a <= 8B model serves 16 sequences cheaply
CPU_SLOTS = 4  # 2-4 cores: beyond 4 sequences the step time grows about linearly (docs/benchmarks.md)
KV_SHARE_GPU = 0.5  # of the free device memory after the weights
KV_SHARE_HOST = 0.25  # of MemAvailable (CPU or unified-memory Jetson)


def _mem_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as fh:
            line = next(ln for ln in fh if ln.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return None


def decide_parallel(session: Any, requested: int | None) -> tuple[int, str]:
    """How many sequences to decode together for ``session`` (a GGUF session), and why.

    ``requested`` (``serve --parallel``) wins. Otherwise 16 on a GPU and 4 on the CPU, capped so that the
    KV cache of all slots (each as long as the session's context) fits in half the free GPU memory after
    the weights (NVML), or a quarter of the available host memory on the CPU and on unified-memory devices."""
    backend = session.backend
    n_ctx = int(backend.settings["n_ctx"])
    per_token = int(backend.kv_bytes_per_token())
    per_slot = per_token * n_ctx
    if requested is not None:
        return requested, (f"{requested} (--parallel; KV cache {requested} x {n_ctx} tokens x "
                           f"{per_token / 1024:.1f} KiB = {requested * per_slot / 1e9:.2f} GB)")
    on_gpu = int(backend.settings.get("n_gpu_layers") or 0) > 0
    base = GPU_SLOTS if on_gpu else CPU_SLOTS
    from edgesdk.runtime.backends.llamacpp import free_device_bytes

    free, how = free_device_bytes() if on_gpu else (None, "")
    if free is not None and "MemAvailable" not in how:
        budget, where = int(free * KV_SHARE_GPU), f"half the free GPU memory ({how}: {free / 1e9:.1f} GB)"
    else:
        avail = _mem_available()
        budget = int(avail * KV_SHARE_HOST) if avail else 0
        where = f"a quarter of MemAvailable ({avail / 1e9:.1f} GB)" if avail else ""
    fit = budget // per_slot if budget and per_slot else base
    slots = max(1, min(base, int(fit)))
    kind = "GPU" if on_gpu else "CPU"
    why = (f"{slots} ({kind} default {base}; KV cache {slots} x {n_ctx} tokens x {per_token / 1024:.1f} KiB = "
           f"{slots * per_slot / 1e9:.2f} GB" + (f", {int(fit)} slots fit in {where})" if where else ")"))
    return slots, why


class BatchWorker:
    """Serves one GGUF session with continuous batching (the same ``submit``/``depth``/``close`` as
    :class:`~edgesdk.serve.workers.LLMWorker`, which serves one request at a time)."""

    def __init__(self, name: str, session: Any, *, slots: int, max_queue: int, reuse_prefix: bool = True,
                 reason: str = "") -> None:
        self.name = name
        self.session = session
        self.slots = slots
        self.max_queue = int(max_queue)
        self.reason = reason
        self._backend = session.backend
        self.engine = self._backend.batch_engine(slots=slots, max_queue=max_queue, reuse_prefix=reuse_prefix)
        self._mean_s = 2.0  # running mean of request time, for Retry-After
        self._closing = False

    @property
    def depth(self) -> int:
        return self.engine.depth

    @property
    def busy(self) -> int:
        return self.engine.busy

    def submit(self, job: Job) -> None:
        """Queue ``job`` (its ``request``, a GenerationRequest). A bad request comes back as the job's
        ``error`` event; a full engine raises :class:`Saturated`."""
        if self._closing:
            raise Saturated(f"model {self.name!r} is shutting down", retry_after=5, draining=True)
        if job.request is None:
            raise TypeError("a batched job needs its GenerationRequest")
        # The request's GenAI span (a child of the HTTP server span) starts here and ends on the engine thread.
        token = attach_context(job.otel_ctx)
        try:
            rec = self._backend.recorder(job.request)
            rec.__enter__()
        finally:
            detach_context(token)
        original = job.request
        rec.capture_input(original.prompt if original.messages is None
                          else [m.as_dict() for m in original.messages])
        try:
            request = self._backend.encode(job.request)
            rec.set_input_tokens(len(request.prompt_tokens or ()))
            self.engine.submit(request, listener=lambda kind, value: self._event(job, rec, kind, value),
                               cancel=job.cancel)
        except BaseException as exc:
            rec.__exit__(type(exc), exc, None)
            if isinstance(exc, EngineClosed):
                raise Saturated(f"model {self.name!r} is shutting down", retry_after=5, draining=True) from None
            if isinstance(exc, EngineSaturated):
                waiting = max(0, self.depth - self.slots)
                raise Saturated(f"model {self.name!r} is busy: all {self.slots} slots run and {waiting} requests "
                                f"are queued (limit {self.max_queue})",
                                retry_after=self._mean_s * (1 + waiting / self.slots)) from exc
            if isinstance(exc, (InputError, ShapeError, EdgeSDKError)):  # too long, bad template: a 400
                job.emit("error", exc)
                return
            raise
        job.emit("started", time.perf_counter())

    def _event(self, job: Job, rec: Any, kind: str, value: Any) -> None:
        """On the engine thread: hand a piece or the end of ``job`` to the event loop (never blocks)."""
        if kind == "chunk":
            rec.first_chunk()
            rec.chunk()
            job.emit("chunk", value)
            return
        if kind == "logprobs":  # the tokens behind the next chunk (the request asked for logprobs)
            job.emit("logprobs", value)
            return
        res: GenerationResult = value
        rec.set_output_tokens(len(res.tokens))
        rec.finish([res.finish_reason])
        rec.capture_output(res.text)
        if res.finish_reason == "error":
            rec.set_error("generation_failed")
        rec.__exit__(None, None, None)
        if res.finish_reason == "error":
            job.emit("error", RuntimeError(res.error or "generation failed"))
            return
        self._mean_s = 0.8 * self._mean_s + 0.2 * res.total_s
        first, end = res.first_token_at, res.finished_at
        n_out = len(res.tokens)
        job.emit("done", {"input_tokens": res.prompt_tokens, "output_tokens": n_out,
                          "finish_reason": res.finish_reason, "ttft_s": res.ttft_s,
                          "decode_tok_s": round((n_out - 1) / (end - first), 2)
                          if first and end and n_out > 1 and end > first else None,
                          "first_token_at": first, "last_token_at": end if first else None,
                          "cached_tokens": res.cached_tokens, "logprobs": res.logprobs})

    def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new requests, let running ones finish (bounded by ``timeout_s``), then stop the engine."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        while self.engine.depth and time.monotonic() < deadline:
            time.sleep(0.05)
        self.engine.close(max(1.0, deadline - time.monotonic()))
