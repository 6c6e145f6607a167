# SPDX-License-Identifier: Apache-2.0
"""``edgesdk engine build|show BUNDLE``: build (and cache) a bundle's deferred TensorRT engine on this device, or
show its build configuration (a human view; ``--json`` for the full record)."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.commands._common import emit_json, table


@click.group("engine")
def engine_group() -> None:
    """TensorRT engines of tensorrt bundles."""


@engine_group.command("build")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Rebuild even when a cached engine exists.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def engine_build_cmd(bundle: Path, force: bool, as_json: bool) -> int:
    """Pre-flight this host against the bundle's target, then build the engine into the engine cache."""
    from edgesdk.formats.tensorrt.build import build_bundle_engine

    result = build_bundle_engine(bundle, force=force)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"engine {result['status']}: {result['engine']} (cache key {result['cache_key']})")
    return 0


@engine_group.command("show")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the full configuration).")
def engine_show_cmd(bundle: Path, as_json: bool) -> int:
    """Print the bundle's engine build configuration, this host's pre-flight and the trtexec equivalent."""
    from edgesdk.formats.tensorrt.build import describe_bundle_engine

    info = describe_bundle_engine(bundle)
    if as_json:
        emit_json(info)
    else:
        click.echo(render_engine(info))
    return 0


def _dims(d: list) -> str:
    return "x".join(str(x) for x in d)


def render_engine(info: dict) -> str:
    """The human view of ``engine show``: target, precision, DLA, shape profiles, where the engine is, trtexec."""
    cfg = info["config"]
    target = cfg.get("target") or {}
    lines = [
        f"bundle: {info['bundle']}",
        f"target: {target.get('profile')} (sm {target.get('sm')}, TensorRT {target.get('tensorrt')}"
        + (f", L4T {target['l4t']}" if target.get("l4t") else "")
        + ")",
        f"precision: {cfg.get('precision')} (builder flags: {', '.join(cfg['precision_flags']) or 'none'})",
        "dla: "
        + (
            f"core {cfg['dla']['core']}, GPU fallback {'on' if cfg['dla'].get('gpu_fallback') else 'off'}"
            if cfg.get("dla")
            else "off"
        ),
        f"workspace: {cfg['workspace_mb']} MB, builder optimization level {cfg['builder_optimization_level']}",
    ]
    profiles = cfg.get("optimization_profiles") or []
    if not profiles:
        lines.append("optimization profiles: none (static shapes)")
    for i, prof in enumerate(profiles):
        rows = [[name, _dims(s["min"]), _dims(s["opt"]), _dims(s["max"])] for name, s in prof.items()]
        lines.append(f"optimization profile {i}:")
        lines.extend("  " + r for r in table(rows, ["input", "min", "opt", "max"]).splitlines())
    problems = info.get("preflight_problems") or []
    lines.append(
        "this host: "
        + (
            "matches the target: `edgesdk engine build` builds here"
            if not problems
            else "cannot build it: " + "; ".join(problems)
        )
    )
    engine = (
        "prebuilt in the bundle"
        if info.get("prebuilt_engine")
        else (
            f"cached at {info['cache']['engine']}"
            if info["cache"].get("engine")
            else f"not built ({info['cache']['state']})"
        )
    )
    lines.append(f"engine: {engine}")
    lines.append(f"cache key: {cfg['cache_key']}")
    if cfg.get("trtexec"):
        lines.append(f"trtexec equivalent: {cfg['trtexec']}")
    return "\n".join(lines)


def register(group: click.Group) -> None:
    group.add_command(engine_group)
