# SPDX-License-Identifier: Apache-2.0
"""``edgesdk doctor``: which backends, EPs and GPUs are usable here, and why not for the rest."""

from __future__ import annotations

import click

from edgesdk.commands._common import emit_json, table


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor_cmd(as_json: bool) -> int:
    """Check what can run on this machine."""
    from edgesdk.doctor import diagnose

    checks = diagnose()
    if as_json:
        emit_json(checks)
        return 0
    rows = [[c["component"], "yes" if c["available"] else "no", c.get("version") or "-", c["detail"]] for c in checks]
    click.echo(table(rows, ["component", "usable", "version", "detail"]))
    return 0


def register(group: click.Group) -> None:
    group.add_command(doctor_cmd)
