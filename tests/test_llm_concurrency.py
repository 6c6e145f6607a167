# SPDX-License-Identifier: Apache-2.0
"""One GGUF session shared between threads, on the real Gemma-3-270M Q4_K_M GGUF: concurrent
generate() calls all complete with the same tokens as run one after another (greedy), and a stream
paused while another request used the context raises instead of continuing on foreign state.

The concurrent case runs in a child process: before the context was serialised it killed the
process (SIGABRT/SIGSEGV inside llama.cpp), which must show as a failed test, not a dead pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("llama_cpp")

from cli_fixtures import THREADS  # noqa: E402

from edgesdk.errors import InputError  # noqa: E402

PROMPTS = ["The capital of France is", "Water boils at", "My favourite colour is", "Once upon a time"]

_CHILD = textwrap.dedent("""
    import json, sys, threading
    import edgesdk

    bundle, prompts, rounds, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with edgesdk.load(bundle, threads=threads) as s:
        serial = {p: s.generate(p, max_tokens=8, temperature=0) for p in prompts}
        results, errors = [], []

        def worker(i):
            try:
                for r in range(rounds):
                    p = prompts[(i + r) % len(prompts)]
                    results.append((p, s.generate(p, max_tokens=8, temperature=0)))
            except Exception as exc:  # reported, never swallowed
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"serial": serial, "concurrent": results, "errors": errors}))
""")


@pytest.fixture(scope="module")
def gemma_bundle(gemma_cpu_bundle):
    """tests/conftest.py's Gemma cpu-x86_64 bundle, built once per session (read-only: copy it before changing it)."""
    return gemma_cpu_bundle


@pytest.fixture(scope="module")
def session(gemma_bundle):
    import edgesdk

    with edgesdk.load(gemma_bundle, threads=THREADS) as s:
        yield s


def test_four_threads_share_one_session_in_a_child_process(gemma_bundle):
    rounds = 3
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(gemma_bundle), json.dumps(PROMPTS), str(rounds), str(THREADS)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["errors"] == []
    assert len(doc["concurrent"]) == 4 * rounds
    for prompt, text in doc["concurrent"]:
        assert text == doc["serial"][prompt], (prompt, text, doc["serial"][prompt])  # greedy: token-identical
    assert all(doc["serial"][p].strip() for p in PROMPTS)


def test_a_paused_stream_continues_with_its_own_text_after_another_request(session):
    """A stream is a request of the session's engine: a request made while it is paused waits for a slot (or
    takes another) and never touches its state; the stream then goes on with its own greedy text."""
    reference = "".join(session.stream(PROMPTS[0], max_tokens=12, temperature=0))
    stream = session.stream(PROMPTS[0], max_tokens=12, temperature=0)
    first = next(stream)
    assert reference.startswith(first)
    other = session.generate(PROMPTS[1], max_tokens=6, temperature=0)  # runs while the stream is paused
    assert other.strip() and other == session.generate(PROMPTS[1], max_tokens=6, temperature=0)
    assert first + "".join(stream) == reference
    assert session.backend.last["finish_reason"] in ("length", "stop")


def test_stream_not_interrupted_runs_to_the_end_and_a_closed_one_frees_the_context(session):
    ref = session.generate(PROMPTS[2], max_tokens=8, temperature=0)
    stream = session.stream(PROMPTS[2], max_tokens=8, temperature=0)
    assert "".join(stream) == ref
    stream = session.stream(PROMPTS[3], max_tokens=8, temperature=0)
    next(stream)
    stream.close()  # closed, not superseded: the next request is unaffected
    assert session.generate(PROMPTS[2], max_tokens=8, temperature=0) == ref


def test_stream_and_generate_from_two_threads_never_mix(session):
    """A generate from another thread while a stream is paused: both get their own greedy text."""
    ref_a = session.generate(PROMPTS[0], max_tokens=10, temperature=0)
    ref_b = session.generate(PROMPTS[1], max_tokens=10, temperature=0)
    stream = session.stream(PROMPTS[0], max_tokens=10, temperature=0)
    got: list[str] = [next(stream)]
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("b", session.generate(PROMPTS[1], max_tokens=10, temperature=0)))
    t.start()
    t.join()
    assert out["b"] == ref_b
    got += list(stream)
    assert "".join(got) == ref_a


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": -5}, "max_tokens must be >= 1"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer"),
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"top_p": 0}, "top_p must be > 0"),
        ({"top_p": 1.5}, "top_p must be <= 1"),
        ({"min_p": -0.1}, "min_p must be >= 0"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"repeat_penalty": 0}, "repeat_penalty must be > 0"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be finite"),
        ({"stop": 5}, "stop must be a string"),
        ({"nucleus": 0.9}, "unknown generation option"),
    ],
)
def test_bad_generation_options_are_input_errors(session, kwargs, message):
    with pytest.raises(InputError, match=message):
        session.generate(PROMPTS[0], **kwargs)
