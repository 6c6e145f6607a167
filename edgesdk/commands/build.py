# SPDX-License-Identifier: Apache-2.0
"""``edgesdk build MODEL --profile P -o OUT``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgesdk.commands._common import emit_json, profile_option, progress_enabled
from edgesdk.formats import FormatOptions, format_names, option_classes

if TYPE_CHECKING:
    from edgesdk.manifest import Manifest, ParityCheck

#: each format's own options (quantization type, shape bounds, ...), declared in its package: build_cmd's
#: click options beyond the shared ones below, listed after --name in registry order
FORMAT_OPTIONS = option_classes()


def format_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the formats' click options (:data:`FORMAT_OPTIONS`) to ``command``, in their order."""
    for option in reversed([o for cls in FORMAT_OPTIONS for o in cls.click_options()]):
        command = option(command)  # click lists the options last applied first
    return command


@click.command("build")
@click.argument("model", metavar="MODEL")
@profile_option(required=True, help="Device profile name, alias or YAML path.")
@click.option("--output", "-o", "output", type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--format", "fmt", type=click.Choice(format_names(selectable=True)), help="Override the planned format.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8"]), help="Override the precision.")
@click.option(
    "--name",
    "model_name",
    help="Model name in spans, manifest, SBOM and reports (default: the source's file or directory name).",
)
@format_options
@click.option("--explain", is_flag=True, help="Print the plan with a reason for every decision.")
@click.option("--plan-only", is_flag=True, help="Plan and explain, build nothing.")
@click.option("--json", "as_json", is_flag=True, help="Emit the plan (and result) as JSON.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option(
    "--on-parity-fail",
    type=click.Choice(["error", "fallback"]),
    default="error",
    show_default=True,
    help="On a parity miss: fail, or fall back to the next precision (recorded).",
)
@click.option("--allow-pickle", is_flag=True, help="Accept pickle weights (can execute code on load).")
@click.option("--trust-remote-code", is_flag=True, help="Run model code shipped with the model directory.")
@click.option("--license-policy", type=click.Path(exists=True, dir_okay=False), help="Policy extending the default.")
@click.option("--waivers", type=click.Path(exists=True, dir_okay=False), help="Waivers file (who/why/expiry).")
@click.option("--accept-license", "accept", multiple=True, help="Accept a review-level license id (repeatable).")
@click.option(
    "--model-license",
    metavar="SPDX-OR-LicenseRef",
    help="The model's license when it declares none itself (e.g. your own model: Apache-2.0, "
    "LicenseRef-acme-proprietary); recorded in the manifest and SBOM, judged by the policy.",
)
@click.option("--scanoss-url", help="SCANOSS API to match fingerprints against (else offline only).")
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write the build trace as OTLP-JSON lines.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--cache",
    metavar="oci://REGISTRY/NAMESPACE/NAME",
    help="Shared build cache: pull the bundle built before with the same source, profile, options and tool "
    "versions instead of building; push it after a build (docs/distribution.md).",
)
def build_cmd(
    model: str,
    profile: str,
    output: Path | None,
    fmt,
    precision,
    explain: bool,
    plan_only: bool,
    as_json: bool,
    force: bool,
    on_parity_fail: str,
    allow_pickle: bool,
    trust_remote_code: bool,
    license_policy,
    waivers,
    accept,
    model_license,
    scanoss_url,
    trace_file,
    no_progress,
    model_name,
    cache: str | None = None,
    **format_values: Any,
) -> int:
    """Plan, export, verify, license-gate and package MODEL for a device profile.

    MODEL: a Hugging Face directory, an .onnx or .gguf file, or a Hugging Face model id (org/name or
    hf://org/name: from the local Hugging Face cache, else downloaded into it; a local path of that name wins)."""
    from edgesdk import build as B
    from edgesdk import telemetry
    from edgesdk.errors import InputError
    from edgesdk.extras import BUILD_MODULES, require
    from edgesdk.types import BuildOptions

    given = [cls.from_values(format_values) for cls in FORMAT_OPTIONS]
    check_flags(output=output, plan_only=plan_only, explain=explain, as_json=as_json, force=force, fmt=fmt, given=given)
    if cache is not None:
        from edgesdk.distribution.cache import cache_reference

        if plan_only:
            raise InputError("--plan-only builds nothing, so --cache has nothing to look up: drop one")
        cache_reference(cache)  # a malformed reference is exit 3 before anything is planned
    require("build", BUILD_MODULES, "edgesdk build")
    options = BuildOptions(
        format=fmt,
        precision=precision,
        force=force,
        allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code,
        on_parity_fail=on_parity_fail,
        license_policy=license_policy,
        waivers=waivers,
        accept_licenses=tuple(accept),
        scanoss_url=scanoss_url,
        name=check_name(model_name) if model_name is not None else None,
    )
    for values in given:
        values.apply(options)  # into BuildOptions' fields (TensorRT parses --shapes here: InputError)
    if trace_file:
        telemetry.configure(trace_file=trace_file)
    options.model_license = check_model_license(model_license, license_policy)
    options.progress = progress_enabled(not no_progress and not as_json)
    src, hub = resolve_source(model, options)
    plan = B.make_plan(src, profile, options)
    if hub is not None:  # the plan's JSON and the manifest's model record keep the id and revision
        plan.model.setdefault("extra", {})["hub"] = hub.record()
        if plan.facts is not None:
            plan.facts.extra["hub"] = hub.record()
    for values in given:
        values.check_plan(plan.format)  # an option the planned format has no use for
    if plan_only and as_json:
        emit_json(plan.to_dict())
        return 0
    if explain or plan_only:
        click.echo(explain_text(plan))
    if plan_only:
        return 0
    if output is None:
        raise InputError("--output/-o is required (or pass --plan-only)")
    if model_license is None:  # after planning (a broken model is exit 3 first), before the export
        check_declares_a_license(src, license_policy)
    cached = None
    if cache is not None:  # the shared build cache (edgesdk/distribution/cache.py): a hit replaces the build
        from edgesdk.commands._common import info
        from edgesdk.distribution.cache import BuildCache

        build_cache = BuildCache(cache, src, plan, options, output, say=info)
        cached = build_cache.restore()
    if cached is None or not cached.hit:
        out = B.build(src, profile, output, options, plan=plan)
        if cache is not None and (cached is None or cached.note is None):
            cached = build_cache.store(out)
    else:
        out = output
    manifest = json.loads((out / "manifest.json").read_text())
    if as_json:
        emit_json({"bundle": str(out), "plan": plan.to_dict(), "manifest": manifest}
                  | ({"cache": cached.to_dict()} if cached is not None else {}))  # fmt: skip
        return 0
    from edgesdk.manifest import Manifest

    click.echo(summarize(out, Manifest.from_dict(manifest)))
    return 0


