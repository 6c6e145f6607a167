# SPDX-License-Identifier: Apache-2.0
"""Render a license scan: JSON report, Markdown summary, terminal table, one-screen summary."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

from edgesdk.textable import format_table

if TYPE_CHECKING:
    from edgesdk.compliance.result import GateResult

_ORDER = {"deny": 0, "review": 1, "allow": 2}


def _sorted(result: GateResult):
    return sorted(result.findings, key=lambda f: (_ORDER[f.effective_action], _ORDER[f.action], f.layer, f.subject))


def to_json(result: GateResult) -> str:
    return json.dumps(result.to_report(), indent=2, sort_keys=False) + "\n"


def _cell(text: str | None, width: int) -> str:
    text = " ".join(str(text or "-").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _row_subject(f) -> str:
    more = f" (+{len(f.files) - 1} files)" if len(f.files) > 1 else ""
    return f"{f.subject}{more}"


def _action_text(f) -> str:
    return f.action + (f" -> {f.resolution}" if f.resolution else "")


def to_table(result: GateResult, *, only_problems: bool = False) -> str:
    rows = []
    for f in _sorted(result):
        if only_problems and f.action == "allow":
            continue
        rows.append(
            (
                _cell(f"[{f.layer}] {_row_subject(f)}", 60),
                _cell(f.found, 34),
                _cell(f.chosen or f.spdx, 34),
                f.category,
                _action_text(f),
            )
        )
    lines = [
        format_table(
            rows, ("FILE / SUBJECT", "LICENSE AS FOUND", "SPDX", "CATEGORY", "ACTION"), rule=False, rstrip=False
        )
    ]
    lines.append("")
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def summary_line(result: GateResult) -> str:
    c = result.counts()
    text = (
        f"license verdict: {result.verdict.upper()} (policy {result.policy.id}: {c['deny']} deny, "
        f"{c['review']} review, {c['allow']} allow; {c['waived']} waived, {c['accepted']} accepted)"
    )
    worst = result.worst()
    if worst is not None and result.verdict != "pass":
        text += f"; worst: {worst.headline()}"
    return text


def to_summary(result: GateResult) -> str:
    """Short form for CI logs: the verdict, problems only, audit notes, REUSE gaps."""
    lines = [summary_line(result)]
    problems = [f for f in _sorted(result) if f.action != "allow"]
    for f in problems:
        lines.append(
            f"  {_action_text(f):<10} [{f.layer}] {_row_subject(f)}: {f.chosen or f.spdx or f.found or '-'}"
            f" ({f.category}) {f.reason}"
        )
    audit = result.waiver_audit
    for key in ("expired", "unmatched"):
        for w in audit.get(key, []):
            lines.append(f"  waiver {w['id']} {key} (by {w['by']}, expires {w['expires']})")
    for w in audit.get("refused", []):
        lines.append(f"  waiver {w['id']} refused for {', '.join(w['refused'])}: {w['why']}")
    if result.accepted_at_build:
        lines.append("  accepted at build time (bundle manifest): " + ", ".join(result.accepted_at_build))
    for acc in result.unused_accepts:
        lines.append(f"  --accept-license {acc} matched no review finding")
    gaps = result.without_own_info
    if gaps:
        lines.append(
            f"  {len(gaps)} file(s) carry no license information of their own (REUSE); covered by "
            "an enclosing LICENSE file, the project's declared license, or (bundle) the model's:"
        )
        lines.extend(textwrap.wrap(", ".join(sorted(gaps)), width=108, initial_indent="    ", subsequent_indent="    "))
    if result.missing_license_texts:
        lines.append("  REUSE: no license text in LICENSES/ for " + ", ".join(result.missing_license_texts))
    lines.append(f"  scanoss: {result.scanoss.note} ({result.scanoss.fingerprinted} files fingerprinted)")
    return "\n".join(lines) + "\n"


def to_markdown(result: GateResult) -> str:
    c = result.counts()
    out = [
        f"# License report: {result.scanned}",
        "",
        f"**Verdict: {result.verdict}** (before waivers/acceptance: {result.policy_verdict}) under policy "
        f"`{result.policy.id}` (sha256 `{result.policy.sha256[:12]}`).",
        "",
        "| deny | review | allow | waived | accepted |",
        "|---|---|---|---|---|",
        f"| {c['deny']} | {c['review']} | {c['allow']} | {c['waived']} | {c['accepted']} |",
        "",
    ]
    problems = [f for f in _sorted(result) if f.action != "allow"]
    if problems:
        out += [
            "## Findings the policy did not allow (with their resolution)",
            "",
            "| layer | file / subject | license as found | SPDX | category | action | reason |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in problems:
            out.append(
                f"| {f.layer} | `{_row_subject(f)}` | {_md(f.found)} | `{f.chosen or f.spdx or '-'}` | "
                f"{f.category} | {_action_text(f)} | {_md(f.reason)} |"
            )
        out.append("")
    audit = result.waiver_audit
    if any(audit.values()):
        out += ["## Waivers", ""]
        for key in ("applied", "expired", "unmatched", "refused"):
            for w in audit.get(key, []):
                out.append(f"- **{key}** `{w['id']}` by {w['by']}, expires {w['expires']}: {_md(w['reason'])}")
        out.append("")
    if result.components:
        out += [
            "## Components (each file with its own license and SHA-256)",
            "",
            "| file | component | license | license from | sha256 | bytes |",
            "|---|---|---|---|---|---|",
        ]
        for comp in result.components:
            out.append(
                f"| `{comp['path']}` | {_md(comp['component'])} | `{comp['license'] or 'NOASSERTION'}` | "
                f"{_md(comp['license_source'])} | `{comp['sha256']}` | {comp['bytes']} |"
            )
        out.append("")
    out += [
        "## All findings",
        "",
        "| layer | file / subject | license as found | SPDX | category | action |",
        "|---|---|---|---|---|---|",
    ]
    for f in _sorted(result):
        out.append(
            f"| {f.layer} | `{_row_subject(f)}` | {_md(f.found)} | `{f.chosen or f.spdx or '-'}` | "
            f"{f.category} | {_action_text(f)} |"
        )
    out += ["", f"SCANOSS: {result.scanoss.note}.", ""]
    return "\n".join(out)


def _md(text: str | None) -> str:
    return " ".join(str(text or "-").split()).replace("|", "\\|")[:160]


# ---------------------------------------------------------------- HTML

_LEVEL_COLOUR = {"deny": "#f8d7da", "review": "#fff3cd", "allow": "#d1e7dd"}
_VERDICT_COLOUR = {"pass": "#198754", "review": "#b58100", "deny": "#b02a37"}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem;color:#212529}
.banner{color:#fff;padding:.8rem 1.2rem;border-radius:.4rem;font-size:1.3rem;font-weight:600}
table{border-collapse:collapse;margin:.6rem 0 1.4rem;font-size:.85rem}
th,td{border:1px solid #ced4da;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#e9ecef}
tr.deny td{background:#f8d7da} tr.review td{background:#fff3cd} tr.allow td{background:#d1e7dd}
tr.resolved td.action{font-weight:600}
code{font-size:.85em} .muted{color:#6c757d}
"""


