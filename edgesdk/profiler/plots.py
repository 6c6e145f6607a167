# SPDX-License-Identifier: Apache-2.0
"""The profiler's PNGs (``--plot``): a measured run, a roofline prediction, a comparison of two runs.

- :func:`plot_report` (``profiler run --plot``): encoders get the latency histogram and the time per
  op type; LLMs get their phases over every measured repeat (prompt evaluation and the rest of the
  TTFT, decode, text-chunk instants) and the decode time per token of each repeat.
- :func:`plot_roofline` (``profiler predict --plot``): one roofline per profile (memory-bandwidth
  and compute roofs), the model's arithmetic intensity, the bound, the prediction and, when a
  report measured on that profile is given, the measured point.
- :func:`plot_comparison` (``profiler compare --plot``): base vs new bars of each key metric, p50
  bars with the p99 marked where the metric has a distribution.

matplotlib is the ``[profiler]`` extra; it is imported only here, with the non-interactive Agg
backend (no display needed).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from edgesdk.errors import InputError
from edgesdk.profiler.values import value_at

# One palette for every plot (colour-blind safe, Okabe-Ito).
BLUE, ORANGE, GREEN, VERMILION, SKY, PURPLE, GREY = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#56b4e9",
    "#cc79a7",
    "#7f7f7f",
)
DPI = 100


def _num(v: float) -> str:
    """3 significant digits, without an exponent below a million (5230, not 5.23e+03)."""
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _pyplot():
    from edgesdk.extras import require

    require("profiler", "matplotlib", "--plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- profiler run


def _llm_repeats(report: dict) -> list[dict]:
    llm = report.get("llm") or {}
    reps = [r for r in llm.get("per_repeat") or [] if r.get("ttft_ms") is not None]
    return reps


def plot_report(report: dict, path: str | os.PathLike) -> Path:
    """One PNG of a ``profiler run`` report: the panels that have data."""
    plt = _pyplot()
    panels = []
    if (report.get("latency_ms") or {}).get("samples"):
        panels.append("hist")
    if report.get("ort_profile"):
        panels.append("ops")
    if _llm_repeats(report):
        panels += ["phases", "decode"]
    elif (report.get("llm") or {}).get("token_times_ms"):
        panels.append("tokens")  # a report written before per-repeat phases were recorded
    if not panels:
        raise InputError("nothing to plot: the report has no latency samples, per-op times or token times")
    widths = [7.5 if k == "phases" else 5.5 for k in panels]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(sum(widths), 4.2), squeeze=False, gridspec_kw={"width_ratios": widths}
    )
    for ax, kind in zip(axes[0], panels):
        {
            "hist": _latency_hist,
            "ops": _op_times,
            "phases": _llm_phases,
            "decode": _llm_decode,
            "tokens": _tokens_over_time,
        }[kind](ax, report)
    b, rt = report.get("bundle") or {}, report.get("runtime") or {}
    fig.suptitle(
        f"{b.get('model')} ({b.get('format')}, {b.get('precision')}) on {rt.get('backend')}/{rt.get('device')}"
    )
    fig.tight_layout()
    return _save(fig, plt, path)


def _latency_hist(ax, report: dict) -> None:
    lat = report["latency_ms"]
    ax.hist(lat["samples"], bins=40, color=BLUE)
    for q, style in (("p50", "-"), ("p99", "--")):
        ax.axvline(lat[q], color="k", linestyle=style, label=f"{q} {lat[q]:.3g} ms")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("calls")
    ax.set_title(f"latency ({lat['n']} calls)")
    ax.legend()


def _op_times(ax, report: dict) -> None:
    rows = report["ort_profile"]["by_op_type"][:12][::-1]
    ax.barh([r["op_type"] for r in rows], [r["total_us"] / 1e3 for r in rows], color=ORANGE)
    ax.set_xlabel("time per run (ms)")
    ax.set_title("time by op type (onnxruntime profiler)")


def _llm_phases(ax, report: dict) -> None:
    """One bar per repeat: prompt eval | rest of TTFT | decode, TTFT marked, chunk instants as ticks."""
    llm = report["llm"]
    reps = _llm_repeats(report)
    labelled: set[str] = set()

    def seg(y: int, start: float, width: float, color: str, label: str, **kw) -> None:
        ax.barh(y, width, left=start, height=0.6, color=color, label=None if label in labelled else label, **kw)
        labelled.add(label)

    for i, r in enumerate(reps):
        y = len(reps) - i  # repeat 1 on top
        ttft = r["ttft_ms"]
        pe = r.get("prompt_eval_ms")
        if pe is not None and 0 < pe <= ttft:
            seg(y, 0, pe, BLUE, "prefill (backend prompt-eval timer)")
            seg(y, pe, ttft - pe, SKY, "rest of TTFT (first sample, stream setup)")
        else:
            seg(y, 0, ttft, BLUE, "prefill (TTFT)")
        if r.get("decode_ms"):
            seg(y, ttft, r["decode_ms"], GREEN, "decode")
        ax.plot(
            [ttft, ttft], [y - 0.38, y + 0.38], color="k", linewidth=2, label=None if "TTFT" in labelled else "TTFT"
        )
        labelled.add("TTFT")
        chunks = [t for t in r.get("chunk_times_ms") or [] if t >= 0]
        if chunks:
            ax.plot(
                chunks,
                [y - 0.42] * len(chunks),
                linestyle="none",
                marker="|",
                markersize=5,
                color=GREY,
                label=None if "chunks" in labelled else "text chunks",
            )
            labelled.add("chunks")
        end = ttft + (r.get("decode_ms") or 0)
        tpot = f", {_num(r['tpot_ms'])} ms/token" if r.get("tpot_ms") else ""
        ax.annotate(
            f"TTFT {_num(ttft)} ms\n{r['tokens']} tokens{tpot}",
            (end, y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(1, len(reps) + 1), [f"repeat {len(reps) - k}" for k in range(len(reps))])
    ax.set_ylim(0.3, len(reps) + 1.5)
    right = max(r["ttft_ms"] + (r.get("decode_ms") or 0) for r in reps)
    ax.set_xlim(0, right * 1.35)
    ax.set_xlabel("time since request (ms)")
    ax.set_title(f"LLM phases per repeat ({llm['prompt_tokens']}-token prompt)")
    ax.legend(loc="upper left", ncol=3, fontsize=7, frameon=False)


def _llm_decode(ax, report: dict) -> None:
    """Decode time per token of every repeat (intervals between text chunks) with each repeat's TPOT."""
    llm = report["llm"]
    reps = _llm_repeats(report)
    colors = [GREEN, PURPLE, ORANGE, VERMILION, SKY, BLUE]
    for i, r in enumerate(reps):
        c = colors[i % len(colors)]
        chunks = r.get("chunk_times_ms") or []
        gaps = [b - a for a, b in zip(chunks, chunks[1:])]
        if gaps:
            ax.plot(range(2, len(gaps) + 2), gaps, color=c, linewidth=1, alpha=0.8, label=f"repeat {i + 1}")
        if r.get("tpot_ms"):
            ax.axhline(r["tpot_ms"], color=c, linestyle="--", linewidth=1)
    p50 = (llm.get("tpot_ms") or {}).get("p50")
    if p50:
        ax.axhline(p50, color="k", linewidth=1.5, label=f"TPOT p50 {_num(p50)} ms")
    ax.set_xlabel("generated token (text chunk)")
    ax.set_ylabel("ms since the previous chunk")
    ax.set_ylim(bottom=0)
    ax.set_title("decode time per token (dashed: each repeat's TPOT)")
    ax.legend(fontsize=7)


