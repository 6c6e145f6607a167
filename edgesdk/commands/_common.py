# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by commands: JSON output and tables."""

from __future__ import annotations

import json
import sys

import click


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def table(rows: list[list], headers: list[str]) -> str:
    cells = [[str(c) for c in headers]] + [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