def to_html(result: GateResult) -> str:
    """A self-contained HTML report (inline CSS, no scripts, no external resources): verdict banner,
    counts, findings with their level colour, waivers applied/expired/unmatched, refused waivers."""
    from html import escape as e

    c = result.counts()
    verdict = result.verdict
    worst = result.worst()
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>License report: {e(result.scanned)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>License report: {e(result.scanned)}</h1>",
        f'<div class="banner" id="verdict" style="background:{_VERDICT_COLOUR.get(verdict, "#6c757d")}">'
        f"Verdict: {e(verdict.upper())}</div>",
        f"<p>Before waivers and --accept-license: <b>{e(result.policy_verdict)}</b>. Policy "
        f"<code>{e(result.policy.id)}</code> (sha256 <code>{e(result.policy.sha256[:12])}</code>). "
        f"Model license: <code>{e(result.model_expression or 'none found')}</code>"
        + (
            f" (declared at build: <code>{e(result.model_license_declared)}</code>)"
            if result.model_license_declared
            else ""
        )
        + ".</p>",
    ]
    if worst is not None and verdict != "pass":
        out.append(f"<p>Worst finding: {e(worst.headline())}</p>")
    out += [
        '<table id="counts"><tr><th>deny</th><th>review</th><th>allow</th><th>waived</th><th>accepted</th></tr>',
        "<tr>"
        + "".join(f"<td>{c[k]}</td>" for k in ("deny", "review", "allow", "waived", "accepted"))
        + "</tr></table>",
    ]
    out += [
        "<h2>Findings</h2>",
        '<table id="findings"><tr><th>level</th><th>layer</th><th>file / subject</th>'
        "<th>license as found</th><th>SPDX</th><th>category</th><th>action</th><th>reason</th></tr>",
    ]
    for f in _sorted(result):
        resolved = " resolved" if f.resolution else ""
        out.append(
            f'<tr class="{e(f.effective_action)}{resolved}"><td>{e(f.action)}</td><td>{e(f.layer)}</td>'
            f"<td><code>{e(_row_subject(f))}</code></td><td>{e(f.found or '-')}</td>"
            f"<td><code>{e(f.chosen or f.spdx or '-')}</code></td><td>{e(f.category)}</td>"
            f'<td class="action">{e(_action_text(f))}</td><td>{e(f.reason)}</td></tr>'
        )
    out.append("</table>")
    if result.components:
        out += [
            "<h2>Components</h2>",
            '<table id="components"><tr><th>file</th><th>component</th><th>license</th>'
            "<th>license from</th><th>sha256</th><th>bytes</th></tr>",
        ]
        for comp in result.components:
            out.append(
                f"<tr><td><code>{e(comp['path'])}</code></td><td>{e(comp['component'])}</td>"
                f"<td><code>{e(comp['license'] or 'NOASSERTION')}</code></td>"
                f"<td>{e(comp['license_source'])}</td>"
                f"<td><code>{e(comp['sha256'])}</code></td><td>{comp['bytes']}</td></tr>"
            )
        out.append("</table>")
    audit = result.waiver_audit
    out += ["<h2>Waivers</h2>"]
    listed = [(k, w) for k in ("applied", "expired", "unmatched") for w in audit.get(k, [])]
    if listed:
        out.append('<table id="waivers"><tr><th>status</th><th>id</th><th>by</th><th>expires</th><th>reason</th></tr>')
        for key, w in listed:
            out.append(
                f"<tr><td>{e(key)}</td><td>{e(w['id'])}</td><td>{e(w['by'])}</td><td>{e(str(w['expires']))}"
                f"</td><td>{e(w['reason'])}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append('<p class="muted">No waivers.</p>')
    out += ["<h2>Refused waivers</h2>"]
    refused = audit.get("refused", [])
    if refused:
        out.append('<table id="refused"><tr><th>id</th><th>by</th><th>refused for</th><th>why</th></tr>')
        for w in refused:
            out.append(
                f'<tr class="deny"><td>{e(w["id"])}</td><td>{e(w["by"])}</td>'
                f"<td>{e(', '.join(w['refused']))}</td><td>{e(w['why'])}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append('<p class="muted">None: no waiver tried to clear a deny.</p>')
    if result.accepted_at_build or result.unused_accepts:
        out.append("<h2>Accepted licenses</h2><ul>")
        out += [f"<li>accepted at build time: <code>{e(a)}</code></li>" for a in result.accepted_at_build]
        out += [
            f"<li><code>--accept-license {e(a)}</code> matched no review finding</li>" for a in result.unused_accepts
        ]
        out.append("</ul>")
    out.append(f'<p class="muted">SCANOSS: {e(result.scanoss.note)}. Generated by edgesdk check licenses.</p>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
