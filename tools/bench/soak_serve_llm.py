# SPDX-License-Identifier: Apache-2.0
"""Soak of `edgesdk serve` on an LLM bundle: does the server's RSS stay flat?

Starts `edgesdk serve BUNDLE` as a user does (continuous batching by default; `--parallel 1` for the
one-request-at-a-time worker with its prompt cache), sends --warmup requests, then --rounds rounds of
--requests requests from --concurrency asyncio clients, and samples the server's RSS (/proc/PID/status
VmRSS) after each round. The mix per request (seeded): completions and chat completions, streamed and
not, a client that reads two chunks then goes away, one that disconnects before the answer, a stop
string, and with --slow-clients a client that trickles its request head over ~0.3 s (raw socket) and
one that asks for /v1/models or /health.
Reported: RSS growth per round against the level after warm-up (sampled 1 s after the round), the highest
RSS sampled every 0.5 s during each round (over the same level), status counts, cancelled count.

    python tools/bench/soak_serve_llm.py BUNDLE --requests 600 --rounds 3 --concurrency 8

Writes tools/bench/results/soak_serve_llm_cpu.json (--out to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402
from bench_serve import free_port  # noqa: E402


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr]


async def trickled(url: str, body: dict) -> str:
    """POST /v1/completions from a slow client: the request head in six pieces 50 ms apart, then the body."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        step = max(1, len(head) // 6)
        for k in range(0, len(head), step):
            writer.write(head[k : k + step])
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(data)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 120)
    finally:
        writer.close()
    return reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/1.1 ") else "no-answer"


async def one(client: httpx.AsyncClient, url: str, rng: random.Random, i: int, slow_clients: bool = False) -> str:
    kinds = ["completion", "completion_stream", "chat", "chat_stream", "abandon_stream", "abandon", "stop"]
    kind = rng.choice(kinds + (["slow", "route"] if slow_clients else []))
    if kind == "route":
        path = rng.choice(["/v1/models", "/health"])
        return f"{kind} {(await client.get(url + path)).status_code}"
    chat = kind.startswith("chat")
    route = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict = {"model": "m", "max_tokens": rng.choice([1, 2, 4]), "temperature": rng.choice([0, 0.7])}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Request {i}: name a river."}]
    else:
        body["prompt"] = f"Request {i}: the river"
    if kind.endswith("stream") or kind == "abandon_stream":
        body["stream"] = True
    if kind == "stop":
        body.update(stop=["\n"], max_tokens=8)
    if kind == "slow":
        try:
            return f"{kind} {await trickled(url, body)}"
        except (OSError, asyncio.TimeoutError) as exc:
            return f"{kind} {type(exc).__name__}"
    if kind == "abandon_stream":
        body["max_tokens"] = 64
        try:
            async with client.stream("POST", url + route, json=body) as r:
                n = 0
                async for _line in r.aiter_lines():
                    n += 1
                    if n >= 2:
                        break  # leave mid-stream
            return f"{kind} {r.status_code}"
        except httpx.HTTPError as exc:
            return f"{kind} {type(exc).__name__}"
    if kind == "abandon":
        body["max_tokens"] = 64
        try:
            await client.post(url + route, json=body, timeout=0.05)
            return f"{kind} answered"
        except httpx.TimeoutException:
            return f"{kind} left"
    try:
        r = await client.post(url + route, json=body) if not body.get("stream") else None
        if r is None:
            async with client.stream("POST", url + route, json=body) as s:
                async for _line in s.aiter_lines():
                    pass
                return f"{kind} {s.status_code}"
        return f"{kind} {r.status_code}"
    except httpx.HTTPError as exc:
        return f"{kind} {type(exc).__name__}"


async def wave(url: str, n: int, concurrency: int, seed: int, slow_clients: bool = False) -> dict[str, int]:
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    todo = iter(range(n))
    async with httpx.AsyncClient(timeout=120) as client:

        async def worker() -> None:
            for i in todo:
                key = await one(client, url, rng, i, slow_clients)
                counts[key] = counts.get(key, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None, help="serve --parallel (default: the server decides)")
    ap.add_argument("--slow-clients", action="store_true", help="add trickled requests and /v1/models, /health")
    ap.add_argument("--out", default=str(RESULTS / "soak_serve_llm_cpu.json"))
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "serve",
            args.bundle,
            "--name",
            "m",
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--log-level",
            "warning",
            "--max-queue",
            str(4 * args.concurrency),
            *(["--parallel", str(args.parallel)] if args.parallel else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        t0 = time.perf_counter()
        totals = asyncio.run(wave(url, args.warmup, args.concurrency, 1, args.slow_clients))
        base = rss_mb(proc.pid)
        growth, peaks = [], []
        for r in range(args.rounds):
            peak, stop = [0.0], threading.Event()

            def sample(peak=peak, stop=stop) -> None:  # RSS every 0.5 s while the round runs
                while not stop.wait(0.5):
                    peak[0] = max(peak[0], rss_mb(proc.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            for k, v in asyncio.run(wave(url, args.requests, args.concurrency, 100 + r, args.slow_clients)).items():
                totals[k] = totals.get(k, 0) + v
            stop.set()
            sampler.join()
            peaks.append(round(peak[0] - base, 1))
            time.sleep(1.0)  # let cancelled requests leave their slots
            growth.append(round(rss_mb(proc.pid) - base, 1))
            print(f"round {r + 1}: RSS {base + growth[-1]:.1f} MB ({growth[-1]:+.1f} MB over warm-up)", flush=True)
        metrics = httpx.get(url + "/metrics", timeout=10).text
        busy = re.search(r'^edgesdk_serve_slots_busy\{model="m"\} (\S+)$', metrics, re.M)
        cancelled = re.search(r'^edgesdk_serve_cancelled_total\{model="m"\} (\S+)$', metrics, re.M)
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(60)
    fives = {k: v for k, v in totals.items() if k.split()[-1].startswith("5")}
    mode = "one request at a time" if args.parallel == 1 else "continuous batching"
    out = {
        "what": f"edgesdk serve ({mode}) LLM soak: RSS per round over the level after warm-up",
        "bundle": Path(args.bundle).name,
        "machine": machine(),
        "settings": vars(args),
        "rss_after_warmup_mb": round(base, 1),
        "growth_mb_per_round": growth,
        "peak_during_round_mb_over_warmup": peaks,
        "outcomes": totals,
        "server_5xx": fives,
        "slots_busy_at_end": float(busy.group(1)) if busy else None,
        "cancelled_total": float(cancelled.group(1)) if cancelled else None,
        "wall_s": round(wall, 1),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"RSS after warm-up {base:.1f} MB, growth per {args.requests} requests {growth}; 5xx {fives or 'none'}; "
        f"slots busy at the end {out['slots_busy_at_end']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
