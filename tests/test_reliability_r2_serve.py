# SPDX-License-Identifier: Apache-2.0
"""Issue 25, round two: ``edgesdk serve`` as a network service (findings 4, 5 and 6, port in use).

Every HTTP case runs against a real server on 127.0.0.1 (``edgesdk serve`` or :func:`edgesdk.serve.run`
in a subprocess), bounded in sockets and seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cli_fixtures import THREADS  # noqa: E402
from test_serve import ServerProcess  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server(ServerProcess):
    """A server process from any ``argv`` on ``port`` (a free loopback port), ready when /health answers."""

    def __init__(self, argv: list[str], tmp: Path, port: int):
        super().__init__([], tmp, argv=argv, port=port)


def cli_server(bundles: list, names: list[str], tmp: Path, *extra: str) -> Server:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "edgesdk",
        "serve",
        *map(str, bundles),
        *[a for n in names for a in ("--name", n)],
        "--port",
        str(port),
        "--threads",
        str(THREADS),
        "--log-level",
        "warning",
        *extra,
    ]
    return Server(argv, tmp, port)


def run_server(tmp: Path, **limits) -> Server:
    """``edgesdk.serve.run`` with no models and the given ConnectionLimits: what ``edgesdk serve`` runs."""
    port = free_port()
    code = textwrap.dedent(f"""
        from edgesdk.serve import ConnectionLimits, ServeConfig, run
        run([], ServeConfig(port={port}), log_level="warning", limits=ConnectionLimits(**{limits!r}))
    """)
    return Server([sys.executable, "-c", code], tmp, port)


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server has closed ``sock`` (EOF or reset); reads and drops what it sent first."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ------------------------------------------------------------------------ finding 6: slow and idle clients
HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    srv = run_server(
        tmp_path_factory.mktemp("slowloris"),
        header_timeout_s=2.0,
        body_timeout_s=2.0,
        keep_alive_s=1,
        max_connections=400,
        max_connections_per_client=400,  # 200 slow sockets from one address: the deadlines are under test here
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_slowloris_200_sockets_are_closed_and_others_still_served(guarded):
    """100 sockets that send nothing and 100 that trickle a header byte every 0.3 s: all closed by the
    server within the 2 s header deadline (+ slack), while /health keeps answering at once. Before: none
    was ever closed (uvicorn has no header timeout)."""
    idle = [socket.create_connection(("127.0.0.1", guarded.port)) for _ in range(100)]
    trickle = [socket.create_connection(("127.0.0.1", guarded.port)) for _ in range(100)]
    socks = idle + trickle
    for s in socks:
        s.setblocking(False)
    t0 = time.monotonic()
    health_s: list[float] = []
    open_ = set(range(len(socks)))
    closed_at: dict[int, float] = {}
    byte = 0
    while open_ and time.monotonic() - t0 < 8:
        for i in list(open_):
            if i >= len(idle):
                try:
                    socks[i].send(HEAD[byte % len(HEAD) : byte % len(HEAD) + 1] if byte < len(HEAD) else b"X")
                except OSError:
                    pass
            if closed_by_server(socks[i]):
                open_.discard(i)
                closed_at[i] = time.monotonic() - t0
        byte += 1
        h0 = time.perf_counter()
        assert httpx.get(guarded.url + "/health", timeout=5).status_code == 200
        health_s.append(time.perf_counter() - h0)
        time.sleep(0.3)
    for s in socks:
        s.close()
    assert not open_, f"{len(open_)} of 200 slow sockets still open after 8 s"
    assert max(closed_at.values()) < 2.0 + 3.0, max(closed_at.values())
    assert min(closed_at.values()) > 1.5  # the deadline, not an immediate refusal
    assert max(health_s) < 2.0, max(health_s)  # (typically ~10 ms; slack for a loaded 2-core CI machine)


def test_idle_socket_gets_408_before_the_close(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # head never finished
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_trickled_body_gets_408_within_the_body_deadline(guarded):
    """Headers complete, Content-Length 1000, then 10 bytes every 0.5 s: 408 ~2 s later and the connection
    closed (before: held for as long as the client kept trickling)."""
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as s:
        s.sendall(HEAD + b"Content-Length: 1000\r\n\r\n")
        s.setblocking(False)
        t0, data = time.monotonic(), b""
        while time.monotonic() - t0 < 8:
            try:
                s.send(b"{" + b" " * 9)
            except OSError:
                pass
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            except BlockingIOError:
                pass
            except OSError:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert b"request_timeout" in data
    assert 1.5 < elapsed < 6, elapsed


def test_second_request_head_on_a_kept_alive_connection_has_the_deadline_too(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not first.endswith(b"}"):  # the whole first response (head, then body)
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        t0 = time.monotonic()
        s.setblocking(False)
        closed = False
        for piece in [b"GET /health HTTP/1.1\r\n", *[b"X-A: b\r\n"] * 30]:  # a slow second head
            try:
                s.send(piece)
            except OSError:
                closed = True
                break
            if closed_by_server(s):
                closed = True
                break
            time.sleep(0.25)
        assert closed and time.monotonic() - t0 < 5.0


def test_idle_keep_alive_connection_is_closed(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        t0, data = time.monotonic(), b""
        while chunk := s.recv(65536):  # until the server closes (keep_alive_s=1)
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"}")
        assert 0.5 < time.monotonic() - t0 < 4


def test_connection_cap_refuses_the_excess_with_503_then_recovers(tmp_path):
    """20 connections, each with a request in flight (a head sent, its body not): nothing idle to close, so a
    21st is refused with 503; once the body deadline has closed them, the server answers again."""
    srv = run_server(tmp_path, header_timeout_s=2.0, body_timeout_s=2.0, max_connections=20)
    try:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        for s in held:
            s.sendall(HEAD + b"Content-Length: 100\r\n\r\n")
        time.sleep(0.3)
        refused = httpx.get(srv.url + "/health", timeout=5)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_connections"
        time.sleep(3.0)  # the held requests pass their body deadline: 408 and closed
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        for s in held:
            s.close()
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


# ------------------------------------------------------------- issue 34 item 5: one client's sockets
def _from(address: str, port: int) -> socket.socket:
    """A connection to the server from the loopback ``address`` (Linux answers all of 127.0.0.0/8): another
    client address on this machine."""
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(address, 0))


def test_one_client_re_opening_260_silent_sockets_does_not_lock_out_another(tmp_path):
    """Issue 34 item 5: a client at 127.0.0.2 opens 260 sockets that send nothing and re-opens each one the
    server closes, while a client at 127.0.0.1 asks /health 30 times. Before: the 256-connection cap was
    global, so the other client got 2 answers in 30 tries (0 here). Now 127.0.0.2 holds at most 128 (the
    per-client cap: each new one closes its own longest-idle one) and the other client gets 30 answers of 30."""
    srv = run_server(tmp_path, header_timeout_s=20.0)
    held: list[socket.socket] = []
    try:
        for _ in range(260):
            held.append(_from("127.0.0.2", srv.port))
        time.sleep(0.5)
        for s in held:
            s.setblocking(False)
        answers = 0
        with httpx.Client(timeout=5) as other:
            for _ in range(30):
                for i, s in enumerate(held):  # every socket the server closed is opened again
                    if closed_by_server(s):
                        s.close()
                        held[i] = _from("127.0.0.2", srv.port)
                        held[i].setblocking(False)
                r = other.get(srv.url + "/health", headers={"connection": "close"})
                answers += r.status_code == 200
        time.sleep(0.3)
        still_open = sum(not closed_by_server(s) for s in held)
        assert answers == 30, f"{answers} answers in 30 tries"
        assert still_open <= 128, still_open
    finally:
        for s in held:
            s.close()
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_a_full_table_closes_the_connection_idle_the_longest(tmp_path):
    """At the global cap (20 here), a new connection makes room by closing the one that has waited longest
    for a request head (it gets a 503 saying why), not by being refused; connections with a request in
    flight are kept."""
    srv = run_server(tmp_path, header_timeout_s=20.0, body_timeout_s=20.0, max_connections=20)
    try:
        busy = [_from("127.0.0.3", srv.port) for _ in range(10)]
        for s in busy:
            s.sendall(HEAD + b"Content-Length: 100\r\n\r\n")  # a request in flight: not idle
        time.sleep(0.2)
        idle = []
        for _ in range(10):
            idle.append(_from("127.0.0.2", srv.port))
            time.sleep(0.05)  # in order: idle[0] has waited longest
        time.sleep(0.3)
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        idle[0].settimeout(5)
        data = idle[0].recv(65536)
        assert data.startswith(b"HTTP/1.1 503 ") and b"closed while idle" in data, data[:200]
        for s in idle[1:] + busy:
            s.setblocking(False)
        assert not any(closed_by_server(s) for s in idle[1:] + busy)
        for s in idle + busy:
            s.close()
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_the_connection_cap_fits_the_file_descriptor_limit(monkeypatch):
    """1,024 connections by default; where ulimit -n cannot hold them (a soft limit of 1,024 is common) the
    soft limit is raised towards the hard one, and the cap lowered only when the hard one is too low."""
    import resource

    from edgesdk.serve import FD_RESERVE, ConnectionLimits, ServeConfig, connection_cap

    assert ConnectionLimits().max_connections == ServeConfig().max_connections == 1024
    assert ConnectionLimits().max_connections_per_client == ServeConfig().max_connections_per_client == 128
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    assert connection_cap(1024) == 1024 and calls == [(1024 + FD_RESERVE, 4096)]
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    assert connection_cap(1024) == 1024 - FD_RESERVE


def test_body_after_100_continue_is_not_taken_for_a_slow_head(tmp_path):
    """`Expect: 100-continue` (curl sends it for large bodies): the body that follows the interim answer
    belongs to the request, so the header deadline (1 s here) must not close the connection while a body
    sent within the body deadline (5 s) is still arriving."""
    srv = run_server(tmp_path, header_timeout_s=1.0, body_timeout_s=5.0)
    try:
        body = json.dumps({"model": "absent", "input": ["x" * 30]}).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(HEAD + b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            interim = s.recv(4096)
            assert interim.startswith(b"HTTP/1.1 100"), interim
            for i in range(3):  # the body in three parts over 2.4 s: past the header deadline
                s.sendall(body[i * len(body) // 3 : (i + 1) * len(body) // 3])
                time.sleep(0.8)
            reply = s.recv(65536)
        assert reply.startswith(b"HTTP/1.1 404 "), reply[:200]  # the request was answered: model not found
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


# ------------------------------------------------------------------------ port in use
def test_port_in_use_is_one_error_line_and_exit_3(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = textwrap.dedent(f"""
            import sys
            from edgesdk.errors import EdgeSDKError
            from edgesdk.serve import ServeConfig, run
            try:
                run([], ServeConfig(port={port}))
            except EdgeSDKError as exc:
                print("error: " + exc.one_line(), file=sys.stderr)
                sys.exit(exc.exit_code)
        """)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: the address is already in use (another server? pick another --port)"
    ], res.stderr


# ------------------------------------------------------------------------ findings 4 and 5: embeddings
@pytest.fixture(scope="module")
def minilm_fp32(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


@pytest.fixture(scope="module")
def minilm_int8(minilm_cpu_int8):
    """tests/conftest.py's INT8, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_int8


