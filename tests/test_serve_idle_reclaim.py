# SPDX-License-Identifier: Apache-2.0
"""Issue 25 (serve RSS with --parallel 1): the LLM worker gives memory back when its queue drains, and a
request's disconnect watch is no reference cycle. Fast: no model, fake sessions."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import weakref

import pytest

from edgesdk.serve.routes import _Events
from edgesdk.serve.workers import IdleReclaim, Job, LLMWorker, _malloc_trim


class _Recorder(IdleReclaim):
    def __init__(self) -> None:
        super().__init__(min_interval_s=0.0, busy_interval_s=3600.0, trim=lambda _pad: 0, collect=lambda: 0)
        self.calls: list[bool] = []
        self.drained = threading.Event()

    def after_job(self, queue_empty: bool) -> bool:
        self.calls.append(queue_empty)
        if queue_empty:
            self.drained.set()
        return super().after_job(queue_empty)


def test_llm_worker_reclaims_after_its_queue_drains_not_between_queued_jobs() -> None:
    async def main() -> _Recorder:
        loop = asyncio.get_running_loop()
        gate = threading.Event()

        def first():
            gate.wait(10)  # the other jobs queue up behind this one
            return iter(["a"])

        reclaim = _Recorder()
        worker = LLMWorker("m", session=object(), max_queue=8, reclaim=reclaim)
        try:
            jobs = [Job(start=first, loop=loop, events=asyncio.Queue())]
            jobs += [Job(start=lambda: iter(["b"]), loop=loop, events=asyncio.Queue()) for _ in range(2)]
            for job in jobs:
                worker.submit(job)
            gate.set()
            for job in jobs:
                while (await job.events.get())[0] != "done":
                    pass
            assert await loop.run_in_executor(None, reclaim.drained.wait, 10)
        finally:
            worker.close()
        return reclaim

    reclaim = asyncio.run(main())
    assert reclaim.calls == [False, False, True]  # two jobs still queued, then drained
    assert reclaim.runs == 1  # busy: not before busy_interval_s; drained: at once (min_interval_s 0)


def test_idle_reclaim_collects_then_trims_and_is_rate_limited() -> None:
    order: list[str] = []
    r = IdleReclaim(
        min_interval_s=0.0,
        busy_interval_s=3600.0,
        trim=lambda pad: order.append(f"trim {pad}") or 1,
        collect=lambda: order.append("collect") or 0,
    )
    assert r.after_job(queue_empty=False) is False  # busy, and the busy interval has not passed
    assert r.after_job(queue_empty=True) is True
    assert order == ["collect", "trim 0"]
    slow = IdleReclaim(min_interval_s=3600.0, trim=lambda pad: 1, collect=lambda: 0)
    assert slow.after_job(queue_empty=True) is False  # at most once per min_interval_s
    assert slow.runs == 0


def test_llm_worker_has_a_default_reclaim() -> None:
    worker = LLMWorker("m", session=object(), max_queue=1)
    try:
        assert isinstance(worker.reclaim, IdleReclaim)
    finally:
        worker.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_malloc_trim_found_on_linux_glibc() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    trim = _malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)


def test_disconnect_watch_is_no_reference_cycle() -> None:
    """A cancelled watch task keeps its CancelledError, whose traceback keeps the watch coroutine's frame: the
    frame must not hold the _Events (which holds the task), or every request waits for the cycle collector."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        never = asyncio.Event()

        async def receive():
            await never.wait()

        job = Job(start=lambda: iter(()), loop=loop, events=asyncio.Queue())
        events = _Events([job], receive)
        await asyncio.sleep(0)  # the watch task is waiting in receive()
        assert await events.unwatch() is False
        ref = weakref.ref(events)
        del events
        assert ref() is None, gc.get_referrers(ref())

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()


def test_a_drain_put_off_by_the_rate_limit_is_reclaimed_once_idle() -> None:
    """The queue drains less than min_interval_s after the last run: the worker runs it when allowed, without
    waiting for another job (else an idle server could keep the last burst's garbage)."""

    async def main() -> _Recorder:
        loop = asyncio.get_running_loop()
        reclaim = _Recorder()
        reclaim.min_interval_s = 1.0  # just created: the first drain comes sooner and is put off
        worker = LLMWorker("m", session=object(), max_queue=2, reclaim=reclaim)
        try:
            job = Job(start=lambda: iter(["a"]), loop=loop, events=asyncio.Queue())
            worker.submit(job)
            while (await job.events.get())[0] != "done":
                pass

            def first_run() -> int:
                deadline = time.monotonic() + 10
                while reclaim.runs < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                return reclaim.runs

            assert await loop.run_in_executor(None, first_run) == 1
        finally:
            worker.close()
        return reclaim

    reclaim = asyncio.run(main())
    assert reclaim.calls == [True, True]  # put off after the job, then run while idle
