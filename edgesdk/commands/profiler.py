# SPDX-License-Identifier: Apache-2.0
"""``edgesdk profiler run|predict|compare``: measure a bundle here, predict it elsewhere, gate CI on both."""

from __future__ import annotations

import click

from edgesdk.commands._common import emit_json, info, profile_option, progress_enabled, warn


def _count(name: str, low: int, default: int, help: str | None = None):
    """A whole-number option of at least ``low``, its default shown in --help."""
    return click.option(name, type=click.IntRange(min=low), default=default, show_default=True, help=help)


@click.group("profiler")
def profiler_group() -> None:
    """Device profiler: measure a bundle on this device, predict other devices, compare reports."""


@profiler_group.command("run")
@click.argument("bundle", type=click.Path())
@_count("--warmup", 0, 10, "Untimed calls first.")
@_count("--iterations", 1, 200, "Timed calls.")
@_count("--concurrency", 1, 1, "Also measure throughput with N threads calling the session.")
@_count("--batch", 1, 1, "Batch of synthetic inputs.")
@_count("--seq-len", 1, 128, "Sequence length of synthetic inputs (dynamic dims).")
@_count("--prompt-tokens", 1, 128, "LLM prompt size.")
@_count("--gen-tokens", 2, 128, "LLM tokens to generate.")
@_count("--repeats", 1, 3, "LLM generations measured (after one warm-up generation).")
@click.option(
    "--speculative",
    type=click.Choice(["auto", "lookup", "draft", "off"]),
    default="auto",
    show_default=True,
    help="GGUF LLMs: also measure decode with speculative decoding by this method against none, on a prompt to "
    "copy: lookup (prompt lookup), draft (the draft model of a bundle built with --draft), auto (draft where the "
    "bundle has one, else lookup), off (not measured).",
)
@click.option("--threads", type=click.IntRange(min=1), help="Runtime threads (default: the runtime's).")
@_count("--op-profile-runs", 0, 10, "ONNX Runtime profiler runs for per-node time (0: skip).")
@profile_option(help="Profile to predict and check budgets for (default: detected).")
@click.option("--latency-budget-ms", type=float, help="Latency target (default: the profile's latency_target_ms).")
@click.option("--memory-budget-gb", type=float, help="Memory target (default: the profile's memory budget).")
@click.option("--fail-on-budget", is_flag=True, help="Exit 2 when a budget is missed (default: warn).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write a PNG: latency histogram and op times (encoders); TTFT, prefill and decode of every repeat (LLMs).",
)
@click.option(
    "--device-metrics-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Read GPU utilisation, power, temperature and clocks every S seconds during the run (0: off).",
)
@click.option("--no-energy", is_flag=True, help="Do not measure energy (the report says it was off).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def run_cmd(
    bundle,
    warmup,
    iterations,
    concurrency,
    batch,
    seq_len,
    prompt_tokens,
    gen_tokens,
    repeats,
    speculative,
    threads,
    op_profile_runs,
    profile,
    latency_budget_ms,
    memory_budget_gb,
    fail_on_budget,
    as_json,
    output,
    plot,
    device_metrics_interval,
    no_energy,
    no_progress,
) -> int:
    """Measure BUNDLE on this device: latency, throughput, memory, LLM rates, per-op time, fallbacks."""
    from edgesdk.extras import require

    if plot:
        require("profiler", "matplotlib", "--plot")
    require("profiler", "onnx", "edgesdk profiler run")
    from edgesdk.profiler.api import run_profiler
    from edgesdk.profiler.bench import BenchOptions
    from edgesdk.profiler.plots import plot_report
    from edgesdk.profiler.report import enforce_budgets, render_table, save_report

    opts = BenchOptions(
        warmup=warmup,
        iterations=iterations,
        concurrency=concurrency,
        batch=batch,
        seq_len=seq_len,
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        llm_repeats=repeats,
        speculative=speculative,
        ort_profile_runs=op_profile_runs,
        threads=threads,
        profile=profile,
        progress=progress_enabled(not no_progress and not as_json),
        device_metrics_interval_s=device_metrics_interval,
        energy=not no_energy,
    )
    log = (lambda _m: None) if as_json else info
    report = run_profiler(bundle, opts, latency_budget_ms=latency_budget_ms, memory_budget_gb=memory_budget_gb, log=log)
    if output:
        save_report(report, output)
    if plot:
        plot_report(report, plot)
    if as_json:
        emit_json(report)
    else:
        click.echo(render_table(report))
        if output:
            click.echo(f"report: {output}")
        if plot:
            click.echo(f"plot: {plot}")
    for msg in enforce_budgets(report["budgets"], fail=fail_on_budget):
        warn(msg)
    for flag in (report.get("device_state") or {}).get("flagged") or []:
        warn(flag)
    return 0