def _tokens_over_time(ax, report: dict) -> None:
    times = report["llm"]["token_times_ms"]
    ax.plot(times, range(1, len(times) + 1), color=GREEN)
    ax.set_xlabel("time since request (ms)")
    ax.set_ylabel("tokens generated")
    ax.set_title("tokens over time (last repeat)")


# ---------------------------------------------------------------- roofline (profiler predict)


def roofline_points(pred: dict, measured: dict | None = None) -> list[dict]:
    """Points of one prediction on its roofline: per workload (encoder | decode | prefill) the
    arithmetic intensity (FLOP/byte) and FLOP/s of the bound, the prediction and the measurement.

    The measured point is drawn only where the report was measured on the predicted profile
    (``predict_bundle`` then attaches ``error_pct``)."""
    work = pred.get("work") or {}
    same_device = measured is not None and "error_pct" in pred
    llm = (measured or {}).get("llm") or {}
    out = []
    enc = pred.get("encoder")
    if enc and work.get("flops") and work.get("weight_bytes"):
        flops = work["flops"]
        lat = (measured or {}).get("latency_ms", {}).get("p50") if same_device else None
        out.append(
            {
                "workload": "encoder",
                "intensity": flops / work["weight_bytes"],
                "bound": flops / (enc["bound_ms"] / 1e3),
                "predicted": flops / (enc["latency_ms"] / 1e3) if enc.get("latency_ms") else None,
                "measured": flops / (lat / 1e3) if lat else None,
                "limited_by": enc.get("limited_by"),
            }
        )
    dec = pred.get("decode")
    if dec and work.get("flops") and dec.get("bytes_per_token"):
        flops = work["flops"]
        rate = (llm.get("decode_tok_s_backend") or llm.get("decode_tok_s")) if same_device else None
        out.append(
            {
                "workload": "decode",
                "intensity": flops / dec["bytes_per_token"],
                "bound": dec["bound_tok_s"] * flops,
                "predicted": dec["tok_s"] * flops if dec.get("tok_s") else None,
                "measured": rate * flops if rate else None,
                "limited_by": "memory",
            }
        )
    pre = pred.get("prefill")
    if pre and pre.get("flops") and work.get("weight_bytes"):
        per_token = pre["flops"] / pre["prompt_tokens"]
        rate = llm.get("prefill_tok_s") if same_device else None
        out.append(
            {
                "workload": "prefill",
                "intensity": pre["flops"] / work["weight_bytes"],
                "bound": pre["bound_tok_s"] * per_token,
                "predicted": pre["tok_s"] * per_token if pre.get("tok_s") else None,
                "measured": rate * per_token if rate else None,
                "limited_by": None,
            }
        )
    return out


