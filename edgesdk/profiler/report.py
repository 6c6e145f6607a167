# SPDX-License-Identifier: Apache-2.0
"""Profiler reports: assemble, check budgets, save/load (versioned schema), terminal table (PNGs: plots.py).

The schema is documented in docs/profiler.md. A report of another schema version is refused with a
one-line error rather than misread.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError, VerdictError
from edgesdk.profiler.values import plain
from edgesdk.textable import format_table

SCHEMA = "edgesdk.profiler.report/1"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def assemble(body: dict, *, device: dict | None, prediction: dict | None, budgets: dict | None) -> dict:
    report = {"schema": SCHEMA, "created": _now(), "device": device}
    report.update(body)
    report["prediction"] = prediction
    report["budgets"] = budgets
    return report


def save_report(report: dict, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def load_report(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"report not found: {path}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a JSON report ({exc})") from exc
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA:
        raise InputError(
            f"{path}: report schema {schema!r} is not {SCHEMA!r}",
            hint="re-run `edgesdk profiler run` with this edgesdk version",
        )
    return data


# ---------------------------------------------------------------- budgets


def check_budgets(report: dict, profile, *, latency_ms: float | None = None, memory_gb: float | None = None) -> dict:
    """Latency (encoder p99, LLM median TTFT) and memory (host peak RSS + device) against targets.

    Targets come from options first, then the profile (policy.latency_target_ms, memory budget).
    A missing measurement is "unmeasured", never a pass.
    """
    checks = []
    lat_target = latency_ms if latency_ms is not None else (profile.latency_target_ms if profile else None)
    lat_src = "option" if latency_ms is not None else (f"profile {profile.name}" if profile else None)
    if lat_target is not None:
        if "latency_ms" in report:
            value, what = report["latency_ms"].get("p99"), "p99 latency"
        else:
            value, what = ((report.get("llm") or {}).get("ttft_ms") or {}).get("p50"), "median TTFT"
        checks.append(_check(what, value, float(lat_target), "ms", lat_src))
    mem_target = memory_gb if memory_gb is not None else (profile.memory_budget_gb() if profile else None)
    mem_src = "option" if memory_gb is not None else (f"profile {profile.name}" if profile else None)
    if mem_target is not None:
        mem = report.get("memory") or {}
        host = mem.get("host_peak_rss_mb")
        dev = (mem.get("device") or {}).get("peak_mb")
        used = None if host is None else (host + (dev or 0)) / 1e3
        checks.append(_check("peak memory (host RSS + device)", used, float(mem_target), "GB", mem_src))
    missed = [c for c in checks if c["status"] == "miss"]
    return {"checks": checks, "passed": not missed}


def _check(what: str, value: float | None, target: float, unit: str, source: str | None) -> dict:
    status = "unmeasured" if value is None else ("ok" if value <= target else "miss")
    return {"what": what, "value": value, "target": target, "unit": unit, "target_from": source, "status": status}


def enforce_budgets(budgets: dict | None, fail: bool) -> list[str]:
    """Warnings for misses; with ``fail`` a miss raises VerdictError (exit 2)."""
    if not budgets:
        return []
    msgs = [
        f"budget miss: {c['what']} {plain(c['value'])} {c['unit']} > target {plain(c['target'])} {c['unit']} "
        f"(target from {c['target_from']})"
        for c in budgets["checks"]
        if c["status"] == "miss"
    ]
    if msgs and fail:
        raise VerdictError("; ".join(msgs))
    return msgs


# ---------------------------------------------------------------- terminal table


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "unavailable"
    if isinstance(v, float):
        return plain(v, digits)
    return str(v)


def render_table(report: dict) -> str:
    rows: list[list] = []
    b = report.get("bundle") or {}
    rows.append(
        ["bundle", f"{b.get('model')} ({b.get('format')}, {b.get('precision')}), built for {b.get('built_for')}"]
    )
    rt = report.get("runtime") or {}
    rows.append(["backend", f"{rt.get('backend')} on {rt.get('device')}"])
    dev = report.get("device") or {}
    rows.append(["device", f"{dev.get('best_match')} (confidence {dev.get('confidence')})"])
    rows.append(["load time", f"{_fmt((report.get('load') or {}).get('time_ms'))} ms"])
    lat = report.get("latency_ms")
    if lat:
        rows.append(["latency p50/p90/p99", f"{_fmt(lat['p50'])} / {_fmt(lat['p90'])} / {_fmt(lat['p99'])} ms"])
        rows.append(["latency min/max", f"{_fmt(lat['min'])} / {_fmt(lat['max'])} ms"])
        rows.append(["spread", f"stdev {_fmt(lat['stdev'])} ms, IQR {_fmt(lat['iqr'])} ms, CV {_fmt(lat['cv_pct'])} %"])
    for t in report.get("throughput") or []:
        rows.append([f"throughput x{t['concurrency']}", f"{_fmt(t['per_s'])} calls/s"])
    llm = report.get("llm")
    if llm:
        rows.append(["prompt / generated", f"{llm['prompt_tokens']} / {llm['generated_tokens']} tokens"])
        rows.append(["TTFT p50", f"{_fmt(llm['ttft_ms'].get('p50'))} ms"])
        rows.append(["TPOT p50", f"{_fmt(llm['tpot_ms'].get('p50'))} ms"])
        rows.append(
            [
                "prefill / decode",
                f"{_fmt(llm['prefill_tok_s'])} / {_fmt(llm['decode_tok_s'])} tok/s"
                + (f" (prefill from {llm['prefill_source']})" if llm.get("prefill_source") else ""),
            ]
        )
    spec = report.get("speculative")
    if spec:
        on, off = spec.get("on") or {}, spec.get("off") or {}
        acc = on.get("acceptance")
        rows.append(
            [
                f"speculative ({spec.get('method')}, k {spec.get('k')})",
                f"decode {_fmt(off.get('decode_tok_s'))} -> {_fmt(on.get('decode_tok_s'))} tok/s "
                f"({_fmt(spec.get('ratio'))}x); {on.get('accepted_tokens')} of {on.get('drafted_tokens')} drafted "
                f"tokens accepted"
                + (f" ({acc:.0%})" if acc is not None else "")
                + f"; same text {spec.get('same_text')} of {spec.get('repeats')}",
            ]
        )
    mem = report.get("memory") or {}
    rows.append(["host peak RSS", f"{_fmt(mem.get('host_peak_rss_mb'))} MB"])
    d = mem.get("device") or {}
    rows.append(
        [
            "device memory",
            f"{_fmt(d.get('peak_mb'))} MB" if d.get("peak_mb") is not None else d.get("method", "unavailable"),
        ]
    )
    for label, value in energy_lines(report.get("energy")) + device_state_lines(report.get("device_state")):
        rows.append([label, value])
    prof = report.get("ort_profile")
    if prof:
        place = ", ".join(f"{k}: {v}" for k, v in prof["placement"].items())
        rows.append(["placement (nodes)", place])
        top = ", ".join(f"{r['op_type']} {r['share_pct']:.0f}%" for r in prof["by_op_type"][:4])
        rows.append(["time by op type", top])
    for fb in report.get("fallbacks") or []:
        rows.append(["fallback", f"{fb.get('from')} -> {fb.get('to')}: {fb.get('reason')}"])
    pred = report.get("prediction") or {}
    for line in prediction_lines(pred):
        rows.append(["prediction", line])
    for c in (report.get("budgets") or {}).get("checks", []):
        rows.append([f"budget {c['what']}", f"{c['status']}: {_fmt(c['value'])} / {_fmt(c['target'])} {c['unit']}"])
    return format_table(rows, ["figure", "value"])


def energy_lines(energy: dict | None) -> list[tuple[str, str]]:
    """The table rows of a result's ``energy`` object (none for a report made before it existed)."""
    if not energy:
        return []
    if energy.get("source") is None:
        return [("energy", f"unavailable: {energy.get('reason')}")]
    rate = ""
    if energy.get("tokens_per_joule") is not None:
        rate = f", {_fmt(energy['tokens_per_joule'])} tok/J ({_fmt(energy['joules_per_token'])} J/token)"
    elif energy.get("items_per_joule") is not None:
        rate = f", {_fmt(energy['items_per_joule'])} items/J ({_fmt(energy['joules_per_item'])} J/item)"
    return [
        (
            "energy",
            f"{_fmt(energy['joules'])} J over {_fmt(energy['seconds'])} s, {_fmt(energy['watts'])} W average{rate} "
            f"({energy['source']})",
        )
    ]


