# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check traces FILE``: GenAI semantic-convention conformance of OTLP/JSON telemetry.

Exit codes: 0 conforming, 2 findings at or above ``--fail-on`` (default: violation), 1 the file is
unreadable or not OTLP/JSON. docs/telemetry.md shows how to run it in CI.
"""

from __future__ import annotations

import json

import click


@click.command("traces")
@click.argument("trace_file", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--fail-on",
    type=click.Choice(["violation", "improvement", "information"]),
    default="violation",
    show_default=True,
    help="Lowest finding level that makes the check fail (exit 2).",
)
def traces_command(trace_file: str, as_json: bool, fail_on: str) -> int:
    """Check OTLP/JSON traces/metrics (file-exporter lines or one document) against GenAI semconv v1.41.1."""
    from edgesdk.tracecheck import check_trace_file, render_table

    report = check_trace_file(trace_file)
    if as_json:
        click.echo(json.dumps(report.to_dict(fail_on), indent=2))
    else:
        click.echo(render_table(report, fail_on))
    return 2 if report.fails(fail_on) else 0


def register(group: click.Group) -> None:
    group.add_command(traces_command)
