# SPDX-License-Identifier: Apache-2.0
"""VLM families on the CPU (issue 21): bundle size per component, parity figures, TTFT and decode tok/s.

Models: the random-weight test fixtures of tests/vlm_fixtures.py, one per family: LLaVA with a SigLIP tower
(``make_tiny_llava``), LLaVA-1.5 with a CLIP tower (``make_tiny_llava15``: 336 px, 576 image tokens), SmolVLM /
Idefics3 without and with image splitting (``make_tiny_idefics3``), Gemma-3 vision (``make_tiny_gemma3``: 224 px,
16 image tokens), Qwen2.5-VL (tests/test_qwen25vl.py ``make_tiny_qwen25vl``: dynamic resolution, the 120x80 image
is 12 image tokens) and Qwen2-VL (``make_tiny_qwen2vl``, same sizes). RANDOM weights: the text is meaningless.

A dynamic-resolution family (image tokens depend on the image) is also measured on the family's parity image
sizes (``by_size``: image tokens, TTFT and encoder time per size, same rounds).

Per family: ``edgesdk build --profile cpu-x86_64`` (the profile's own decoder quantization, every parity gate),
then the artifact sizes and the build's parity record; then one process loads the bundle with ``threads`` (2),
one warm-up request, and ``rounds`` cold requests (image features and KV cache cleared before each) about the
same 120x80 image, greedy, ``max_tokens`` new tokens: TTFT (``last_request.ttft_s``: preprocess + encode +
prefill + the first token) and decode tok/s (``decode_tok_s``: tokens after the first / their time), medians
and best rounds (on a shared machine the best round is the least disturbed one).

Usage: python tools/bench/bench_vlm_families.py [--threads 2] [--rounds 5] [--max-tokens 32] [--profile P]
       [--n-gpu-layers N] [--families a,b]
       [--out tools/bench/results/vlm_families_cpu.json]
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
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import _cpu_model  # noqa: E402

import edgesdk  # noqa: E402

FAMILIES = {
    "llava-siglip": lambda d: __import__("vlm_fixtures").make_tiny_llava(d),
    "llava-1.5-clip": lambda d: __import__("vlm_fixtures").make_tiny_llava15(d),
    "smolvlm": lambda d: __import__("vlm_fixtures").make_tiny_idefics3(d),
    "smolvlm-split": lambda d: __import__("vlm_fixtures").make_tiny_idefics3(d, image_splitting=True),
    "gemma3": lambda d: __import__("vlm_fixtures").make_tiny_gemma3(d),
    "qwen25vl": lambda d: __import__("test_qwen25vl").make_tiny_qwen25vl(d),
    "qwen2vl": lambda d: __import__("test_qwen25vl").make_tiny_qwen2vl(d),
}


def measure(
    name: str,
    work: Path,
    threads: int,
    rounds: int,
    max_tokens: int,
    image: Path,
    profile: str = "cpu-x86_64",
    n_gpu_layers: int | None = None,
) -> dict:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    src = FAMILIES[name](work / name)
    t0 = time.perf_counter()
    bundle = build(src, profile, work / f"{name}-bundle", BuildOptions(progress=False))
    build_s = time.perf_counter() - t0
    m = json.loads((bundle / "manifest.json").read_text())
    sizes = {
        a["path"]: a["bytes"] if "bytes" in a else (bundle / a["path"]).stat().st_size
        for a in m["artifacts"]
        if a["role"] in ("model", "mmproj", "vision_encoder", "config")
    }
    vision = m["parity"]["vision"]
    s = edgesdk.load(bundle, threads=threads, **({"n_gpu_layers": n_gpu_layers} if n_gpu_layers is not None else {}))
    try:
        enc = s.report()["backend_report"]["vision_encoder"]
        s.generate("Describe the image.", images=[image], max_tokens=max_tokens, temperature=0)  # warm-up
        runs = []
        for _ in range(rounds):
            s.backend.forget()  # cold: no cached features, frames or KV prefix
            s.generate("Describe the image.", images=[image], max_tokens=max_tokens, temperature=0)
            last = dict(s.backend.last)
            runs.append(
                {
                    k: last.get(k)
                    for k in ("ttft_s", "decode_tok_s", "output_tokens", "input_tokens", "image_tokens", "stages_s")
                }
            )
        by_size = []
        fam = __import__("edgesdk.formats.vlm.families", fromlist=["by_config"]).by_config(
            json.loads((src / "config.json").read_text())
        )
        if fam.frames == "dynamic" and fam.parity_image_sizes:
            from edgesdk.formats.vlm.build import test_images

            for path in test_images(work / f"{name}-sizes", fam.parity_image_sizes):
                s.generate("Describe the image.", images=[path], max_tokens=max_tokens, temperature=0)  # warm-up
                sized = []
                for _ in range(rounds):
                    s.backend.forget()
                    s.generate("Describe the image.", images=[path], max_tokens=max_tokens, temperature=0)
                    sized.append(dict(s.backend.last))
                w, h = __import__("PIL.Image", fromlist=["open"]).open(path).size
                by_size.append(
                    {
                        "image": f"{w}x{h}",
                        "image_tokens": sized[0]["image_tokens"],
                        "input_tokens": sized[0]["input_tokens"],
                        "ttft_ms_median": round(statistics.median(r["ttft_s"] for r in sized) * 1e3, 2),
                        "ttft_ms_min": round(min(r["ttft_s"] for r in sized) * 1e3, 2),
                        "encode_ms_median": round(statistics.median(r["stages_s"]["encode_s"] for r in sized) * 1e3, 2),
                    }
                )
    finally:
        s.close()
    tok_s = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
    return {
        "family": name,
        "build_s": round(build_s, 1),
        "quant_type": m["extras"]["llm"]["quant_type"],
        "artifact_bytes": sizes,
        "vision_encoder_path": enc.get("path"),
        "vision_provider": enc.get("provider"),
        "parity": {
            "encoder": vision.get("encoder", "mmproj"),
            "encoder_min_cosine": vision["encoder_min_cosine"],
            "greedy_equal": vision["greedy_equal"],
            "input_tokens": [[p["input_tokens_ours"], p["input_tokens_pytorch"]] for p in vision["per_image"]],
            "mmproj_not_used": vision.get("mmproj_not_used", {}).get("encoder_min_cosine"),
            "decoder_logits_min_cosine": m["parity"]["decoder_logits_vs_hf"]["min_cosine"],
            "decoder_logits_vs_hf": m["parity"]["decoder_logits_vs_hf"],
            "decoder_ppl_ratio": m["parity"].get("decoder_ppl_ratio"),
            "per_image": [
                {k: p.get(k) for k in ("image", "image_tokens", "min_cosine", "max_abs")} for p in vision["per_image"]
            ],
        },
        "image_tokens": runs[0]["image_tokens"],
        "input_tokens": runs[0]["input_tokens"],
        "ttft_ms_median": round(statistics.median(r["ttft_s"] for r in runs) * 1e3, 2),
        "ttft_ms_min": round(min(r["ttft_s"] for r in runs) * 1e3, 2),
        "decode_tok_s_median": round(statistics.median(tok_s), 1) if tok_s else None,
        "decode_tok_s_max": round(max(tok_s), 1) if tok_s else None,
        "output_tokens": [r["output_tokens"] for r in runs],
        **({"by_size": by_size} if by_size else {}),
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--profile", default="cpu-x86_64", help="profile to build for (h200 on the GPU)")
    ap.add_argument("--n-gpu-layers", type=int, default=None, help="load option (default: the plan's)")
    ap.add_argument("--out", type=Path, default=REPO / "tools/bench/results/vlm_families_cpu.json")
    args = ap.parse_args()
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="edgesdk-vlm-families-") as tmp:
        work = Path(tmp)
        image = __import__("vlm_fixtures").make_test_images(work / "images")[2]  # 120x80 shapes.jpg
        for name in args.families.split(","):
            try:
                r = measure(
                    name, work, args.threads, args.rounds, args.max_tokens, image, args.profile, args.n_gpu_layers
                )
            except Exception as exc:  # one family's failure is a result too; the others still run and are written
                r = {"family": name, "error": f"{type(exc).__name__}: {exc}"[:600]}
            print(json.dumps({k: r[k] for k in r if k != "runs"}), flush=True)
            results.append(r)
            _write(args, results, load_start, t0)
    _write(args, results, load_start, t0)
    print(f"wrote {args.out}")
    return 1 if any("error" in r for r in results) else 0


def _write(args: argparse.Namespace, results: list[dict], load_start: tuple[float, ...], t0: float) -> None:
    import llama_cpp
    import transformers

    out = {
        "method": __doc__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": round(time.perf_counter() - t0, 1),
        "profile": args.profile,
        "n_gpu_layers": args.n_gpu_layers,
        "threads": args.threads,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "image": "tests/vlm_fixtures.py make_test_images shapes.jpg (120x80)",
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "loadavg_at_start": load_start,
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__,
            "transformers": transformers.__version__,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
