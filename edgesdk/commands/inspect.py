# SPDX-License-Identifier: Apache-2.0
"""``edgesdk inspect capability MODEL.onnx --profile P``: which ops run where, before any engine build."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.commands._common import also_write_option, emit_json, profile_option, warn


@click.group("inspect")
def inspect_group() -> None:
    """Inspect a model against a device profile."""


@inspect_group.command("capability")
@click.argument("model", type=click.Path(path_type=Path))
@profile_option(
    "profile_name", help="Device profile name, alias or YAML path (default for a bundle: the profile it was built for)."
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "bf16", "int8"]),
    help="Precision to check for (default: the profile's first).",
)
@click.option("--dla/--no-dla", "dla", default=None, help="Consider the DLA (default: when the profile has one).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--strict", is_flag=True, help="Exit 2 when some op runs on no backend of the profile.")
@also_write_option(
    "--html", "Also write a self-contained HTML page of the partitions (coloured by placement) and crossings."
)
@also_write_option(
    "--dot",
    "Also write a Graphviz DOT graph: one cluster per partition, nodes coloured by placement, "
    "boundary crossings in red (render: dot -Tsvg FILE).",
)
def capability_cmd(
    model: Path,
    profile_name: str | None,
    precision,
    dla,
    as_json: bool,
    strict: bool,
    html_path: Path | None,
    dot_path: Path | None,
) -> int:
    """Per-op support on TensorRT / DLA / CUDA EP / CPU EP, partitions, and what falls back where.

    MODEL is an .onnx file or a bundle directory (its ONNX artifact is checked)."""
    from edgesdk.errors import InputError, VerdictError
    from edgesdk.extras import require

    if model.is_dir() and (model / "manifest.json").is_file():
        from edgesdk.bundle import open_bundle

        bundle = open_bundle(model)
        if bundle.format in ("gguf", "vlm"):
            raise InputError(
                f"{model}: a {bundle.format.upper()} bundle has no ONNX graph to check: inspect "
                "capability reads ONNX models and bundles (llama.cpp runs every op of a GGUF on its "
                "own CPU/CUDA kernels)"
            )
        if not bundle.has_artifact("model") or bundle.artifact_path("model").suffix != ".onnx":
            raise InputError(f"bundle {model} has no ONNX model artifact (format {bundle.format})")
        profile_name = profile_name or bundle.manifest.profile.name
        precision = precision or (bundle.precision if bundle.precision in ("fp32", "fp16", "bf16", "int8") else None)
        model = bundle.artifact_path("model")
    elif model.suffix.lower() == ".gguf":
        raise InputError(
            f"{model}: a GGUF file has no ONNX graph to check: inspect capability reads ONNX models and bundles"
        )
    if not profile_name:
        raise InputError("--profile is required for an .onnx file")
    require("build", "onnx", "edgesdk inspect capability")  # the runtime-only install has no onnx: exit 10
    from edgesdk.capability import check_capability, precision_report_from, render_table
    from edgesdk.profiles import resolve_profile

    profile = resolve_profile(profile_name)
    report = check_capability(model, profile, precision, use_dla=dla)
    prec = precision_report_from(report) if report.precision != "fp32" else None
    from edgesdk.capability.render import render_dot, render_html

    for dest, render in ((html_path, render_html), (dot_path, render_dot)):
        if dest is not None:
            try:
                dest.write_text(render(report), encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    if as_json:
        data = report.to_dict()
        data["precision_report"] = prec
        emit_json(data)
    else:
        click.echo(render_table(report))
        if prec:
            click.echo("")
            click.echo("\n".join(prec["explanation"]))
    none = sorted({n.op_type for n in report.unsupported_everywhere()})
    if none:
        msg = f"no backend of {profile.name} runs {', '.join(none)} ({len(report.unsupported_everywhere())} nodes)"
        if strict:
            raise VerdictError(msg)
        warn(msg)
    return 0


def register(group: click.Group) -> None:
    group.add_command(inspect_group)
