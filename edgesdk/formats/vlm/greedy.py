# SPDX-License-Identifier: Apache-2.0
"""Greedy-token parity with near-ties: when do two greedy continuations count as the same model?

The VLM build compares the first greedy tokens of the F16 build (llama.cpp) with PyTorch's ``generate``. Two
correct implementations of the same weights part ways where PyTorch's best two candidates are closer than the
F16 arithmetic can resolve: the measured case (2026-12-04, random-weight LLaVA of tools/bench/bench_vlm.py
``--size small``, third parity image) had PyTorch's top two logits at step 3 at 4.8170 and 4.8106 (gap 0.0064)
while the F16 decoder's logits differ from PyTorch's by up to 0.038 (``decoder_logits_vs_hf.max_abs``); llama.cpp
took the second. After such a step the two continuations condition on different tokens, so nothing later is
comparable.

:func:`greedy_agreement` therefore reads PyTorch's logits of each generated step (the scores ``generate``
returns, one row per step, all conditioned on the same prefix up to the first difference) and calls a
difference a *near-tie* when, at the first differing step, PyTorch's logit of llama.cpp's token is within
``tolerance`` of its own choice. The build sets ``tolerance`` to twice the decoder's measured max abs logit
error (each of the two logits may be off by that much). Any other difference, a shorter or longer
continuation included, is a mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GreedyAgreement", "greedy_agreement"]


@dataclass(frozen=True)
class GreedyAgreement:
    """``equal``: identical tokens; ``near_tie``: first differ at ``position``, where PyTorch's logits of its
    token and of ours are ``gap`` apart (<= the tolerance); otherwise a mismatch."""

    equal: bool
    near_tie: bool
    position: int | None = None
    gap: float | None = None

    @property
    def agrees(self) -> bool:
        return self.equal or self.near_tie

    def to_dict(self) -> dict[str, object]:
        return {"position": self.position, "gap": None if self.gap is None else round(self.gap, 6)}


def greedy_agreement(
    ours: Sequence[int], reference: Sequence[int], scores: np.ndarray | None, tolerance: float
) -> GreedyAgreement:
    """Compare greedy tokens ``ours`` with ``reference`` (PyTorch's), given ``scores``: PyTorch's logits per
    generated step (``len(reference)`` rows or more, one column per vocabulary id; None: no near-tie allowed)."""
    ours, reference = list(ours), list(reference)
    if ours == reference:
        return GreedyAgreement(equal=True, near_tie=False)
    k = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if k is None:  # one stops (an end-of-generation token) where the other goes on: not a tie of two logits
        return GreedyAgreement(equal=False, near_tie=False, position=min(len(ours), len(reference)))
    if scores is None or k >= len(scores):
        return GreedyAgreement(equal=False, near_tie=False, position=k)
    row = np.asarray(scores[k], dtype=np.float64)
    if not (0 <= ours[k] < row.shape[-1] and 0 <= reference[k] < row.shape[-1]):
        return GreedyAgreement(equal=False, near_tie=False, position=k)
    gap = float(row[reference[k]] - row[ours[k]])
    return GreedyAgreement(equal=False, near_tie=bool(gap <= tolerance), position=k, gap=gap)
