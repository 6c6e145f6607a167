# SPDX-License-Identifier: Apache-2.0
"""``edgesdk build MODEL --profile P -o OUT``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgesdk.commands._common import emit_json
from edgesdk.formats import format_names


@click.command("build")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--profile", "-p", "profile", required=True, help="Device profile name, alias or YAML path.")
@click.option("--output", "-o", "output", type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--format", "fmt", type=click.Choice(format_names(selectable=True)), help="Override the planned format.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8"]), help="Override the precision.")
@click.option("--quant-type", help="GGUF quantization type (e.g. Q4_K_M) instead of the planned one.")
@click.option("--context-length", type=int, help="LLM context length to plan memory for.")
@click.option("--dla/--no-dla", default=None, help="Force DLA on/off for TensorRT builds (Orin AGX/NX).")
@click.option("--explain", is_flag=True, help="Print the plan with a reason for every decision.")
@click.option("--plan-only", is_flag=True, help="Plan and explain, build nothing.")
@click.option("--json", "as_json", is_flag=True, help="Emit the plan (and result) as JSON.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--on-parity-fail", type=click.Choice(["error", "fallback"]), default="error", show_default=True,
              help="On a parity miss: fail, or fall back to the next precision (recorded).")
@click.option("--allow-pickle", is_flag=True, help="Accept pickle weights (can execute code on load).")
@click.option("--trust-remote-code", is_flag=True, help="Run model code shipped with the model directory.")
@click.option("--license-policy", type=click.Path(exists=True, dir_okay=False), help="Policy extending the default.")
@click.option("--waivers", type=click.Path(exists=True, dir_okay=False), help="Waivers file (who/why/expiry).")
@click.option("--accept-license", "accept", multiple=True, help="Accept a review-level license id (repeatable).")
@click.option("--scanoss-url", help="SCANOSS API to match fingerprints against (else offline only).")
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write the build trace as OTLP-JSON lines.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def build_cmd(model: Path, profile: str, output: Path | None, fmt, precision, quant_type, context_length, dla,
              explain: bool, plan_only: bool, as_json: bool, force: bool, on_parity_fail: str, allow_pickle: bool,
              trust_remote_code: bool, license_policy, waivers, accept, scanoss_url, trace_file, no_progress) -> int:
    """Plan, export, verify, license-gate and package MODEL for a device profile."""
    from edgesdk import build as B
    from edgesdk import telemetry
    from edgesdk.errors import InputError
    from edgesdk.extras import BUILD_MODULES, require
    from edgesdk.types import BuildOptions

    require("build", BUILD_MODULES, "edgesdk build")
    if trace_file:
        telemetry.configure(trace_file=trace_file)
    options = BuildOptions(format=fmt, precision=precision, force=force, allow_pickle=allow_pickle,
                           trust_remote_code=trust_remote_code, on_parity_fail=on_parity_fail, dla=dla,
                           quant_type=quant_type, context_length=context_length, license_policy=license_policy,
                           waivers=waivers, accept_licenses=tuple(accept), scanoss_url=scanoss_url,
                           progress=not no_progress and not as_json)
    plan = B.make_plan(model, profile, options)
    if plan_only and as_json:
        emit_json(plan.to_dict())
        return 0
    if (explain or plan_only) and not as_json:
        click.echo(plan.explain())
    if plan_only:
        return 0
    if output is None:
        raise InputError("--output/-o is required (or pass --plan-only)")
    out = B.build(model, profile, output, options, plan=plan)
    manifest = json.loads((out / "manifest.json").read_text())
    if as_json:
        emit_json({"bundle": str(out), "plan": plan.to_dict(), "manifest": manifest})
        return 0
    click.echo(summarize(out, manifest))
    return 0


def summarize(out: Path, m: dict) -> str:
    lines = [f"bundle: {out}  (id {m['bundle_id']}, {m['format']}/{m['precision']}, profile {m['profile']['name']})"]
    for prec, p in (m.get("parity") or {}).items():
        if isinstance(p, dict) and "min_cosine" in p:
            lines.append(f"parity {prec}: min cosine {p['min_cosine']:.5f}, max abs {p['max_abs']:.4g} over "
                         f"{p['samples']} samples vs {p.get('reference')} -> {'pass' if p.get('passed') else 'FAIL'}")
    for f in m.get("fallbacks") or []:
        lines.append(f"fallback: {f['from']} -> {f['to']}: {f['reason']}")
    lic = m.get("license") or {}
    if lic:
        lines.append(f"license gate: {lic.get('verdict')}")
    total = sum(a["bytes"] for a in m["artifacts"])
    lines.append(f"artifacts: {len(m['artifacts'])} files, {total / 1e6:.1f} MB; build {m['build']['wall_s']} s")
    return "\n".join(lines)


def register(group: click.Group) -> None:
    group.add_command(build_cmd)