@pytest.fixture(scope="module")
def embed_server(minilm_fp32, minilm_int8, tmp_path_factory):
    # a long batch window, so 32 concurrent requests really meet in the batcher
    tmp = tmp_path_factory.mktemp("r2-embed")
    idle = None
    srv = cli_server([minilm_fp32, minilm_int8], ["fp32", "int8"], tmp, "--max-wait-ms", "200")
    idle = socket.create_connection(("127.0.0.1", srv.port))  # checked at the end: the CLI's header deadline
    idle.setblocking(False)
    srv.idle_socket, srv.idle_since = idle, time.monotonic()
    yield srv
    idle.close()
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _sentences(n: int, seed: int) -> list[str]:
    from edgesdk.formats.onnx import parity as P

    return random.Random(seed).sample(P.sample_sentences(300), n)


async def _alone_and_among_strangers(url: str, model: str, target: str, strangers: list[str]):
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(text: str):
            r = await client.post("/v1/embeddings", json={"model": model, "input": [text]})
            r.raise_for_status()
            return r.json()["data"][0]["embedding"]

        alone = await one(target)
        texts = list(strangers)
        pos = len(texts) // 2
        texts.insert(pos, target)
        together = await asyncio.gather(*(one(t) for t in texts))
        return alone, together[pos]


