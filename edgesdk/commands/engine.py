# SPDX-License-Identifier: Apache-2.0
"""``edgesdk engine build BUNDLE``: build (and cache) a bundle's deferred TensorRT engine on this device."""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.commands._common import emit_json


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
def engine_show_cmd(bundle: Path) -> int:
    """Print the bundle's engine build configuration, this host's pre-flight and the trtexec equivalent."""
    from edgesdk.formats.tensorrt.build import describe_bundle_engine

    emit_json(describe_bundle_engine(bundle))
    return 0


def register(group: click.Group) -> None:
    group.add_command(engine_group)