def plot_roofline(predictions: list[dict], path: str | os.PathLike, measured: dict | None = None) -> Path:
    """One roofline panel per predicted profile."""
    if not predictions:
        raise InputError("nothing to plot: no prediction")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(predictions), figsize=(6.2 * len(predictions), 6.2), squeeze=False)
    for ax, pred in zip(axes[0], predictions):
        _roofline_panel(ax, pred, measured)
    work = predictions[0].get("work") or {}
    fig.suptitle(
        f"roofline: {work.get('format')} {work.get('precision') or ''} model, "
        f"{(work.get('params') or 0) / 1e6:.3g} M parameters"
    )
    fig.tight_layout()
    return _save(fig, plt, path)


def _roofline_panel(ax, pred: dict, measured: dict | None) -> None:
    import numpy as np

    ax.set_title(f"{pred['profile']} ({pred.get('device_class')})")
    if pred.get("unavailable"):
        ax.text(0.5, 0.5, pred["unavailable"], ha="center", va="center", wrap=True, fontsize=9, transform=ax.transAxes)
        ax.set_axis_off()
        return
    bw = float(pred["bandwidth_gbps"]) * 1e9
    peak = pred.get("peak_flops")
    points = roofline_points(pred, measured)
    ais = [p["intensity"] for p in points] or [1.0]
    ridge = peak / bw if peak else None
    lo = 10 ** math.floor(math.log10(min(ais + ([ridge] if ridge else [])) / 10))
    hi = 10 ** math.ceil(math.log10(max(ais + ([ridge] if ridge else [])) * 10))
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    roof = np.minimum(x * bw, peak) if peak else x * bw
    ax.loglog(x, roof, color="k", linewidth=2)
    ax.loglog(x, x * bw, color=BLUE, linestyle=":", linewidth=1, label=f"memory roof {pred['bandwidth_gbps']:.4g} GB/s")
    if peak:
        ax.axhline(
            peak,
            color=VERMILION,
            linestyle=":",
            linewidth=1,
            label=f"compute roof {peak / 1e12:.4g} TFLOP/s ({pred.get('peak_figure')})",
        )
        ax.axvline(ridge, color=GREY, linewidth=0.8, linestyle="-.")
        ax.annotate(
            f"ridge {ridge:.3g} FLOP/B",
            (ridge, peak),
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=7,
            color=GREY,
        )
    else:
        ax.text(
            0.02, 0.96, "profile has no compute peak: memory roof only", transform=ax.transAxes, fontsize=7, va="top"
        )
    markers = {"encoder": "o", "decode": "s", "prefill": "^"}
    for p in points:
        m = markers[p["workload"]]
        ax.axvline(p["intensity"], color=GREY, linewidth=0.6)
        ax.scatter(
            [p["intensity"]],
            [p["bound"]],
            marker=m,
            s=60,
            facecolors="none",
            edgecolors="k",
            zorder=3,
            label=f"{p['workload']} bound (AI {p['intensity']:.3g} FLOP/B)",
        )
        for key, color, zorder in (("predicted", ORANGE, 3), ("measured", GREEN, 4)):
            if p[key]:
                ax.scatter(
                    [p["intensity"]],
                    [p[key]],
                    marker=m,
                    s=60,
                    color=color,
                    zorder=zorder,
                    label=f"{p['workload']} {key}",
                )
    if measured is not None and "error_pct" not in pred:
        where = (measured.get("device") or {}).get("best_match")
        ax.text(0.02, 0.02, f"report measured on {where}: not plotted here", transform=ax.transAxes, fontsize=7)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.grid(True, which="major", alpha=0.3)


