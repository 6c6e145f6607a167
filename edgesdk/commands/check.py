# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check``: CI compliance checks. Exit codes: 0 pass, 2 violations, 1 error."""

from __future__ import annotations

import importlib

import click


@click.group("check")
def check_group() -> None:
    """CI compliance checks (licenses, traces). Exit 0 pass, 2 violations, 1 error."""


def register(group: click.Group) -> None:
    for name in ("check_licenses", "check_traces"):
        importlib.import_module(f"edgesdk.commands.{name}").register(check_group)
    group.add_command(check_group)
