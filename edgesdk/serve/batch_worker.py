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

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import os
import threading
import time
from typing import Any

from edgesdk.errors import EdgeSDKError, InputError, ShapeError
from edgesdk.runtime.backend import BatchingBackend, VisionBackend
from edgesdk.runtime.backends.llamacpp import speculative_attributes
from edgesdk.runtime.batching import EngineClosed, EngineSaturated, GenerationResult, prompt_size
from edgesdk.serve.workers import Job, RequestTimeout, Saturated
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

    ``requested`` (``serve --parallel``) wins. Otherwise the bundle's plan decision ``serving.slots`` (sized for
    its profile; ``backend.planned_slots()``), else 16 on a GPU and 4 on the CPU (a bundle built before the
    decision, or one planned for another placement), capped so that the KV cache of all slots (each as long as
    the session's context) fits in half the free GPU memory after the weights (NVML), or a quarter of the
    available host memory on the CPU and on unified-memory devices."""
    backend = session.backend
    if not isinstance(backend, BatchingBackend):
        raise InputError(f"{session.bundle.format} bundles have no continuous batching: serve them with --parallel 1")
    n_ctx = backend.context_length
    per_token = int(backend.kv_bytes_per_token())
    per_slot = per_token * n_ctx
    if requested is not None:
        return requested, (
            f"{requested} (--parallel; KV cache {requested} x {n_ctx} tokens x "
            f"{per_token / 1024:.1f} KiB = {requested * per_slot / 1e9:.2f} GB)"
        )
    on_gpu = backend.on_gpu
    kind = "GPU" if on_gpu else "CPU"
    planned, source = backend.planned_slots()  # (None, why) where the bundle plans no slots for this placement
    if planned is not None:
        base, base_why = int(planned), source
    else:
        base = GPU_SLOTS if on_gpu else CPU_SLOTS
        base_why = f"{kind} default {base}" + (f"; plan: {source}" if source else "")
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
    why = (
        f"{slots} ({base_why}; KV cache {slots} x {n_ctx} tokens x {per_token / 1024:.1f} KiB = "
        f"{slots * per_slot / 1e9:.2f} GB" + (f", {int(fit)} slots fit in {where})" if where else ")")
    )
    return slots, why


class BatchWorker:
    """Serves one GGUF session with continuous batching (the same ``submit``/``depth``/``close`` as
    :class:`~edgesdk.serve.workers.LLMWorker`, which serves one request at a time). A request still waiting or
    generating ``request_timeout_s`` after it was submitted ends at the engine's next step with
    :class:`~edgesdk.serve.workers.RequestTimeout`, its slot freed; None: no limit."""

    def __init__(
        self,
        name: str,
        session: Any,
        *,
        slots: int,
        max_queue: int,
        reuse_prefix: bool = True,
        reason: str = "",
        request_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.request_timeout_s = request_timeout_s
        self.session = session
        self.slots = slots
        self.max_queue = int(max_queue)
        self.reason = reason
        self._backend = session.backend
        self.engine = self._backend.batch_engine(slots=slots, max_queue=max_queue, reuse_prefix=reuse_prefix)
        # events of the current step, handed to the event loop together when the step ends (engine thread only)
        self._pending: list[tuple[Job, str, Any]] = []
        self._wakers: dict[Any, _LoopWaker | None] = {}  # per event loop, made on that loop's thread (submit)
        self.engine.add_step_listener(self._flush)
        # a backend whose encode() preprocesses and encodes images (a VLM) encodes on a thread of its own, in arrival
        # order, never on the event loop; ``_encoding``: requests handed to it and not yet in the engine (the event
        # loop adds, the thread subtracts, under ``_count``)
        self._encoder = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"edgesdk-serve-{name}-encode")
            if isinstance(self._backend, VisionBackend)
            else None
        )
        self._encoding = 0
        self._count = threading.Lock()
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
        if self._encoder is not None and self.depth + self._encoding >= self.slots + self.max_queue:
            raise self._saturated()  # (the encoder thread's requests count: the engine never refuses them later)
        # The request's GenAI span (a child of the HTTP server span) starts here and ends on the engine thread.
        token = attach_context(job.otel_ctx)
        try:
            rec = self._backend.recorder(job.request)
            rec.__enter__()
        finally:
            detach_context(token)
        if job.loop not in self._wakers:
            self._wakers[job.loop] = _LoopWaker.on(job.loop)
        original = job.request
        rec.capture_input(original.prompt if original.messages is None else [m.as_dict() for m in original.messages])
        if self._encoder is not None:  # a VLM: its images are preprocessed and encoded on the encoder thread
            with self._count:
                self._encoding += 1
            self._encoder.submit(self._enqueue, job, rec)
            return
        self._enqueue(job, rec)

    def _enqueue(self, job: Job, rec: Any) -> None:
        """``job``'s request encoded (a VLM's: off the event loop, its images in it) and queued in the engine."""
        off_loop = self._encoder is not None
        try:
            try:
                if off_loop:
                    request = self._backend.encode(job.request, job.inputs, rec)
                else:
                    request = self._backend.encode(job.request)
                rec.set_input_tokens(prompt_size(request))
                self.engine.submit(
                    request,
                    listener=lambda kind, value: self._event(job, rec, kind, value),
                    cancel=job.cancel,
                    timeout_s=self.request_timeout_s,
                )
            finally:
                if off_loop:
                    with self._count:
                        self._encoding -= 1
        except BaseException as exc:
            rec.__exit__(type(exc), exc, None)
            if isinstance(exc, EngineClosed):
                exc = Saturated(f"model {self.name!r} is shutting down", retry_after=5, draining=True)
            elif isinstance(exc, EngineSaturated):
                exc = self._saturated()
            elif not isinstance(exc, (InputError, ShapeError, EdgeSDKError)) and not off_loop:
                raise
            if isinstance(exc, Saturated) and not off_loop:
                raise exc from None
            job.emit("error", exc)  # too long, bad template, an image that fails: a 400
            return
        job.emit("started", time.perf_counter())

    def _saturated(self) -> Saturated:
        waiting = max(0, self.depth - self.slots)
        return Saturated(
            f"model {self.name!r} is busy: all {self.slots} slots run and {waiting} requests "
            f"are queued (limit {self.max_queue})",
            retry_after=self._mean_s * (1 + waiting / self.slots),
        )

    def _flush(self) -> None:
        """On the engine thread, after each step: the step's events go to their event loops together, in
        order (one wake-up per token instead would cost a self-pipe write and a wait for the interpreter lock
        per token: most of a step's host time at 16 sequences)."""
        if not self._pending:
            return
        items, self._pending = self._pending, []
        loops: dict[Any, list[tuple[Any, tuple[str, Any]]]] = {}
        for job, kind, value in items:
            loops.setdefault(job.loop, []).append((job.events, (kind, value)))
        for loop, batch in loops.items():
            waker = self._wakers.get(loop)
            if waker is not None and waker.post(batch):
                continue
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is listening any more
                loop.call_soon_threadsafe(_deliver, batch)

    def _event(self, job: Job, rec: Any, kind: str, value: Any) -> None:
        """On the engine thread: queue a piece or the end of ``job`` for the event loop (never blocks)."""
        if kind == "chunk":
            rec.first_chunk()
            rec.chunk()
            self._pending.append((job, "chunk", value))
            return
        if kind == "logprobs":  # the tokens behind the next chunk (the request asked for logprobs)
            self._pending.append((job, "logprobs", value))
            return
        res: GenerationResult = value
        rec.set_output_tokens(len(res.tokens))
        speculative_attributes(rec, res)
        rec.finish([res.finish_reason])
        rec.capture_output(res.text)
        if res.finish_reason == "error":
            rec.set_error("generation_failed")
        elif res.finish_reason == "timeout":
            rec.set_error("request_timeout")
        rec.__exit__(None, None, None)
        if res.finish_reason == "error":
            self._pending.append((job, "error", RuntimeError(res.error or "generation failed")))
            return
        if res.finish_reason == "timeout":
            where = (
                f"after {len(res.tokens)} generated tokens"
                if res.first_token_at is not None
                else "before its first token: waiting for a slot or evaluating its prompt"
            )
            self._pending.append((job, "error", RequestTimeout(self.request_timeout_s or 0.0, where)))
            return
        self._mean_s = 0.8 * self._mean_s + 0.2 * res.total_s
        first, end = res.first_token_at, res.finished_at
        n_out = len(res.tokens)
        done = {
            "input_tokens": res.prompt_tokens,
            "output_tokens": n_out,
            "finish_reason": res.finish_reason,
            "ttft_s": res.ttft_s,
            "decode_tok_s": round((n_out - 1) / (end - first), 2)
            if first and end and n_out > 1 and end > first
            else None,
            "first_token_at": first,
            "last_token_at": end if first else None,
            "cached_tokens": res.cached_tokens,
            "drafted_tokens": res.drafted_tokens,
            "accepted_tokens": res.accepted_tokens,
            "logprobs": res.logprobs,
        }
        self._pending.append((job, "done", done))

    def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new requests, let running ones finish (bounded by ``timeout_s``), then stop the engine."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)  # the requests being encoded go into the engine first
        while self.engine.depth and time.monotonic() < deadline:
            time.sleep(0.05)
        self.engine.close(max(1.0, deadline - time.monotonic()))
        for waker in self._wakers.values():
            if waker is not None:
                waker.close()


def _deliver(batch: list[tuple[Any, tuple[str, Any]]]) -> None:
    """On the event loop: put one step's events on their jobs' queues."""
    for events, item in batch:
        events.put_nowait(item)


class _LoopWaker:
    """Wakes an asyncio loop from the engine thread without giving up the interpreter lock.

    ``call_soon_threadsafe`` writes to the loop's self-pipe with a Python ``send``, which releases the lock; the
    loop thread, woken by that very byte, takes it, and the engine thread waits until the loop has handled the
    whole step's events before it can start the next ``llama_decode``: the loop's work and the device's work
    run one after the other. Here the engine writes a byte to a pipe of our own through libc's ``write`` called
    with the lock held (``ctypes.PyDLL``; the pipe is non-blocking, so the call never waits), goes on into the
    next ``llama_decode`` (which releases the lock), and the loop (watching the pipe with ``add_reader``)
    handles the events while the device computes. Made on the loop's own thread; ``on`` returns None where
    the loop cannot watch a file descriptor (then the worker uses ``call_soon_threadsafe``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Any) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[Any, tuple[str, Any]]] = collections.deque()
        self._signalled = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._write = write
        self._byte = ctypes.create_string_buffer(b"x", 1)
        self._open = True
        loop.add_reader(self._r, self._drain)

    @classmethod
    def on(cls, loop: asyncio.AbstractEventLoop) -> _LoopWaker | None:
        try:
            if asyncio.get_running_loop() is not loop:
                return None
            libc = ctypes.PyDLL(None)  # the process's C library, called with the interpreter lock held
            write = libc.write
            write.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
            write.restype = ctypes.c_ssize_t
            return cls(loop, write)
        except (RuntimeError, OSError, AttributeError, NotImplementedError):
            return None

    def post(self, batch: list[tuple[Any, tuple[str, Any]]]) -> bool:
        """On the engine thread: queue ``batch`` and wake the loop; False when this waker is closed."""
        if not self._open:
            return False
        self._items.extend(batch)
        if not self._signalled:
            self._signalled = True
            self._write(self._w, self._byte, 1)  # EAGAIN on a full pipe is fine: a wake-up is pending
        return True

    def _drain(self) -> None:
        """On the loop: read the wake-up bytes, then deliver everything queued, in order."""
        with contextlib.suppress(OSError):
            os.read(self._r, 4096)
        self._signalled = False  # before draining: a batch queued from here on sends a new wake-up
        items = self._items
        while items:
            events, item = items.popleft()
            events.put_nowait(item)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self._shut)
                return
        self._shut()

    def _shut(self) -> None:
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            if not self.loop.is_closed():
                self.loop.remove_reader(self._r)
        self._drain()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
