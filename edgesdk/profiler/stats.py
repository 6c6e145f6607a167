# SPDX-License-Identifier: Apache-2.0
"""Latency statistics shared by the tensor-model bench (:mod:`.bench`) and the LLM bench (:mod:`.llm_bench`)."""

from __future__ import annotations

import numpy as np


def latency_stats(samples_ms: list[float]) -> dict:
    """Percentiles (linear interpolation) plus the spread: stdev, IQR and coefficient of variation."""
    if not samples_ms:
        return {"n": 0}
    a = np.asarray(samples_ms, dtype=np.float64)
    p25, p50, p75, p90, p99 = np.percentile(a, [25, 50, 75, 90, 99])
    mean = float(a.mean())
    stdev = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return {
        "n": int(a.size),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "min": float(a.min()),
        "max": float(a.max()),
        "mean": mean,
        "stdev": stdev,
        "iqr": float(p75 - p25),
        "cv_pct": 100.0 * stdev / mean if mean else None,
    }
