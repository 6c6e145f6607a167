# SPDX-License-Identifier: Apache-2.0
"""Per-model execution: one thread per LLM with a bounded queue, and a dynamic batcher for embeddings.

A llama.cpp context holds one sequence's KV cache, so requests to one LLM bundle run one after
another on its own thread (never interleaved); the queue in front of it is bounded and a full queue
is refused at once (the HTTP layer answers 429 with ``Retry-After``). Generated pieces travel back
to the event loop with ``call_soon_threadsafe``; a client that goes away sets the job's cancel flag,
which the worker checks between tokens, so the next request starts within about one token's time.

Embedding requests are gathered for at most ``max_wait_ms`` or until ``max_batch`` inputs are
waiting. A float bundle (FP32/FP16/BF16) runs them as one ``Session.embed`` call, which batches within
the verified ``embed_max_batch`` and groups texts of similar length, and splits the result back per
request: a text's vector then moves by float rounding only (cosine >= 0.9999 against the text alone).
A quantized bundle (INT8) scales its activations per batch, so a stranger's text in the batch would move
a client's vector (MiniLM INT8: cosine 0.9918 against the text alone): there each request runs as its
own ``Session.embed`` call, and one client's vectors never depend on another's texts.

When an LLM worker's queue drains it runs :class:`IdleReclaim`: ``gc.collect()`` then glibc's ``malloc_trim(0)``
(at most once a second; while the queue never drains, every 10 s between two jobs). Without it RSS under
``--parallel 1`` moved by tens of MB with the collector's timing: memory held by cyclic garbage until a full
collection, then kept by glibc's heap (issue 25; docs/security.md, "Memory under a long run").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgesdk.telemetry.serve_spans import attach_context, detach_context

DEFAULT_REQUEST_TIMEOUT_S = 600.0  # serve --request-timeout: wall-clock seconds one generation request may take


class RequestTimeout(Exception):
    """A request ran past the server's per-request deadline (``serve --request-timeout``, queueing included);
    the HTTP layer answers 504, or an error event mid-stream. The message names the limit and the option."""

    def __init__(self, limit_s: float, where: str = ""):
        super().__init__(
            f"the request ran past the server's limit of {limit_s:g} s per request"
            + (f" ({where})" if where else "")
            + f"; the limit is edgesdk serve --request-timeout SECONDS (default {DEFAULT_REQUEST_TIMEOUT_S:g})"
        )
        self.limit_s = limit_s


class Saturated(Exception):
    """The model's queue is full (or the server is draining); ``retry_after`` is a whole-second hint."""

    def __init__(self, message: str, retry_after: float, draining: bool = False):
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))
        self.draining = draining


@dataclass
class Job:
    """One generation: ``start()`` returns a text iterator (raising if the request is bad)."""

    start: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    otel_ctx: Any = None
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    request: Any = None  # the GenerationRequest (a BatchWorker runs this instead of calling start)

    def emit(self, kind: str, value: Any = None) -> None:
        _mailbox(self.loop).post(self.events, (kind, value))

    @property
    def inputs(self) -> Any:
        """What the route parsed the request into (a VLM chat's messages with their decoded image parts, which
        ``request`` leaves out): the input ``start`` was made with."""
        args = getattr(self.start, "args", ())
        return args[0] if args else None