@profiler_group.command("predict")
@click.argument("bundle", type=click.Path())
@profile_option("profiles", multiple=True, required=True, help="Device profile to predict for (repeatable).")
@_count("--batch", 1, 1)
@_count("--seq-len", 1, 128)
@_count("--prompt-tokens", 1, 128)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="A measured report: show the prediction error for the profile it was measured on.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write a roofline PNG per profile: roofs, the model's arithmetic intensity, bound, prediction, "
    "measured point (with --report).",
)
def predict_cmd(bundle, profiles, batch, seq_len, prompt_tokens, report_path, as_json, plot) -> int:
    """Roofline prediction of BUNDLE on device profiles (bandwidth, peak rates, calibrated efficiency)."""
    from edgesdk.extras import require

    if plot:
        require("profiler", "matplotlib", "--plot")
    require("profiler", "onnx", "edgesdk profiler predict")
    from edgesdk.profiler.api import predict_bundle
    from edgesdk.profiler.report import load_report, prediction_lines

    measured = load_report(report_path) if report_path else None
    results = [
        predict_bundle(
            bundle,
            name,
            batch=batch,
            seq=seq_len,
            prompt_tokens=prompt_tokens,
            measured=measured,
            measured_host=_host_figures_of(measured, name),
        )
        for name in profiles
    ]
    if plot:
        from edgesdk.profiler.plots import plot_roofline

        plot_roofline(results, plot, measured)
    if as_json:
        emit_json(results)
        return 0
    for pred in results:
        for line in prediction_lines(pred):
            click.echo(line)
        for sec in ("encoder", "decode", "prefill"):
            if pred.get(sec) and pred[sec].get("efficiency_source"):
                click.echo(f"  {sec} efficiency from: {pred[sec]['efficiency_source']}")
        for row in pred.get("energy_by_power_mode") or []:
            if row["tokens_per_joule_floor"] is None:
                click.echo(f"  {row['power_mode']}: tokens per joule unknown ({row['reason']})")
            else:
                click.echo(
                    f"  {row['power_mode']}: >= {row['tokens_per_joule_floor']:.3g} tokens per joule at the predicted "
                    f"decode rate (module power at most the {row['budget_w']:g} W budget)"
                )
        for note in pred.get("notes", []):
            click.echo(f"  note: {note}")
    if plot:
        click.echo(f"plot: {plot}")
    return 0


def _host_figures_of(measured: dict | None, profile_name: str) -> dict | None:
    """The bandwidth and peak a report measured on its host (``profiler run`` does this for generic CPU
    profiles), to fill the same profile's missing figures when predicting for it with ``--report``."""
    from edgesdk.profiles import resolve_profile

    if not measured or (measured.get("device") or {}).get("best_match") != resolve_profile(profile_name).name:
        return None
    pred = measured.get("prediction") or {}
    if not pred.get("bandwidth_gbps"):
        return None
    return {
        "bandwidth_gbps": pred["bandwidth_gbps"],
        "peak_flops": pred.get("peak_flops"),
        "method": "as measured on this host by the report's run",
        "peak_method": "as measured on this host by the report's run",
    }


@profiler_group.command("compare")
@click.argument("base", type=click.Path())
@click.argument("new", type=click.Path())
@click.option(
    "--max-regression",
    help="Exit 2 if a gated metric is worse by more than this (e.g. 5%) and by more than the runs' noise.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write a PNG: base vs new bars of each key metric (p50 with p99 marked).",
)
@click.option(
    "--allow-power-mode-mismatch",
    is_flag=True,
    help="Compare reports taken under different power modes (default: refuse, exit 3); a warning is printed.",
)
def compare_cmd(base, new, max_regression, as_json, plot, allow_power_mode_mismatch) -> int:
    """Two reports side by side with ratios and noise; a regression gate for CI."""
    from edgesdk.errors import InputError, VerdictError
    from edgesdk.extras import require
    from edgesdk.profiler.compare import compare_reports, parse_threshold, render_comparison
    from edgesdk.profiler.report import load_report

    if plot:
        require("profiler", "matplotlib", "--plot")
    base_report, new_report = load_report(base), load_report(new)
    result = compare_reports(base_report, new_report, parse_threshold(max_regression))
    if result["power_mode_mismatch"]:
        if not allow_power_mode_mismatch:
            raise InputError(
                f"{result['power_mode_mismatch']}: not comparable",
                hint="measure both under one mode (nvpmodel -m N), or pass --allow-power-mode-mismatch",
            )
        warn(f"{result['power_mode_mismatch']}: differences are mostly the power mode, not the change")
    for flag in result["throttled"]:
        warn(flag)
    if plot:
        from edgesdk.profiler.plots import plot_comparison

        plot_comparison(base_report, new_report, result, plot)
    if as_json:
        emit_json(result)
    else:
        click.echo(render_comparison(result))
        if plot:
            click.echo(f"plot: {plot}")
    if result["regressions"]:
        raise VerdictError(
            f"performance regression beyond {result['max_regression_pct']:.3g}% and noise: "
            + ", ".join(result["regressions"])
        )
    return 0


def register(group: click.Group) -> None:
    group.add_command(profiler_group)
