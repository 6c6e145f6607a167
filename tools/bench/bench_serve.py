# SPDX-License-Identifier: Apache-2.0
"""`edgesdk serve` embeddings: dynamic batching vs one request at a time, same server, same clients.

Starts `edgesdk serve BUNDLE` twice on loopback -- `--max-batch 1` (every request runs alone) and the
default dynamic batcher (`--max-batch 32 --max-wait-ms 5`) -- and sends the same N single-sentence
embedding requests from C concurrent asyncio clients (httpx). Prints requests/s for both and the
ratio; writes tools/bench/results/serve_embeddings.json.

    python tools/bench/bench_serve.py out/minilm-cpu --requests 512 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402

SENTENCES = Path(__file__).resolve().parents[2] / "edgesdk" / "data" / "sample_sentences.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bundle: str, extra: list[str], threads: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "edgesdk",
        "serve",
        bundle,
        "--name",
        "m",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ] + (["--threads", str(threads)] if threads else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("server did not start")


async def load(url: str, texts: list[str], n: int, concurrency: int) -> dict:
    latencies: list[float] = []
    errors = 0
    todo = iter(range(n))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def worker():
            nonlocal errors
            for i in todo:
                t0 = time.perf_counter()
                r = await client.post(url + "/v1/embeddings", json={"model": "m", "input": texts[i % len(texts)]})
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "requests": n,
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "req_per_s": round(n / wall, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99) - 1], 2),
        "errors": errors,
    }


def measure(bundle: str, extra: list[str], texts, n, concurrency, threads) -> dict:
    proc, url = start(bundle, extra, threads)
    try:
        asyncio.run(load(url, texts, min(64, n), concurrency))  # warm-up (first runs allocate)
        result = asyncio.run(load(url, texts, n, concurrency))
        metrics = httpx.get(url + "/metrics").text
        for line in metrics.splitlines():
            if line.startswith('edgesdk_serve_embedding_batch_size_count{model="m"}'):
                result["batches_total"] = int(float(line.split()[-1]))
            if line.startswith('edgesdk_serve_embedding_batch_size_sum{model="m"}'):
                result["inputs_total"] = int(float(line.split()[-1]))
        if result.get("batches_total"):
            result["mean_batch"] = round(result["inputs_total"] / result["batches_total"], 2)
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(RESULTS / "serve_embeddings.json"))
    args = ap.parse_args()
    texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    one = measure(args.bundle, ["--max-batch", "1"], texts, args.requests, args.concurrency, args.threads)
    batched = measure(
        args.bundle, ["--max-batch", "32", "--max-wait-ms", "5"], texts, args.requests, args.concurrency, args.threads
    )
    ratio = round(batched["req_per_s"] / one["req_per_s"], 2)
    out = {
        "what": "edgesdk serve /v1/embeddings, one sentence per request, concurrent asyncio httpx clients",
        "bundle": Path(args.bundle).name,
        "machine": machine(),
        "one_at_a_time": one,
        "dynamic_batching": batched,
        "throughput_ratio": ratio,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"one at a time   : {one['req_per_s']} req/s (p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms, "
        f"errors {one['errors']})"
    )
    print(
        f"dynamic batching: {batched['req_per_s']} req/s (p50 {batched['p50_ms']} ms, p99 {batched['p99_ms']} ms, "
        f"mean batch {batched.get('mean_batch')}, errors {batched['errors']})"
    )
    print(f"throughput ratio: {ratio}x")


if __name__ == "__main__":
    main()
