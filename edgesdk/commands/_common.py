# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by commands: JSON output and tables (the renderer is ``edgesdk.textable``)."""

from __future__ import annotations

import json
import sys

import click

from edgesdk.textable import format_table as table

__all__ = ["emit_json", "stderr_is_tty", "table"]


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