def resolve_source(source: str, options) -> tuple[Path, Any]:
    """MODEL as a path: a local file or directory as given; a Hugging Face model id (``org/name``,
    ``hf://org/name``) from the cache or downloaded (edgesdk/hub.py), its last part the default --name."""
    from edgesdk import hub
    from edgesdk.commands._common import info

    found = hub.resolve(source, progress=options.progress, say=info)
    if found is None:
        return Path(source), None
    if options.name is None:
        options.name = check_name(found.name)
    return found.path, found


# Flags that cannot go together (each pair exits 3; docs/exit-codes.md lists them).
EXCLUSIVE = (
    ("plan_only", "output", "--plan-only builds nothing: drop -o/--output, or drop --plan-only to build"),
    ("plan_only", "force", "--plan-only builds nothing, so --force has nothing to replace"),
    ("json", "explain", "--json prints the plan as JSON and --explain as text: pass one"),
)


def check_flags(
    *, output, plan_only: bool, explain: bool, as_json: bool, force: bool, fmt, given: list[FormatOptions]
) -> None:
    """Refuse contradictory flags before any work (exit 3): shared ones, then each format's against --format."""
    from edgesdk.errors import InputError

    flags = {"plan_only": plan_only, "output": output is not None, "force": force, "json": as_json, "explain": explain}
    for a, b, why in EXCLUSIVE:
        if flags[a] and flags[b]:
            raise InputError(why)
    for values in given:
        values.check_request(fmt)


#: plan decisions whose value is a bare number in the plan's JSON, and the unit the text shows it with
DECISION_UNITS = {"memory": "GB"}


def explain_text(plan) -> str:
    """``plan.explain()`` with units on the numbers that have one (``memory  0.045 GB``, not ``0.045``)."""
    lines = plan.explain().splitlines()
    width = max((len(d.key) for d in plan.decisions), default=8)
    for d in plan.decisions:
        unit = DECISION_UNITS.get(d.key)
        if unit and isinstance(d.value, (int, float)) and not isinstance(d.value, bool):
            bare = f"  {d.key:<{width}}  {d.value}"
            lines = [f"{bare} {unit}" if line == bare else line for line in lines]
    return "\n".join(lines)


