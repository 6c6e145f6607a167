# SPDX-License-Identifier: Apache-2.0
"""``edgesdk rollout check NEW --current OLD``: the gate a canary step calls on the device before switching from
the bundle in use (OLD) to a new one (NEW). Exit 0: no regression; exit 2 (:class:`VerdictError`): a regression,
each one named. Three checks, all on this machine:

1. **the new bundle's own parity**: every parity check its manifest records passed (the build's comparison with
   the source model), and, where both bundles record a perplexity (GGUF), the new one's is at most
   ``max_ppl_ratio`` times the current one's;
2. **parity against the bundle in use**: the same inputs through both (sentences for an embedding bundle: min
   cosine of each pair of vectors >= ``min_cosine``; prompts for an LLM: greedy continuations, the share that are
   identical >= ``min_agreement``);
3. **performance**: ``edgesdk profiler run`` of both here, compared as ``edgesdk profiler compare
   --max-regression`` does (worse by more than the threshold *and* the runs' noise).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from edgesdk.bundle import Bundle, open_bundle
from edgesdk.errors import InputError

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A device profile describes the memory and compute of an edge board.",
    "Rolling out a new model to a fleet should be gradual and reversible.",
    "Jetson Orin modules share one GPU architecture across sizes.",
    "The weather in the mountains changes quickly in the afternoon.",
    "She paid for the groceries with cash and walked home.",
    "Quantization trades a little accuracy for speed and memory.",
    "How many tokens per second does the decoder reach on this board?",
]
PROMPTS = ["The sea is", "A recipe for bread starts with", "def add(a, b):", "The three primary colors are"]

Say = Callable[[str], None]


def _kind(bundle: Bundle) -> str:
    m = bundle.manifest
    if m.llm is not None:
        return "llm"
    if m.embedding is not None:
        return "embedding"
    return m.format


def _recorded(new: Bundle, current: Bundle, max_ppl_ratio: float) -> tuple[dict[str, Any], list[str]]:
    checks = new.manifest.parity_checks()
    failed = [c.label or c.kind for c in checks if not c.passed]
    regressions = [f"the new bundle's own parity check {f} failed at build time" for f in failed]
    ppl_new = next((c.ppl for c in checks if c.kind == "perplexity" and c.ppl), None)
    ppl_cur = next((c.ppl for c in current.manifest.parity_checks() if c.kind == "perplexity" and c.ppl), None)
    ratio = ppl_new / ppl_cur if ppl_new and ppl_cur else None
    if ratio is not None and ratio > max_ppl_ratio:
        regressions.append(
            f"perplexity {ppl_new:.3f} is {ratio:.3f}x the current bundle's {ppl_cur:.3f} (limit {max_ppl_ratio}x)"
        )
    return {
        "checks": len(checks),
        "failed": failed,
        "perplexity": {"new": ppl_new, "current": ppl_cur, "ratio": ratio, "max_ratio": max_ppl_ratio},
    }, regressions


def _live(
    kind: str, new: Bundle, current: Bundle, inputs: list[str] | None, min_cosine: float, min_agreement: float
) -> tuple[dict[str, Any], list[str]]:
    from edgesdk.runtime.session import load

    if kind == "embedding":
        import numpy as np

        texts = inputs or SENTENCES
        with load(current.path) as s:
            a = np.asarray(s.embed(texts), dtype=np.float64)
        with load(new.path) as s:
            b = np.asarray(s.embed(texts), dtype=np.float64)
        if a.shape != b.shape:
            return {"inputs": len(texts), "shape": [list(a.shape), list(b.shape)]}, [
                f"the new bundle's embeddings are {list(b.shape)}, the current one's {list(a.shape)}"
            ]
        cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
        worst = float(cos.min())
        out: dict[str, Any] = {"inputs": len(texts), "min_cosine": round(worst, 6),
                               "mean_cosine": round(float(cos.mean()), 6), "threshold": min_cosine}  # fmt: skip
        bad = [] if worst >= min_cosine else [f"min cosine vs the current bundle {worst:.5f} < {min_cosine}"]
        return out, bad
    if kind == "llm":
        prompts = inputs or PROMPTS
        with load(current.path) as s:
            ta = [s.generate(p, max_tokens=16, temperature=0).text for p in prompts]
        with load(new.path) as s:
            tb = [s.generate(p, max_tokens=16, temperature=0).text for p in prompts]
        same = sum(x == y for x, y in zip(ta, tb, strict=True)) / len(prompts)
        res: dict[str, Any] = {"inputs": len(prompts), "greedy_identical": round(same, 4), "threshold": min_agreement,
               "differing": [p for p, x, y in zip(prompts, ta, tb, strict=True) if x != y]}  # fmt: skip
        bad = [] if same >= min_agreement else [f"greedy continuations identical on {same:.0%} < {min_agreement:.0%}"]
        return res, bad
    raise InputError(f"rollout check compares embedding and LLM bundles; {new.path} is a {kind} bundle")


def rollout_check(
    new_path: str | os.PathLike[str],
    current_path: str | os.PathLike[str],
    *,
    inputs: list[str] | None = None,
    min_cosine: float = 0.99,
    min_agreement: float = 0.0,
    max_ppl_ratio: float = 1.05,
    max_regression: float | None = 0.10,
    iterations: int = 50,
    say: Say | None = None,
) -> dict[str, Any]:
    """Run the three checks of the module docstring; ``regressions`` empty means the new bundle may roll out.
    ``max_regression`` None skips the performance check."""
    log = say or (lambda _m: None)
    new, current = open_bundle(new_path), open_bundle(current_path)  # both verified first (exit 7)
    kind, current_kind = _kind(new), _kind(current)
    if kind != current_kind:
        raise InputError(f"rollout check: {new.path} is a {kind} bundle, the current {current.path} a {current_kind}")
    if inputs is not None and not inputs:
        raise InputError("rollout check: --inputs holds no lines")
    recorded, regressions = _recorded(new, current, max_ppl_ratio)
    log("parity: the new bundle against the one in use")
    live, bad = _live(kind, new, current, inputs, min_cosine, min_agreement)
    regressions += bad
    performance = None
    if max_regression is not None:
        from edgesdk.profiler.api import run_profiler
        from edgesdk.profiler.bench import BenchOptions
        from edgesdk.profiler.compare import compare_reports

        opts = BenchOptions(warmup=3, iterations=iterations, llm_repeats=1, gen_tokens=32, prompt_tokens=64,
                            ort_profile_runs=0, progress=False, device_metrics_interval_s=0, energy=False)  # fmt: skip
        log(f"profiler: the current bundle ({iterations} iterations)")
        base = run_profiler(current.path, opts)
        log(f"profiler: the new bundle ({iterations} iterations)")
        rep = run_profiler(new.path, opts)
        cmp = compare_reports(base, rep, max_regression)
        performance = {k: cmp[k] for k in ("rows", "regressions", "max_regression_pct", "rule")}
        regressions += [f"performance: {r} worse by more than {100 * max_regression:.3g}% and noise"
                        for r in cmp["regressions"]]  # fmt: skip
    return {
        "new": str(new.path),
        "current": str(current.path),
        "kind": kind,
        "new_bundle_id": new.manifest.bundle_id,
        "current_bundle_id": current.manifest.bundle_id,
        "recorded_parity": recorded,
        "parity_vs_current": live,
        "performance": performance,
        "regressions": regressions,
        "verdict": "regression" if regressions else "pass",
    }