def device_state_lines(state: dict | None) -> list[tuple[str, str]]:
    """Power mode, clocks (locked?), temperature, throttling; a flagged result gets a WARNING row."""
    if not state or "power_mode" not in state:
        return []
    clocks = state.get("clocks_mhz")
    clock_text = ", ".join(f"{k} {_fmt(v)}" for k, v in clocks.items()) + " MHz" if clocks else "unavailable"
    locked = {True: "locked", False: "not locked", None: "locked: unknown"}[state.get("clocks_locked")]
    throttle = {True: "THROTTLING", False: "not throttling", None: "throttling: unknown"}[state.get("throttling")]
    rows = [
        ("power mode", _fmt(state.get("power_mode"))),
        ("clocks", f"{clock_text} ({locked})"),
        (
            "temperature / throttling",
            (
                f"{_fmt(state['temperature_c'])} C max"
                if state.get("temperature_c") is not None
                else "temperature unknown"
            )
            + f", {throttle}",
        ),
    ]
    for flag in state.get("flagged") or []:
        rows.append(("WARNING", flag))
    return rows


def prediction_lines(pred: dict) -> list[str]:
    if not pred:
        return []
    if pred.get("unavailable"):
        return [pred["unavailable"]]
    out = []
    err = pred.get("error_pct") or {}
    for key, unit, field in (
        ("encoder", "ms", "latency_ms"),
        ("decode", "tok/s", "tok_s"),
        ("prefill", "tok/s", "tok_s"),
    ):
        sec = pred.get(key)
        if not sec:
            continue
        e = err.get(key)
        tail = f", error {e:+.0f}% vs measured" if e is not None else ""
        bound = f"{_fmt(sec.get('bound_ms') or sec.get('bound_tok_s'))} {unit}"
        if sec.get("efficiency") is None:
            out.append(
                f"{pred['profile']} {key}: roofline bound {bound} only (no efficiency calibrated for "
                f"{pred.get('device_class')}/{key}: measure one device of this class to add one){tail}"
            )
            continue
        launch = f", launch {sec['launch_us_per_layer']:.0f} us/layer" if sec.get("launch_us_per_layer") else ""
        out.append(
            f"{pred['profile']} {key}: {_fmt(sec.get(field))} {unit} (bound {bound}, "
            f"efficiency {_fmt(sec.get('efficiency'))}{launch}{tail})"
        )
    return out


# ---------------------------------------------------------------- plots


def plot_report(report: dict, path: str | os.PathLike) -> Path:
    """One PNG of a run report (edgesdk/profiler/plots.py draws it)."""
    from edgesdk.profiler.plots import plot_report as draw

    return draw(report, path)
