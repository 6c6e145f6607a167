# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check licenses PATH``: license findings for a bundle or any source tree.

Exit codes (the ``check`` group's convention): 0 pass, 2 violation (deny, or review not cleared
by --accept-license / a waiver), 1 error (unreadable input), 10 a configured scanner failed or
timed out (the gate fails closed).
"""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk.commands._common import also_write_option
from edgesdk.errors import EdgeSDKError


@click.command("licenses")
@click.argument("path", type=click.Path(path_type=Path), default=Path("."))
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report.")
@click.option("--markdown", is_flag=True, help="Print a Markdown report (for PR comments, CI summaries).")
@click.option("--summary", is_flag=True, help="Print the verdict and only the findings that need action.")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(path_type=Path),
    help="Policy YAML extending the shipped default (docs/licenses.md).",
)
@click.option(
    "--waivers",
    "waivers_path",
    type=click.Path(path_type=Path),
    help="Waivers YAML (id, by, reason, expires, license/subject).",
)
@click.option(
    "--accept-license",
    "accepted",
    multiple=True,
    metavar="ID",
    help="Accept review-level findings of this license id (repeatable), e.g. gemma.",
)
@click.option(
    "--scanoss-url", default=None, help="SCANOSS API base URL (default: $SCANOSS_SCAN_URL; none: fingerprints only)."
)
@click.option(
    "--scanoss-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Seconds one SCANOSS request may take in all (default: $EDGESDK_SCANOSS_TIMEOUT or 30); "
    "slower is an error (exit 10).",
)
@click.option(
    "--model-source",
    type=click.Path(path_type=Path),
    default=None,
    help="The original model (HF dir, .onnx, .gguf) whose card/metadata applies.",
)
@click.option(
    "--dist",
    "dists",
    multiple=True,
    metavar="NAME",
    help="Python distribution the runtime needs (repeatable; its requirement closure is scanned).",
)
@click.option("--environment", is_flag=True, help="Scan every distribution installed in this Python environment.")
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), default=None, help="Also write the JSON report to this file."
)
@also_write_option(
    "--html", "Also write a self-contained HTML report (verdict, findings by level, waivers) to this file."
)
@also_write_option("--spdx", "Also write an SPDX 2.3 JSON SBOM of what was scanned to this file.")
def check_licenses_command(
    path: Path,
    as_json: bool,
    markdown: bool,
    summary: bool,
    policy_path: Path | None,
    waivers_path: Path | None,
    accepted: tuple[str, ...],
    scanoss_url: str | None,
    scanoss_timeout: float | None,
    model_source: Path | None,
    dists: tuple[str, ...],
    environment: bool,
    output: Path | None,
    html_path: Path | None,
    spdx_path: Path | None,
) -> int:
    """License findings for a bundle (dir with manifest.json) or any source tree.

    Exit 0 pass, 2 violation, 1 error, 10 configured scanner failed.
    """
    from edgesdk.compliance.gate import scan_licenses
    from edgesdk.compliance.report import to_html, to_json, to_markdown, to_summary, to_table
    from edgesdk.errors import InputError

    views = [flag for flag, on in (("--json", as_json), ("--markdown", markdown), ("--summary", summary)) if on]
    if len(views) > 1:  # before the scan: one report format on stdout
        raise InputError(
            f"{' and '.join(views)} each choose what stdout shows: pass one (-o FILE also writes the JSON report)"
        )
    try:
        result = scan_licenses(
            path,
            model_source=model_source,
            runtime_distributions=list(dists) or None,
            environment=environment,
            policy_path=policy_path,
            waivers_path=waivers_path,
            accepted=accepted,
            scanoss_url=scanoss_url,
            scanoss_timeout=scanoss_timeout,
        )
        for dest, render in ((output, to_json), (html_path, to_html), (spdx_path, _spdx_of)):
            if dest is not None:
                _write(dest, render(result))
    except EdgeSDKError as exc:
        from edgesdk.errors import ExternalToolError

        click.echo(f"error: {exc.one_line()}", err=True)
        return exc.exit_code if isinstance(exc, ExternalToolError) else 1  # a failed scanner: 10
    if as_json:
        click.echo(to_json(result), nl=False)
    elif markdown:
        click.echo(to_markdown(result), nl=False)
    elif summary:
        click.echo(to_summary(result), nl=False)
    else:
        click.echo(to_table(result), nl=False)
    return 0 if result.verdict == "pass" else 2


def _spdx_of(result) -> str:
    from edgesdk.compliance.sbom import build_spdx, of_result

    return of_result(build_spdx, Path(result.scanned).name or str(result.scanned), result)


def _write(dest: Path, text: str) -> None:
    from edgesdk.errors import InputError

    try:
        dest.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {dest}: {exc.strerror or exc}") from exc


def register(group: click.Group) -> None:
    group.add_command(check_licenses_command)