def _batch_stats(url: str, model: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text

    def series(name: str) -> float:
        found = re.search(
            rf'^edgesdk_serve_embedding_batch_size_{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M
        )
        return float(found.group(1)) if found else 0.0

    return series("sum"), series("count")


@pytest.mark.slow
def test_fp32_vector_does_not_depend_on_strangers_texts(embed_server):
    """The same text alone and among 31 concurrent strangers' requests (batched together: mean batch > 1).
    FP32 was already within rounding before (cosine 1.0 to 6 digits); this guards the shared-batch path."""
    worst = 1.0
    s0, c0 = _batch_stats(embed_server.url, "fp32")
    for trial in range(3):
        texts = _sentences(32, seed=trial)
        alone, among = asyncio.run(_alone_and_among_strangers(embed_server.url, "fp32", texts[0], texts[1:]))
        worst = min(worst, _cos(alone, among))
    s1, c1 = _batch_stats(embed_server.url, "fp32")
    assert (s1 - s0) / max(c1 - c0, 1) > 1.5, "requests were not batched together: the test proves nothing"
    assert worst >= 0.9999, worst


@pytest.mark.slow
def test_int8_vector_does_not_depend_on_strangers_texts(embed_server, minilm_int8):
    """INT8 scales activations per batch: before, a stranger's text in the batch moved the vector (worst
    cosine 0.9971 over HTTP with these texts, 0.9944 through the batcher directly, the issue's 0.9918: under
    the bundle's own 0.995). Now each request runs alone on a quantized bundle: the vector equals the one
    computed alone (cosine 1.0), so the >= 0.9999 assertion failed before and holds now."""
    threshold = json.loads((minilm_int8 / "manifest.json").read_text())["parity"]["int8"]["thresholds"]["min_cosine"]
    worst = 1.0
    for trial in range(4):
        texts = _sentences(32, seed=100 + trial)
        alone, among = asyncio.run(_alone_and_among_strangers(embed_server.url, "int8", texts[0], texts[1:]))
        worst = min(worst, _cos(alone, among))
    assert worst >= threshold, (worst, threshold)
    assert worst >= 0.9999, worst


@pytest.mark.slow
def test_1500_inputs_succeed_on_an_idle_server(embed_server):
    """Request limit 2,048 inputs, pending limit 1,024: 1,025-2,048 inputs were 429 '0 queued' for ever."""
    texts = [f"sentence number {i} about nothing much" for i in range(1500)]
    r = httpx.post(embed_server.url + "/v1/embeddings", json={"model": "fp32", "input": texts}, timeout=300)
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["data"]) == 1500
    r = httpx.post(embed_server.url + "/v1/embeddings", json={"model": "fp32", "input": ["x"] * 2049}, timeout=60)
    assert r.status_code == 400  # the request limit itself is unchanged