def check_name(name: str) -> str:
    """--name: 1-128 printable characters without path separators (it names spans, the SBOM and reports)."""
    import re

    from edgesdk.errors import InputError

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+@:-]{0,127}", name):
        raise InputError(
            f"--name {name[:60]!r}: use 1-128 characters from letters, digits and . _ + @ : - "
            "(starting with a letter or digit)"
        )
    return name


def _parity_lines(checks: list[ParityCheck]) -> list[str]:
    """One line per parity check the manifest records: ONNX/TensorRT per precision, GGUF/VLM decoder logits and
    perplexity, VLM image features and greedy tokens."""

    def num(value: float | None, spec: str) -> str:  # a figure not recorded prints as nan
        return format(float("nan") if value is None else value, spec)

    lines = []
    for c in checks:
        if c.kind == "logits":
            lines.append(
                f"parity logits (HF vs F16 GGUF): min cosine {num(c.min_cosine, '.5f')}, "
                f"top-1 agreement {num(c.top1, '.3f')} over {c.positions} positions"
            )
        elif c.kind == "vision":
            ties = c.greedy_near_tie or ""
            tie_text = "" if ties.startswith("0/") or not ties else f", first differing at a near-tie on {ties}"
            lines.append(
                f"parity image features ({c.encoder or 'F16 mmproj'} vs PyTorch): min cosine "
                f"{num(c.min_cosine, '.6f')} per image token; greedy tokens equal on "
                f"{c.greedy_equal} test images{tie_text}"
            )
        elif c.kind == "precision":
            lines.append(
                f"parity {c.label}: min cosine {num(c.min_cosine, '.5f')}, max abs "
                f"{'-' if c.max_abs is None else format(c.max_abs, '.4g')} over "
                f"{'?' if c.samples is None else c.samples} samples "
                f"vs {c.reference} -> {'pass' if c.passed else 'FAIL'}"
            )
        elif c.kind == "perplexity":
            lines.append(f"parity perplexity: {num(c.ppl, '.3f')}, {c.ppl_ratio}x the {c.reference}")
        elif c.kind == "none":
            lines.append(f"parity: {c.reference}")
    return lines


def summarize(out: Path, m: Manifest) -> str:
    lines = [f"bundle: {out}  (id {m.bundle_id}, {m.format}/{m.precision}, profile {m.profile.name})"]
    lines += _parity_lines(m.parity_checks())
    for f in m.fallbacks:
        lines.append(f"fallback: {f['from']} -> {f['to']}: {f['reason']}")
    if m.license:
        lines.append(f"license gate: {m.license_verdict}")
    total = sum(a.bytes or 0 for a in m.artifacts)
    lines.append(f"artifacts: {len(m.artifacts)} files, {total / 1e6:.1f} MB; build {m.build['wall_s']} s")
    return "\n".join(lines)


def check_model_license(value: str | None, policy_path: str | None) -> str | None:
    """Validate --model-license before anything is built: its syntax, and a policy that would deny it."""
    if value is None:
        return None
    from edgesdk.compliance.gate import gate_hint
    from edgesdk.compliance.models import declared_finding, parse_model_license
    from edgesdk.compliance.policy import load_policy
    from edgesdk.errors import LicenseGateError

    expression = parse_model_license(value)
    policy = load_policy(Path(policy_path) if policy_path else None)
    decision = policy.evaluate(expression)
    if decision.action == "deny":
        finding = declared_finding(expression, "model")
        raise LicenseGateError(
            f"license gate: deny: --model-license {expression}: {decision.reason} (policy {policy.id})",
            hint=gate_hint("deny", finding, policy),
        )
    return expression


def check_declares_a_license(model: Path, policy_path: str | None) -> None:
    """Before the export: a model that declares no license anywhere the gate reads (model card, ONNX/GGUF
    metadata, the package that ships it) is refused now when the policy denies that, instead of after the
    export (the same verdict the gate would give; --model-license declares one)."""
    if not model.exists():
        return  # make_plan says so, with its own message
    from edgesdk.compliance.gate import refuse_undeclared
    from edgesdk.compliance.models import model_findings, package_finding

    root = model if model.is_dir() else model.parent
    found = [f for f in model_findings(model, root) if f.spdx or "front matter" in f.source]
    if (pkg := package_finding(model, found)) is not None:
        found.append(pkg)
    if found:
        return  # declared (even `license: unknown` on a card): the gate judges it after the build
    refuse_undeclared(
        model.name,
        "model card / GGUF / ONNX metadata",
        model.name,
        "no model card license, ONNX/GGUF license field or owning package",
        policy_path,
        when=": refused before the export",
    )


def register(group: click.Group) -> None:
    group.add_command(build_cmd)
