# SPDX-License-Identifier: Apache-2.0
"""VLM image chats through the one llama.cpp engine (issue 35): concurrent chats and a repeated image's TTFT.

Model: the random-weight LLaVA of tools/bench/bench_vlm.py (``--size small``: SigLIP 224 px / 14 px patches, 256 image
tokens, a 6-layer 768-wide llama decoder; ``large`` on a GPU: a TinyLlama-1.1B-shaped decoder), built by
``edgesdk build --quant-type Q4_K_M`` (the real build: conversion, parity, license gate). RANDOM weights: the text
is meaningless; every chat generates exactly ``--max-tokens`` tokens (end-of-generation biased away, greedy).

Each chat is what ``edgesdk serve`` does with an OpenAI chat request: a user turn with an image (PNG bytes) and a
question, made into the engine's request by ``VLMBackend.encode`` (preprocess, tokenize, encode the image: libmtmd's
mmproj) on the client's thread, then run by the model's :class:`~edgesdk.runtime.batching.BatchEngine` with
``max(--clients)`` slots, where the image is evaluated inside the request's slot and its text batched with the other
chats'.

1. Concurrency: for each client count (``--clients``, default 1,2,4), that many closed-loop clients for
   ``--duration`` seconds, each chat about a NEW image (``cold``: preprocess + encode + image prefill every chat) and,
   as a second workload, each client about its OWN image again and again (``repeat``: the image's features cached,
   its KV cells evaluated anew: prefix reuse off); ``text``, a control: the same chats without an image (the
   decoder's own batching on this machine). Aggregate output tok/s = every chat's tokens / (last chat's end - start);
   the ratio is against the 1-client rate of the same workload in the same run.
2. TTFT of a repeated image vs a cold one (one client, ``--ttft-rounds`` alternating rounds): cold = an image never
   seen (preprocess + encode + prefill); repeated = the same image bytes with the next question (features cached, the
   slot's KV prefix reused, as a chat client re-sending the image every turn gets), and repeated without the prefix
   (``forget_prefixes``: the features only). TTFT is from before ``encode`` to the engine's first token. Medians.

Usage: python tools/bench/bench_vlm_concurrency.py [--size small] [--quant Q4_K_M] [--threads 2] [--n-gpu-layers 0]
       [--clients 1,2,4] [--duration 15] [--max-tokens 64] [--ttft-rounds 5] [--workloads cold,repeat,text] [--work DIR]
       [--out tools/bench/results/vlm_concurrency_cpu.json]
On the GPU machine: ``--size large --n-gpu-layers -1 --clients 1,2,4,8``
(``--out tools/bench/results/vlm_concurrency_gpu.json``).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import edgesdk  # noqa: E402  before numpy: preloads a CUDA libllama first (see edgesdk/__init__.py)

QUESTIONS = ["What is on the table?", "What colour is the largest shape?", "How many objects are there?"]


def image_bytes(seed: int) -> bytes:
    """A PNG of random shapes on a random background: a different image (and features) for every seed."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (320, 240), tuple(int(v) for v in rng.integers(0, 256, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x, y = int(rng.integers(0, 260)), int(rng.integers(0, 180))
        draw.ellipse((x, y, x + 60, y + 60), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


class Chats:
    """Image chats through the session's engine, as the server runs them (``encode`` then ``submit``)."""

    def __init__(self, session, max_tokens: int):
        from edgesdk.runtime.requests import GenerationRequest

        self.backend = session.backend
        self.max_tokens = max_tokens
        self._request = GenerationRequest

    def one(self, image: bytes | None, question: str) -> dict:
        eos = self.backend.engine.eos
        request = self._request.from_options(
            messages=[{"role": "user", "content": question}],
            max_tokens=self.max_tokens,
            temperature=0,
            logit_bias={eos: -100},  # a fixed-length reply: every chat generates max_tokens tokens
        )
        parts = [{"type": "image", "image": image}] if image is not None else []
        messages = [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
        t0 = time.perf_counter()
        mm = self.backend.encode(request, messages)
        res = self.backend.engine.submit(mm).result()
        if res.finish_reason not in ("length", "stop"):
            raise RuntimeError(f"chat ended with {res.finish_reason}: {res.error}")
        return {
            "t0": t0,
            "ttft_s": res.first_token_at - t0 if res.first_token_at else None,
            "end": res.finished_at,
            "tokens": len(res.tokens),
            "prompt_tokens": res.prompt_tokens,
            "cached_tokens": res.cached_tokens,
        }


def run_clients(chats: Chats, clients: int, duration: float, workload: str, seed0: int) -> dict:
    """``clients`` closed-loop clients for ``duration`` seconds; each chat about a new image (cold) or the client's
    own image again (repeat)."""
    done: list[dict] = []
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + duration
    errors: list[BaseException] = []

    def client(k: int) -> None:
        own = image_bytes(seed0 + k)
        i = 0
        try:
            while time.perf_counter() < stop_at:
                img = own if workload == "repeat" else image_bytes(seed0 + 1000 * (k + 1) + i)
                img = None if workload == "text" else img
                got = chats.one(img, QUESTIONS[i % len(QUESTIONS)])
                with lock:
                    done.append(got)
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported after the threads stop
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    wall = max(d["end"] for d in done) - start
    tokens = sum(d["tokens"] for d in done)
    return {
        "clients": clients,
        "workload": workload,
        "chats": len(done),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "chats_per_s": round(len(done) / wall, 3),
        "ttft_ms_median": round(statistics.median(d["ttft_s"] for d in done) * 1e3, 1),
        "prompt_tokens": done[0]["prompt_tokens"],
    }


def ttft_rounds(session, chats: Chats, rounds: int) -> dict:
    """Cold vs repeated image, one client, alternating: TTFT medians (ms) and their ratios."""
    backend = session.backend
    cold, repeat, repeat_no_prefix = [], [], []
    for r in range(rounds):
        img = image_bytes(900_000 + r)  # never seen before
        backend.engine.forget_prefixes()
        cold.append(chats.one(img, QUESTIONS[0])["ttft_s"])
        repeat.append(chats.one(img, QUESTIONS[1])["ttft_s"])  # features cached, the slot's prefix reused
        backend.engine.forget_prefixes()
        repeat_no_prefix.append(chats.one(img, QUESTIONS[2])["ttft_s"])  # features cached only
    med = {
        k: statistics.median(v) * 1e3 for k, v in (("cold", cold), ("repeat", repeat), ("features", repeat_no_prefix))
    }
    return {
        "rounds": rounds,
        "cold_ms_median": round(med["cold"], 2),
        "repeated_ms_median": round(med["repeat"], 2),
        "repeated_features_only_ms_median": round(med["features"], 2),
        "cold_over_repeated": round(med["cold"] / med["repeat"], 2),
        "cold_over_features_only": round(med["cold"] / med["features"], 2),
        "cold_ms": [round(x * 1e3, 2) for x in cold],
        "repeated_ms": [round(x * 1e3, 2) for x in repeat],
        "repeated_features_only_ms": [round(x * 1e3, 2) for x in repeat_no_prefix],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=("small", "medium", "large"))
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--profile", default="cpu-x86_64", help="the build's profile")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="-1: every layer on the GPU")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per point of the curve")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-rounds", type=int, default=5)
    ap.add_argument("--workloads", default="cold,repeat,text")
    ap.add_argument("--work", default=None, help="where the model and bundle are made (and reused)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import bench_vlm

    clients = [int(c) for c in args.clients.split(",")]
    work = Path(args.work or Path(tempfile.gettempdir()) / "edgesdk-bench-vlm-concurrency")
    model = work / f"model-{args.size}"
    if not (model / "config.json").is_file():
        bench_vlm.make_model(model, args.size)
    bundle = work / f"bundle-{args.size}-{args.quant.lower()}"
    build = bench_vlm.build_bundle(model, bundle, args.quant, reuse=True, profile=args.profile)
    session = edgesdk.load(bundle, threads=args.threads, n_gpu_layers=args.n_gpu_layers, n_ctx=1024)
    try:
        slots = max(clients)
        engine = session.backend.batch_engine(slots=slots, max_queue=64, reuse_prefix=False)
        engine_settings = dict(engine.settings, reuse_prefix=False)
        chats = Chats(session, args.max_tokens)
        chats.one(image_bytes(1), QUESTIONS[0])  # warm-up
        curve = []
        for workload in args.workloads.split(","):
            anchor = None
            for n in clients:
                point = run_clients(chats, n, args.duration, workload, seed0=10_000 * n)
                anchor = anchor or point["tok_s"]
                point["ratio_vs_1_client"] = round(point["tok_s"] / anchor, 3)
                curve.append(point)
                print(
                    f"{workload:6s} {n} clients: {point['tok_s']:8.2f} tok/s ({point['ratio_vs_1_client']:.2f}x one "
                    f"client), {point['chats']} chats, TTFT median {point['ttft_ms_median']:.0f} ms",
                    flush=True,
                )
        session.backend.batch_engine(slots=1, max_queue=64, reuse_prefix=True)
        ttft = ttft_rounds(session, chats, args.ttft_rounds)
        print(
            f"TTFT cold {ttft['cold_ms_median']:.1f} ms, repeated image {ttft['repeated_ms_median']:.1f} ms "
            f"({ttft['cold_over_repeated']:.2f}x lower), features only {ttft['repeated_features_only_ms_median']:.1f} "
            f"ms ({ttft['cold_over_features_only']:.2f}x)",
            flush=True,
        )
        report = session.report()["backend_report"]
    finally:
        session.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    result = {
        "bench": "vlm_concurrency",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip() or None,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),  # the machine is shared: other work shows here
        },
        "model": {
            "size": args.size,
            "quant": args.quant,
            "prompt_tokens": curve[0]["prompt_tokens"] if curve else None,
        },
        "build": build,
        "settings": {
            "threads": args.threads,
            "n_gpu_layers": args.n_gpu_layers,
            "slots": max(clients),
            "duration_s": args.duration,
            "max_tokens": args.max_tokens,
            "engine": engine_settings,
            "vision_encoder": report.get("vision_encoder", {}).get("runtime"),
        },
        "concurrency": curve,
        "ttft": ttft,
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