@pytest.mark.slow
def test_cli_server_closes_an_idle_connection(embed_server):
    """`edgesdk serve` runs with the default header deadline (10 s): the socket opened at start is closed."""
    deadline = embed_server.idle_since + 10 + 5
    while time.monotonic() < deadline and not closed_by_server(embed_server.idle_socket):
        time.sleep(0.2)
    assert closed_by_server(embed_server.idle_socket)


# ------------------------------------------------------------------------ soak: memory stays flat
def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _soak(url: str, port: int, n: int, seed: int) -> dict[str, int]:
    """``n`` requests, 8 at a time: embeddings, embeddings abandoned mid-flight, trickled (slow) clients,
    the plain routes, and refusals (404, 415, 413, bad JSON). Returns a count per outcome."""
    rng = random.Random(seed)
    texts = _sentences(64, seed=seed)
    outcomes: dict[str, int] = {}
    sem = asyncio.Semaphore(8)

    async def raw(payload: bytes, *, trickle: bool = False, read: bool = True) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            if trickle:  # a slow client: the head in pieces, 50 ms apart
                for i in range(0, len(payload), max(1, len(payload) // 6)):
                    writer.write(payload[i : i + max(1, len(payload) // 6)])
                    await writer.drain()
                    await asyncio.sleep(0.05)
            else:
                writer.write(payload)
                await writer.drain()
            return await asyncio.wait_for(reader.read(1 << 16), 30) if read else b""
        finally:
            writer.close()

    def body(obj) -> bytes:
        data = json.dumps(obj).encode()
        return (
            b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
        )

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(i: int) -> None:
            kind = rng.choices(
                ["embed", "abandon", "slow", "health", "models", "metrics", "404", "415", "413", "badjson"],
                [40, 10, 10, 10, 10, 4, 4, 4, 4, 4],
            )[0]
            async with sem:
                if kind == "embed":
                    r = await client.post(
                        "/v1/embeddings", json={"model": "fp32", "input": rng.sample(texts, rng.randint(1, 4))}
                    )
                    status = r.status_code
                elif kind == "abandon":  # sent, then the socket is closed before the answer
                    await raw(body({"model": "fp32", "input": rng.sample(texts, 4)}), read=False)
                    status = 0
                elif kind == "slow":
                    reply = await raw(
                        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", trickle=True
                    )
                    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else -1
                elif kind in ("health", "models", "metrics", "404"):
                    path = {"health": "/health", "models": "/v1/models", "metrics": "/metrics", "404": "/v1/nothing"}[
                        kind
                    ]
                    status = (await client.get(path)).status_code
                elif kind == "415":
                    status = (
                        await client.post("/v1/embeddings", content=b"{}", headers={"content-type": "text/plain"})
                    ).status_code
                elif kind == "413":
                    status = (
                        await client.post("/v1/embeddings", json={"model": "fp32", "input": "x" * (1 << 20)})
                    ).status_code
                else:
                    status = (
                        await client.post(
                            "/v1/embeddings",
                            content=b'{"model": "fp32", "input": [',
                            headers={"content-type": "application/json"},
                        )
                    ).status_code
            key = f"{kind} {status}"
            outcomes[key] = outcomes.get(key, 0) + 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return outcomes


@pytest.mark.slow
def test_soak_2000_mixed_requests_rss_stays_flat(minilm_fp32, tmp_path):
    """2,000 mixed requests after a 500-request warm-up: the server's RSS at each 500 stays within 10 MB of
    the level after warm-up, and no request gets a 5xx."""
    srv = cli_server([minilm_fp32], ["fp32"], tmp_path)
    try:
        warm = asyncio.run(_soak(srv.url, srv.port, 500, seed=1))
        base = _rss_mb(srv.proc.pid)
        samples, outcomes = [], dict(warm)
        for round_ in range(4):
            for k, v in asyncio.run(_soak(srv.url, srv.port, 500, seed=10 + round_)).items():
                outcomes[k] = outcomes.get(k, 0) + v
            samples.append(round(_rss_mb(srv.proc.pid) - base, 1))
        print(f"RSS after warm-up {base:.1f} MB; growth per 500 requests: {samples}; outcomes: {outcomes}")
        assert not [k for k in outcomes if k.split()[1].startswith("5")], outcomes
        assert outcomes.get("embed 200", 0) > 600 and outcomes.get("slow 200", 0) > 100
        assert max(samples) <= 10.0, samples
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.mark.slow
def test_cli_serve_on_a_taken_port_is_one_error_line(minilm_fp32):
    """Before: exit 3 with uvicorn's log ('[Errno 98] ... address already in use') and no `error:` line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "edgesdk", "serve", str(minilm_fp32), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert res.returncode == 3, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        f"error: cannot listen on 127.0.0.1:{port}: the address is already in use (another server? pick another --port)"
    ], res.stderr
    assert "Traceback" not in res.stderr and "INFO" not in res.stderr and "Errno" not in res.stderr, res.stderr
