# SPDX-License-Identifier: Apache-2.0
"""The cost model of speculative decoding, shared by the plan's ``gguf.draft`` decision
(:mod:`edgesdk.formats.gguf.draft`) and the engine's adaptive k (:mod:`edgesdk.runtime.batching`): the runtime reads
it on a device that installed the wheel without the build extra, so it lives in the lowest layer."""

from __future__ import annotations

#: per-token acceptance the plan assumes for a draft of the same family (the pair's own agreement is measured at build)
ASSUMED_ACCEPTANCE = 0.7
#: a verify step's cost per drafted token, in plain decode steps: on the CPU every token costs compute (a step of
#: 9 tokens cost about 1.5 plain ones with Gemma-3-270M on 2 cores: docs/benchmarks.md), on a GPU nearly nothing
VERIFY_COST = {"cpu": 0.06, "gpu": 0.01}
K_MAX = 8


def speedup(k: int, acceptance: float, cost_ratio: float, verify_cost: float) -> float:
    """Predicted decode speed with ``k`` drafted tokens per step over none: the tokens a step yields (the accepted
    prefix and the model's own next token, ``(1 - a^(k+1)) / (1 - a)``) over its cost in plain steps (the verify
    step ``1 + k * verify_cost`` and ``k`` draft steps of ``cost_ratio`` each)."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1 - a ** (k + 1)) / (1 - a) / (1 + k * (verify_cost + cost_ratio))


def best_k(acceptance: float, cost_ratio: float, verify_cost: float) -> tuple[int, float]:
    """The ``k`` (1..:data:`K_MAX`) of the largest predicted gain, and that gain."""
    gains = {k: speedup(k, acceptance, cost_ratio, verify_cost) for k in range(1, K_MAX + 1)}
    k = max(gains, key=lambda n: (round(gains[n], 6), -n))
    return k, gains[k]
