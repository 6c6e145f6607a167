# SPDX-License-Identifier: Apache-2.0
"""``edgesdk profiles list|show|detect``."""

from __future__ import annotations

import click
import yaml

from edgesdk.commands._common import emit_json, table
from edgesdk.profiles import list_profiles, resolve_profile


@click.group("profiles")
def profiles_group() -> None:
    """Device profiles: facts (with sources) and build policies."""


@profiles_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """All device profiles, with aliases."""
    profiles = list_profiles()
    if as_json:
        emit_json([p.summary() for p in profiles])
        return
    rows = [
        [
            p.name,
            p.kind,
            p.sm or "-",
            p.figure("device.memory.total_gb"),
            p.figure("device.memory.bandwidth_gbps"),
            p.software_version("tensorrt") or "-",
            p.dla_cores,
            "/".join(p.precision_order),
            ", ".join(p.aliases),
        ]
        for p in profiles
    ]
    click.echo(table(rows, ["profile", "kind", "sm", "mem GB", "BW GB/s", "TRT", "DLA", "precision", "aliases"]))
    click.echo("\nfigures and their sources: edgesdk profiles show NAME")


@profiles_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show_cmd(name: str, as_json: bool) -> None:
    """One profile by name, alias or path to a YAML file."""
    p = resolve_profile(name)
    if as_json:
        emit_json({"name": p.name, "path": str(p.path), "resolved_from": p.resolved_from, "profile": p.data})
        return
    if p.resolved_from:
        click.echo(f"# {p.resolved_from!r} is an alias of {p.name}")
    click.echo(f"# {p.path}")
    click.echo(yaml.safe_dump(p.data, sort_keys=False, width=120).rstrip())


@profiles_group.command("detect")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--write",
    "write_path",
    type=click.Path(dir_okay=False),
    help="Write a profile for this machine: its measured CPU ISA, memory, budget and bandwidth.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --write file.")
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False),
    default="/",
    hidden=True,
    help="Read /proc, /etc and the device tree below this directory (a captured device's files).",
)
def detect_cmd(as_json: bool, write_path: str | None, force: bool, root: str) -> None:
    """Detect this device and match it to a profile (with confidence and evidence)."""
    from pathlib import Path

    from edgesdk.errors import InputError, OutputExistsError
    from edgesdk.profiler.device import detect_device, write_profile

    if force and not write_path:
        raise InputError("--force overwrites a --write file: pass --write FILE")
    if write_path and Path(write_path).exists() and not force:
        raise OutputExistsError(f"profile file exists: {write_path}", hint="pass --force to overwrite it")
    result = detect_device(root)
    if write_path:
        write_profile(result, write_path)
    if as_json:
        emit_json(result.to_dict())
        return
    d = result.to_dict()
    click.echo(f"best match: {d.get('best_match')} (confidence {d.get('confidence')})")
    for ev in d.get("evidence", []):
        click.echo(f"  - {ev}")
    others = [f"{c['profile']} {c['confidence']}" for c in d.get("candidates", [])[1:4]]
    if others:
        click.echo(f"other candidates: {', '.join(others)}")
    if write_path:
        bw = d.get("bandwidth") or {}
        click.echo(f"measured memory bandwidth: {bw.get('value_gbps')} GB/s ({bw.get('method')})")
        click.echo(f"wrote {write_path}")


def register(group: click.Group) -> None:
    group.add_command(profiles_group)