# ---------------------------------------------------------------- compare

# (title, path to a stats dict with p50/p99, or to a scalar; unit)
COMPARE_PANELS: list[tuple[str, tuple[str | int, ...], str]] = [
    ("latency", ("latency_ms",), "ms"),
    ("TTFT", ("llm", "ttft_ms"), "ms"),
    ("TPOT", ("llm", "tpot_ms"), "ms"),
    ("throughput x1", ("throughput", 0, "per_s"), "calls/s"),
    ("prefill", ("llm", "prefill_tok_s"), "tok/s"),
    ("decode", ("llm", "decode_tok_s"), "tok/s"),
    ("load time", ("load", "time_ms"), "ms"),
    ("host peak RSS", ("memory", "host_peak_rss_mb"), "MB"),
]


def _worse_text(row: dict | None, prefix: str = "") -> str:
    """``p50 worse 3.1% ±2.0%``: the change and, where the table has it, the runs' noise beside it."""
    worse = (row or {}).get("worse_pct")
    if worse is None:
        return ""
    noise = (row or {}).get("noise_pct")
    return f"{prefix}{'worse' if worse > 0 else 'better'} {abs(worse):.1f}%" + (
        f" ±{noise:.1f}%" if noise is not None else ""
    )


def plot_comparison(
    base: dict, new: dict, result: dict, path: str | os.PathLike, labels: tuple[str, str] = ("base", "new")
) -> Path:
    """Side-by-side bars per metric: base vs new at p50 and p99 (distributions), or the value (rates,
    load time, memory); a metric ``compare`` flags as a regression has a red title. A panel whose bars
    span more than 20x uses a log axis."""
    panels = [(t, p, u) for t, p, u in COMPARE_PANELS if value_at(base, p) is not None or value_at(new, p) is not None]
    if not panels:
        raise InputError("nothing to plot: the reports share no metric")
    plt = _pyplot()
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), squeeze=False)
    flagged = set(result.get("regressions") or [])
    by_metric = {r["metric"]: r for r in result.get("rows") or []}
    width = 0.38
    for ax, (title, p, unit) in zip(axes.flat, panels):
        vals = [value_at(base, p), value_at(new, p)]
        if isinstance(vals[0], dict) or isinstance(vals[1], dict):
            groups = ["p50", "p99"]
            heights = [[(v or {}).get(q) for q in groups] for v in vals]
            notes = [_worse_text(by_metric.get(f"{title} {q} ({unit})"), f"{q} ") for q in groups]
        else:
            groups = [""]
            heights = [[vals[0]], [vals[1]]]
            notes = [_worse_text(next((r for m, r in by_metric.items() if m.startswith(title)), None))]
        for k, (label, color) in enumerate(zip(labels, (GREY, BLUE))):
            xs = [g + (k - 0.5) * width for g in range(len(groups))]
            bars = ax.bar(xs, [h or 0 for h in heights[k]], width=width, color=color, label=label)
            for bar, h in zip(bars, heights[k]):
                if h is not None:
                    ax.annotate(
                        _num(h),
                        (bar.get_x() + width / 2, h),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        fontsize=7,
                    )
        present = [h for hs in heights for h in hs if h]
        if present and max(present) / min(present) > 20:
            ax.set_yscale("log")
        if groups == [""]:
            ax.set_xticks([-width / 2, width / 2], list(labels))
        else:
            ax.set_xticks(range(len(groups)), groups)
        ax.margins(y=0.2)
        bad = any(m.startswith(title) for m in flagged)
        sub = ", ".join(n for n in notes if n)
        ax.set_title(
            f"{title} ({unit})" + (f"\n{sub}" if sub else "") + (" REGRESSION" if bad else ""),
            fontsize=9,
            color=VERMILION if bad else "k",
        )
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_axis_off()
    devs = (result.get("base_device"), result.get("new_device"))
    title = f"{labels[0]} ({devs[0]}) vs {labels[1]} ({devs[1]})"
    if result.get("base_build") and result.get("base_build") != result.get("new_build"):
        title += f"\ndifferent builds: {result['base_build']} vs {result['new_build']}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, plt, path)
