# SPDX-License-Identifier: Apache-2.0
"""Compare two profiler reports: ratios side by side, regression verdict that accounts for noise.

A metric regresses when it is worse by more than ``max_regression`` AND by more than the noise of
the two runs (half the IQR of each, relative to its median, added). Without the noise term, a CI gate
at 5 % fires on every run of a 2-core box whose spread alone is 5 %.
"""

from __future__ import annotations

from typing import Any

from edgesdk.profiler.values import plain, value_at
from edgesdk.textable import format_table

# (label, path into the report, spread path or None, True if higher is better)
METRICS: list[tuple[str, tuple[str | int, ...], tuple[str | int, ...] | None, bool]] = [
    ("latency p50 (ms)", ("latency_ms", "p50"), ("latency_ms", "iqr"), False),
    ("latency p90 (ms)", ("latency_ms", "p90"), ("latency_ms", "iqr"), False),
    ("latency p99 (ms)", ("latency_ms", "p99"), ("latency_ms", "iqr"), False),
    ("throughput x1 (calls/s)", ("throughput", 0, "per_s"), None, True),
    ("TTFT p50 (ms)", ("llm", "ttft_ms", "p50"), ("llm", "ttft_ms", "iqr"), False),
    ("TPOT p50 (ms)", ("llm", "tpot_ms", "p50"), ("llm", "tpot_ms", "iqr"), False),
    ("prefill (tok/s)", ("llm", "prefill_tok_s"), None, True),
    ("decode (tok/s)", ("llm", "decode_tok_s"), None, True),
    ("energy per token (J)", ("energy", "joules_per_token"), None, False),
    ("energy per item (J)", ("energy", "joules_per_item"), None, False),
    ("average power (W)", ("energy", "watts"), None, False),
    ("load time (ms)", ("load", "time_ms"), None, False),
    ("host peak RSS (MB)", ("memory", "host_peak_rss_mb"), None, False),
    ("device memory (MB)", ("memory", "device", "peak_mb"), None, False),
]
# Load time and memory are informative but too noisy/host-dependent to gate on by default.
GATED = {
    "latency p50 (ms)",
    "latency p99 (ms)",
    "throughput x1 (calls/s)",
    "TTFT p50 (ms)",
    "TPOT p50 (ms)",
    "decode (tok/s)",
}


def parse_threshold(text: str | float | None) -> float | None:
    """``5%``, ``5`` or ``0.05`` -> 0.05."""
    from edgesdk.errors import InputError

    if text is None:
        return None
    raw = str(text).strip()
    try:
        value = float(raw.rstrip("%"))
    except ValueError as exc:
        raise InputError(f"--max-regression: expected a percentage like 5%, got {text!r}") from exc
    if raw.endswith("%") or value >= 1:
        value /= 100.0
    if not 0 <= value < 10:
        raise InputError(f"--max-regression: {text!r} is out of range")
    return value


def compare_reports(base: dict, new: dict, max_regression: float | None = None) -> dict:
    rows = []
    for label, path, spread_path, higher_better in METRICS:
        a, b = value_at(base, path), value_at(new, path)
        if a is None and b is None:
            continue
        row: dict[str, Any] = {
            "metric": label,
            "base": a,
            "new": b,
            "ratio": None,
            "worse_pct": None,
            "noise_pct": None,
            "regression": False,
        }
        if a and b is not None:
            row["ratio"] = b / a
            row["worse_pct"] = 100.0 * ((a / b - 1.0) if higher_better else (b / a - 1.0)) if b else None
            if spread_path is not None:
                sa, sb = value_at(base, spread_path), value_at(new, spread_path)
                if sa is not None and sb is not None:
                    row["noise_pct"] = 100.0 * (0.5 * sa / a + 0.5 * sb / b) if b else None
            if max_regression is not None and label in GATED and row["worse_pct"] is not None:
                beyond = row["worse_pct"] > 100.0 * max_regression
                above_noise = row["noise_pct"] is None or row["worse_pct"] > row["noise_pct"]
                row["regression"] = bool(beyond and above_noise)
        rows.append(row)
    regressions = [r["metric"] for r in rows if r["regression"]]
    return {
        "rows": rows,
        "max_regression_pct": None if max_regression is None else 100 * max_regression,
        "regressions": regressions,
        "rule": "regression = worse by more than the threshold and by more than the runs' noise "
        "(half IQR / median of each run, added)",
        "base_device": value_at(base, ("device", "best_match")),
        "new_device": value_at(new, ("device", "best_match")),
        "base_build": build_of(base),
        "new_build": build_of(new),
        "base_power_mode": power_mode_of(base),
        "new_power_mode": power_mode_of(new),
        "power_mode_mismatch": power_mode_mismatch(base, new),
        "throttled": [
            f"{which}: {flag}"
            for which, rep in (("base", base), ("new", new))
            for flag in (value_at(rep, ("device_state", "flagged")) or [])
        ],
    }


def power_mode_of(report: dict) -> str | None:
    """The power mode a report ran under (``device_state.power_mode``), or None (unknown, or an older report)."""
    mode = value_at(report, ("device_state", "power_mode"))
    return str(mode) if mode is not None else None


def power_mode_mismatch(base: dict, new: dict) -> str | None:
    """One line when both reports know their power mode and the modes differ (then a speed or energy difference
    is mostly the mode: an Orin Nano at 25 W decodes 36-47 % faster than at 15 W); None otherwise."""
    a, b = power_mode_of(base), power_mode_of(new)
    if a is None or b is None or a == b:
        return None
    return f"the reports ran under different power modes ({a} vs {b})"


def build_of(report: dict) -> str | None:
    """``model format/precision (bundle id)`` of the bundle a report measured, or None (an old report)."""
    b = report.get("bundle") or {}
    if not b.get("bundle_id") and not b.get("format"):
        return None
    return f"{b.get('model')} {b.get('format')}/{b.get('precision')} (bundle {b.get('bundle_id')})"


def build_note(result: dict) -> str | None:
    """A line saying the two reports measured different builds (then a difference is the build's choice, not a
    regression of one build); None when they measured the same bundle or a report does not say."""
    a, b = result.get("base_build"), result.get("new_build")
    if a is None or b is None or a == b:
        return None
    return (
        f"note: the reports measure different builds ({a} vs {b}): differences include the build's "
        "format/precision, not only this device's run-to-run change"
    )


def render_comparison(result: dict) -> str:
    def f(v):
        return "-" if v is None else (plain(v, 4) if isinstance(v, float) else str(v))

    rows = [
        [
            r["metric"],
            f(r["base"]),
            f(r["new"]),
            f(r["ratio"]),
            "-" if r["worse_pct"] is None else f"{r['worse_pct']:+.1f}%",
            "-" if r["noise_pct"] is None else f"±{r['noise_pct']:.1f}%",
            "REGRESSION" if r["regression"] else "",
        ]
        for r in result["rows"]
    ]
    text = format_table(rows, ["metric", "base", "new", "new/base", "worse by", "noise", ""])
    if result["base_device"] != result["new_device"]:
        text += f"\nnote: the reports come from different devices ({result['base_device']} vs {result['new_device']})"
    if note := build_note(result):
        text += f"\n{note}"
    a, b = result.get("base_power_mode"), result.get("new_power_mode")
    if result.get("power_mode_mismatch"):
        text += f"\nWARNING: {result['power_mode_mismatch']}: differences are mostly the power mode"
    elif a is None or b is None:
        text += f"\nnote: power mode unknown in {'both reports' if a is None and b is None else 'one report'}"
    for flag in result.get("throttled") or []:
        text += f"\nWARNING: {flag}"
    return text
