# SPDX-License-Identifier: Apache-2.0
"""Greedy-token parity of the VLM build: a flip at a near-tie of PyTorch's logits is not a mismatch, any other
difference is (edgesdk/formats/vlm/greedy.py)."""

from __future__ import annotations

import numpy as np

from edgesdk.formats.vlm.greedy import greedy_agreement


def _scores(rows: list[dict[int, float]], vocab: int = 8) -> np.ndarray:
    out = np.zeros((len(rows), vocab), dtype=np.float32)
    for i, row in enumerate(rows):
        for tok, val in row.items():
            out[i, tok] = val
    return out


def test_identical_tokens_are_equal():
    r = greedy_agreement([1, 2, 3], [1, 2, 3], None, 0.1)
    assert r.equal and r.agrees and not r.near_tie


def test_the_measured_near_tie_agrees():
    # step 3 of the measured case: PyTorch 326 at 4.8170, llama.cpp's 188 at 4.8106; tolerance 2 x 0.038
    scores = _scores([{5: 4.5}, {0: 4.4}, {6: 4.8170, 3: 4.8106}], vocab=8)
    r = greedy_agreement([5, 0, 3, 0, 7], [5, 0, 6, 1, 2], scores, 2 * 0.038)
    assert r.near_tie and r.agrees and r.position == 2 and abs(r.gap - 0.0064) < 1e-4


def test_a_clear_winner_flipped_is_a_mismatch():
    scores = _scores([{5: 4.5}, {0: 4.4, 1: 3.9}])
    r = greedy_agreement([5, 1, 3], [5, 0, 3], scores, 0.076)
    assert not r.agrees and r.position == 1 and abs(r.gap - 0.5) < 1e-6


def test_no_scores_means_no_tie_allowed():
    assert not greedy_agreement([5, 1], [5, 0], None, 10.0).agrees


def test_a_shorter_continuation_is_a_mismatch():
    scores = _scores([{5: 4.5}, {0: 4.4}, {1: 1.0}])
    r = greedy_agreement([5, 0], [5, 0, 1], scores, 10.0)
    assert not r.agrees and r.position == 2


def test_token_outside_the_vocabulary_is_a_mismatch():
    scores = _scores([{5: 4.5}], vocab=8)
    assert not greedy_agreement([9], [5], scores, 10.0).agrees
