# SPDX-License-Identifier: Apache-2.0
"""The profiler's library entry points (the CLI calls these): run, predict, compare."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgesdk.profiler import roofline
from edgesdk.profiler.bench import BenchOptions, measure_bundle
from edgesdk.profiler.device_metrics import observe as observe_device
from edgesdk.profiler.report import assemble, check_budgets

if TYPE_CHECKING:
    from edgesdk.profiles import Profile


def attach_measurement(prediction: dict, measured: dict) -> dict:
    """Add the prediction error and the efficiency the measurement implies (to recalibrate with)."""
    if not prediction or prediction.get("unavailable"):
        return prediction
    err: dict = {}
    implied: dict = {}
    enc, lat = prediction.get("encoder"), (measured.get("latency_ms") or {}).get("p50")
    if enc and lat:
        err["encoder"] = roofline.prediction_error(enc.get("latency_ms"), lat)
        implied["encoder"] = roofline.efficiency_from_measurement(enc["bound_ms"], lat, higher_is_better=False)
    llm = measured.get("llm") or {}
    # The model's own rates where the backend times them (llama.cpp's eval / prompt-eval counters):
    # the roofline models the model's work, not the stream's Python around it.
    for key, value in (
        ("decode", llm.get("decode_tok_s_backend") or llm.get("decode_tok_s")),
        ("prefill", llm.get("prefill_tok_s")),
    ):
        sec = prediction.get(key)
        if sec and value:
            err[key] = roofline.prediction_error(sec.get("tok_s"), value)
            implied[key] = roofline.efficiency_from_measurement(sec["bound_tok_s"], value, higher_is_better=True)
    prediction["error_pct"] = err
    prediction["implied_efficiency"] = implied
    prediction["error_definition"] = (
        "(predicted - measured) / measured; encoder vs measured p50 latency; LLM "
        "decode/prefill vs the backend's own timers when it has them"
    )
    return prediction


def this_host_figures_for(profile) -> dict | None:
    """A generic CPU profile has no bandwidth or peak of its own: when this host is the profile's device
    (detection's best match), measure them here, so `profiler predict B --profile cpu` predicts on a CPU
    host instead of saying the figure is missing. None for any other profile or host."""
    if profile.kind != "cpu" or profile.figure("device.memory.bandwidth_gbps"):
        return None
    from edgesdk.profiler.device import detect_device

    if detect_device().best_match != profile.name:
        return None
    return host_figures()


def host_figures() -> dict:
    """Bandwidth and FP32 peak of this host, measured now (about a second)."""
    from edgesdk.profiler.device import measure_cpu_peak_flops, measure_memory_bandwidth

    bw, peak = measure_memory_bandwidth(), measure_cpu_peak_flops()
    return {
        "bandwidth_gbps": bw["value_gbps"],
        "method": bw["method"],
        "peak_flops": peak["value_tflops"] * 1e12,
        "peak_method": peak["method"],
    }


def energy_by_power_mode(pred: dict, profile: Profile) -> list[dict] | None:
    """Tokens per joule per power mode of a profile that lists its modes (Jetson), from the predicted decode rate
    and the mode's power budget (the watts in its name: ``15W``). The budget caps module power, so the figure is
    a floor on tokens per joule at the predicted rate; a mode without watts in its name (``MAXN``) has none. The
    rate is predicted at the profile's figures (its top memory clock) for every mode: a mode that lowers the
    memory clock decodes slower than this. None when there is no decode prediction or no mode list."""
    import re

    decode = pred.get("decode") or {}
    modes = profile.power_modes
    if not decode.get("tok_s") or not modes:
        return None
    out = []
    for mode in modes:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)W", str(mode))
        watts = float(m.group(1)) if m else None
        out.append(
            {
                "power_mode": mode,
                "budget_w": watts,
                "tokens_per_joule_floor": decode["tok_s"] / watts if watts else None,
                "reason": None if watts else f"mode {mode} names no power budget",
            }
        )
    return out


def predict_bundle(
    path: str | os.PathLike,
    profile_name: str,
    *,
    batch: int = 1,
    seq: int = 128,
    prompt_tokens: int = 128,
    backend: str | None = None,
    measured: dict | None = None,
    measured_host: dict | None = None,
) -> dict:
    from edgesdk.bundle import open_bundle
    from edgesdk.formats import find_format
    from edgesdk.profiles import resolve_profile

    bundle = open_bundle(path)
    profile = resolve_profile(profile_name)
    if measured_host is None:
        measured_host = this_host_figures_for(profile)
    facts = roofline.bundle_work(bundle, batch=batch, seq=seq)
    fmt = find_format(bundle.format)
    default_backend = fmt.profiler_backend if fmt is not None else None
    pred = roofline.predict(
        facts, profile, backend=backend or default_backend, prompt_tokens=prompt_tokens, measured_host=measured_host
    )
    pred["energy_by_power_mode"] = energy_by_power_mode(pred, profile)
    if measured is not None:
        same = (measured.get("device") or {}).get("best_match") == profile.name
        if same:
            attach_measurement(pred, measured)
        else:
            pred["notes"].append(
                f"the report was measured on {(measured.get('device') or {}).get('best_match')}, "
                f"not {profile.name}: no error shown"
            )
    return pred


def run_profiler(
    path: str | os.PathLike,
    opts: BenchOptions,
    *,
    latency_budget_ms: float | None = None,
    memory_budget_gb: float | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    """Detect the device, measure the bundle, predict for this device's profile, check budgets."""
    from edgesdk.bundle import open_bundle
    from edgesdk.errors import EdgeSDKError
    from edgesdk.profiler.bench import speculative_method
    from edgesdk.profiler.device import detect_device
    from edgesdk.profiles import resolve_profile

    bundle = open_bundle(path)  # verified before any line is printed: a damaged bundle is one error line
    speculative_method(bundle, opts.speculative)  # so is a --speculative this bundle cannot measure
    detection = detect_device()
    device = {k: v for k, v in detection.to_dict().items() if k not in ("candidates",)}
    profile_name = opts.profile or detection.best_match
    profile = resolve_profile(profile_name) if profile_name else None
    log(f"device: {detection.best_match} (confidence {detection.confidence}); profile {profile_name}")
    # Device metrics as OpenTelemetry instruments beside the run's spans, when telemetry exports (else None).
    metrics_handle = observe_device() if opts.device_metrics_interval_s > 0 else None
    try:
        body = measure_bundle(path, opts, log=log, bundle=bundle)
    finally:
        if metrics_handle is not None:
            from edgesdk import telemetry

            telemetry.force_flush()  # one collection while the readers are open
            metrics_handle.close()
    if "device_metrics" in body:
        body["device_metrics"]["otel"] = (
            "exported (hw.* / edgesdk.device.*)" if metrics_handle is not None else "telemetry off: not exported"
        )
    prediction = None
    if profile is not None:
        try:
            prediction = predict_bundle(
                path,
                profile.name,
                batch=opts.batch,
                seq=opts.seq_len,
                prompt_tokens=(body.get("llm") or {}).get("prompt_tokens", opts.prompt_tokens),
                backend=(body.get("runtime") or {}).get("backend"),
                measured_host=host_figures() if profile.kind == "cpu" else None,
            )
            if profile.name == detection.best_match:
                attach_measurement(prediction, body)
            else:
                prediction["notes"].append(
                    f"measured on {detection.best_match}, predicted for {profile.name}: no prediction error shown"
                )
        except EdgeSDKError as exc:
            prediction = {"profile": profile.name, "unavailable": exc.one_line()}
    report = assemble(body, device=device, prediction=prediction, budgets=None)
    report["budgets"] = check_budgets(report, profile, latency_ms=latency_budget_ms, memory_gb=memory_budget_gb)
    return report
