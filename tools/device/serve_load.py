# SPDX-License-Identifier: Apache-2.0
"""Steady load on a running `edgesdk serve`: C clients each send streaming /v1/completions one after another
for D seconds; completion tokens are counted from each stream's `usage` (stream_options.include_usage).

Used to look inside the server under load (tools/device/serve_profile.sh samples it with py-spy meanwhile);
tools/bench/bench_serve_llm.py is the benchmark with its anchors.

    python tools/device/serve_load.py --port 8765 --clients 16 --seconds 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx


async def client(http: httpx.AsyncClient, url: str, i: int, until: float, max_tokens: int, out: dict) -> None:
    k = 0
    while time.perf_counter() < until:
        start = 100 + 37 * (1000 * i + k)
        body = {
            "model": out["model"],
            "prompt": ", ".join(str(start + j) for j in range(12)) + ",",
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        first = None
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                out["errors"] += 1
                await resp.aread()
                continue
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if first is None and doc.get("choices") and doc["choices"][0].get("text"):
                    first = time.perf_counter() - t0
                if doc.get("usage"):
                    out["tokens"] += int(doc["usage"]["completion_tokens"])
        out["requests"] += 1
        if first is not None:
            out["ttft"].append(first)
        k += 1


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=args.clients + 4)) as http:
        model = (await http.get(f"{base}/v1/models")).json()["data"][0]["id"]
        out = {"model": model, "tokens": 0, "requests": 0, "errors": 0, "ttft": []}
        t0 = time.perf_counter()
        until = t0 + args.seconds
        await asyncio.gather(
            *(client(http, f"{base}/v1/completions", i, until, args.max_tokens, out) for i in range(args.clients))
        )
        wall = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "clients": args.clients,
                "requests": out["requests"],
                "errors": out["errors"],
                "completion_tokens": out["tokens"],
                "wall_s": round(wall, 2),
                "tok_s": round(out["tokens"] / wall, 1),
                "ttft_p50_ms": round(1000 * statistics.median(out["ttft"]), 1) if out["ttft"] else None,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