class _Mailbox:
    """Events from worker threads to one event loop, handed over in bursts.

    ``call_soon_threadsafe`` per event wakes the loop (a write to its self-pipe) once per generated token of
    every request; under a batch of 16 sequences that is 16 wake-ups and 16 callbacks per decode step, each
    taking the interpreter lock from the engine thread. Here events queue under a lock and the loop is woken
    only when no delivery is pending: everything that arrives before the loop runs goes over in one callback,
    in arrival order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []
        self._scheduled = False

    def post(self, target: asyncio.Queue, item: Any) -> None:
        with self._lock:
            self._items.append((target, item))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for target, item in items:
            target.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()
_MAILBOXES_LOCK = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _MAILBOXES.get(loop)
    if box is None:
        with _MAILBOXES_LOCK:
            box = _MAILBOXES.get(loop)
            if box is None:
                box = _MAILBOXES[loop] = _Mailbox(loop)
    return box


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (returns freed heap pages to the system), or None where the C library has none
    (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class IdleReclaim:
    """Gives memory back after requests: ``gc.collect()`` (native buffers that cyclic garbage still holds), then
    ``malloc_trim(0)`` where glibc has it (the heap pages freed). :meth:`after_job` runs it when the worker's
    queue has drained and ``min_interval_s`` has passed since the last run, or while the queue never drains
    once ``busy_interval_s`` has passed; never per request under load. It runs on the worker's thread, between
    jobs (``malloc_trim`` releases the interpreter lock; ``gc.collect()`` holds it for its few milliseconds)."""

    def __init__(
        self,
        min_interval_s: float = 1.0,
        busy_interval_s: float = 10.0,
        trim: Callable[[int], int] | None = None,
        collect: Callable[[], int] = gc.collect,
    ):
        self.min_interval_s = float(min_interval_s)
        self.busy_interval_s = float(busy_interval_s)
        self._trim = _malloc_trim() if trim is None else trim
        self._collect = collect
        self._last = time.monotonic()
        self.runs = 0
        self.last_s = 0.0  # how long the last run took

    def due_in(self) -> float:
        """Seconds until an idle run is allowed (0: now)."""
        return max(0.0, self.min_interval_s - (time.monotonic() - self._last))

    def after_job(self, queue_empty: bool) -> bool:
        """Called by the worker after each job (and once more when a drained queue's run was put off by the
        rate limit, as soon as it is allowed, if no job came meanwhile); True when it reclaimed."""
        since = time.monotonic() - self._last
        if since < (self.min_interval_s if queue_empty else self.busy_interval_s):
            return False
        t0 = time.monotonic()
        self._collect()
        if self._trim is not None:
            self._trim(0)
        self._last = time.monotonic()
        self.last_s = self._last - t0
        self.runs += 1
        return True


class LLMWorker:
    """Runs jobs for one LLM session on one thread; at most ``max_queue`` jobs wait behind the running one.
    After a job, ``reclaim`` (None: a default :class:`IdleReclaim`) may give memory back; setting the
    attribute to None switches that off. A job still queued or generating ``request_timeout_s`` after it was
    submitted ends with :class:`RequestTimeout` (checked before it starts and between pieces: a single
    native call, such as a long prompt's evaluation, is not interrupted); None: no limit."""

    def __init__(
        self,
        name: str,
        session,
        max_queue: int,
        on_depth: Callable[[int], None] | None = None,
        reclaim: IdleReclaim | None = None,
        request_timeout_s: float | None = None,
    ):
        self.name = name
        self.request_timeout_s = request_timeout_s
        self.reclaim = IdleReclaim() if reclaim is None else reclaim
        self.session = session
        self.max_queue = int(max_queue)
        self._jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._depth = 0  # waiting + running
        self._closing = False
        self._mean_s = 2.0  # running mean of job time, for Retry-After
        self._on_depth = on_depth
        self._thread = threading.Thread(target=self._loop, name=f"edgesdk-serve-{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        return self._depth

    def _set_depth(self, delta: int) -> None:
        self._depth += delta
        if self._on_depth is not None:
            self._on_depth(self._depth)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closing:
                raise Saturated(f"model {self.name!r} is shutting down", retry_after=5, draining=True)
            if self._depth >= self.max_queue + 1:
                raise Saturated(
                    f"model {self.name!r} is busy: {self._depth - 1} requests are queued (limit {self.max_queue})",
                    retry_after=self._mean_s * self._depth,
                )
            self._set_depth(+1)
        self._jobs.put(job)

    def _loop(self) -> None:
        owed = False  # the queue drained but the rate limit put its reclaim off: run it once idle
        while True:
            try:
                if owed and self.reclaim is not None:
                    job = self._jobs.get(timeout=self.reclaim.due_in())
                else:
                    job = self._jobs.get()
            except queue.Empty:
                owed = False
                self._reclaim(queue_empty=True)
                continue
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                if job.cancel.is_set():
                    job.emit("error", asyncio.CancelledError())
                else:
                    self._run(job)
            finally:
                with self._lock:
                    self._set_depth(-1)
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - t0)
                del job  # the finished job (its request, its queue) is garbage before the collection below
            drained = self._jobs.empty()
            owed = not self._reclaim(drained) and drained

    def _reclaim(self, queue_empty: bool) -> bool:
        """Run the reclaim hook; True when it ran (or is off, or failed: nothing is owed then)."""
        if self.reclaim is None:
            return True
        try:
            return self.reclaim.after_job(queue_empty)
        except Exception:  # noqa: BLE001 - giving memory back must never stop the worker
            return True

    def _run(self, job: Job) -> None:
        limit = self.request_timeout_s
        deadline = None if limit is None else job.submitted + limit
        if deadline is not None and time.perf_counter() > deadline:
            job.emit("error", RequestTimeout(limit or 0.0, "waiting in the queue"))
            return
        token = attach_context(job.otel_ctx)
        try:
            try:
                pieces = job.start()
            except Exception as exc:  # noqa: BLE001 - bad input (context overflow, template) goes back to the client
                job.emit("error", exc)
                return
            job.emit("started", time.perf_counter())
            cancelled = False
            n = 0
            try:
                for piece in pieces:
                    if job.cancel.is_set():
                        cancelled = True
                        break
                    if deadline is not None and time.perf_counter() > deadline:
                        job.emit("error", RequestTimeout(limit or 0.0, f"after {n} text pieces"))
                        return
                    job.emit("chunk", piece)
                    n += 1
            except Exception as exc:  # noqa: BLE001 - a failure mid-generation ends this request only
                job.emit("error", exc)
                return
            finally:
                close = getattr(pieces, "close", None)
                if close is not None:
                    close()  # GeneratorExit inside the backend: its span ends as "cancelled"
            from edgesdk.runtime.session import Session

            stats = self.session.last_stats if isinstance(self.session, Session) else None  # typed: RequestStats
            last = stats.as_dict() if stats is not None else {}
            if cancelled:
                last["finish_reason"] = "cancelled"
            job.emit("done", last)
        finally:
            detach_context(token)

    def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new jobs, let queued ones finish (bounded), stop the thread."""
        with self._lock:
            self._closing = True
        self._jobs.put(None)
        self._thread.join(timeout_s)


@dataclass
class _EmbedRequest:
    texts: list[str | list[int]]  # texts, or token ids (edgesdk.runtime.embed_inputs)
    future: asyncio.Future
    otel_ctx: Any = None


# Precisions whose activations are plain floats: batching changes a row's result by rounding only.
# Any other (INT8's dynamic per-tensor activation scales) makes a row depend on its batch neighbours.
FLOAT_PRECISIONS = frozenset({"fp32", "fp16", "bf16"})


def batch_independent(session) -> bool:
    """True when texts of different requests may share one backend batch (see the module docstring)."""
    bundle = getattr(session, "bundle", None)
    precision = str(getattr(bundle, "precision", "") or "").lower()
    return precision in FLOAT_PRECISIONS


class EmbeddingBatcher:
    """Gathers embedding requests into batches of at most ``max_batch`` inputs, waiting at most ``max_wait_ms``.

    At most ``max_pending`` inputs wait; a request with more inputs than that (the HTTP layer allows up to
    2,048) is admitted when nothing else waits, so every valid request can succeed on an idle server and a
    429 always means other requests are queued. ``shared_batches`` (default: the bundle's precision decides,
    :func:`batch_independent`) lets texts of different requests share a backend batch."""

    def __init__(
        self,
        name: str,
        session,
        *,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        max_pending: int = 1024,
        on_batch: Callable[[int], None] | None = None,
        shared_batches: bool | None = None,
    ):
        self.name = name
        self.session = session
        self.max_batch = max(1, int(max_batch))
        self.max_wait_s = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_pending = int(max_pending)
        self.shared_batches = batch_independent(session) if shared_batches is None else bool(shared_batches)
        self._on_batch = on_batch
        self._queue: asyncio.Queue[_EmbedRequest] | None = None
        self._pending = 0
        self._task: asyncio.Task | None = None
        self._closing = False
        # One thread: ONNX Runtime sessions parallelise inside a run; batches run one at a time.
        from concurrent.futures import ThreadPoolExecutor

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"edgesdk-embed-{name}")

    @property
    def depth(self) -> int:
        return self._pending

    async def embed(self, texts: list[str | list[int]], otel_ctx=None):
        """Embeddings for ``texts`` (numpy [n, dim]) and the token count, batched with concurrent callers."""
        if self._closing:
            raise Saturated(f"model {self.name!r} is shutting down", retry_after=5, draining=True)
        if self._pending and self._pending + len(texts) > self.max_pending:
            raise Saturated(
                f"model {self.name!r} is busy: {self._pending} inputs are queued "
                f"(limit {self.max_pending}; a larger request waits for an empty queue)",
                retry_after=1,
            )
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run(self._queue))
        queue = self._queue
        assert queue is not None  # created with the task, once
        fut = asyncio.get_running_loop().create_future()
        self._pending += len(texts)
        try:
            queue.put_nowait(_EmbedRequest(list(texts), fut, otel_ctx))
            return await fut
        finally:
            self._pending -= len(texts)

    async def _run(self, queue: asyncio.Queue[_EmbedRequest]) -> None:
        loop = asyncio.get_running_loop()
        carry: _EmbedRequest | None = None
        while True:
            first = carry or await queue.get()
            carry = None
            batch, n = [first], len(first.texts)
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch:
                timeout = deadline - loop.time()
                try:
                    nxt = queue.get_nowait() if timeout <= 0 else await asyncio.wait_for(queue.get(), timeout)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if n + len(nxt.texts) > self.max_batch:
                    carry = nxt  # starts the next batch: a batch never exceeds max_batch unless one request does
                    break
                batch.append(nxt)
                n += len(nxt.texts)
            batch = [r for r in batch if not r.future.done()]  # callers that went away
            if not batch:
                continue
            if not self.shared_batches:  # each request alone: its vectors depend on its own texts only
                for r in batch:
                    await self._run_batch([r], loop)
                continue
            await self._run_batch(batch, loop)

    async def _run_batch(self, batch: list[_EmbedRequest], loop: asyncio.AbstractEventLoop) -> None:
        """One ``Session.embed`` call over the texts of ``batch``; each request gets its rows (or the error)."""
        batch = [r for r in batch if not r.future.done()]
        if not batch:
            return
        texts = [t for r in batch for t in r.texts]
        try:
            emb, counts = await loop.run_in_executor(self._executor, self._embed, texts, batch[0].otel_ctx)
        except Exception as exc:  # noqa: BLE001 - every request in the batch gets the error
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(exc)
            return
        if self._on_batch is not None:
            self._on_batch(len(texts))
        i = 0
        for r in batch:
            k = len(r.texts)
            if not r.future.done():
                r.future.set_result((emb[i : i + k], counts[i : i + k]))
            i += k

    def _embed(self, texts: list[str | list[int]], otel_ctx):
        token = attach_context(otel_ctx)
        try:
            emb = self.session.embed(texts)
            return emb, token_counts(self.session, texts)
        finally:
            detach_context(token)

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._executor.shutdown(wait=True)


def token_counts(session, texts: list[str | list[int]]) -> list[int]:
    """Tokens per input as the encoder saw them (after truncation, without padding)."""
    return [int(c) for c in session.count_tokens(texts)]  # Session.count_tokens: as embed() truncates
