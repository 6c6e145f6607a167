# SPDX-License-Identifier: Apache-2.0
"""Render a license scan: JSON report, Markdown summary, terminal table, one-screen summary."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

from edgesdk.textable import format_table

if TYPE_CHECKING:
    from edgesdk.compliance.gate import GateResult

_ORDER = {"deny": 0, "review": 1, "allow": 2}


def _sorted(result: GateResult):
    return sorted(result.findings, key=lambda f: (_ORDER[f.effective_action], _ORDER[f.action], f.layer,
                                                  f.subject))


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
        rows.append((_cell(f"[{f.layer}] {_row_subject(f)}", 60), _cell(f.found, 34),
                     _cell(f.chosen or f.spdx, 34), f.category, _action_text(f)))
    lines = [format_table(rows, ("FILE / SUBJECT", "LICENSE AS FOUND", "SPDX", "CATEGORY", "ACTION"),
                          rule=False, rstrip=False)]
    lines.append("")
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def summary_line(result: GateResult) -> str:
    c = result.counts()
    text = (f"license verdict: {result.verdict.upper()} (policy {result.policy.id}: {c['deny']} deny, "
            f"{c['review']} review, {c['allow']} allow; {c['waived']} waived, {c['accepted']} accepted)")
    worst = result.worst()
    if worst is not None and result.verdict != "pass":
        text += f"; worst: {worst.headline()}"
    return text


def to_summary(result: GateResult) -> str:
    """Short form for CI logs: the verdict, problems only, audit notes, REUSE gaps."""
    lines = [summary_line(result)]
    problems = [f for f in _sorted(result) if f.action != "allow"]
    for f in problems:
        lines.append(f"  {_action_text(f):<10} [{f.layer}] {_row_subject(f)}: {f.chosen or f.spdx or f.found or '-'}"
                     f" ({f.category}) {f.reason}")
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
        lines.append(f"  {len(gaps)} file(s) carry no license information of their own (REUSE); covered by "
                     "an enclosing LICENSE file, the project's declared license, or (bundle) the model's:")
        lines.extend(textwrap.wrap(", ".join(sorted(gaps)), width=108, initial_indent="    ",
                                   subsequent_indent="    "))
    if result.missing_license_texts:
        lines.append("  REUSE: no license text in LICENSES/ for " + ", ".join(result.missing_license_texts))
    lines.append(f"  scanoss: {result.scanoss.note} ({result.scanoss.fingerprinted} files fingerprinted)")
    return "\n".join(lines) + "\n"


def to_markdown(result: GateResult) -> str:
    c = result.counts()
    out = [f"# License report: {result.scanned}", "",
           f"**Verdict: {result.verdict}** (before waivers/acceptance: {result.policy_verdict}) under policy "
           f"`{result.policy.id}` (sha256 `{result.policy.sha256[:12]}`).", "",
           "| deny | review | allow | waived | accepted |", "|---|---|---|---|---|",
           f"| {c['deny']} | {c['review']} | {c['allow']} | {c['waived']} | {c['accepted']} |", ""]
    problems = [f for f in _sorted(result) if f.action != "allow"]
    if problems:
        out += ["## Findings the policy did not allow (with their resolution)", "",
                "| layer | file / subject | license as found | SPDX | category | action | reason |",
                "|---|---|---|---|---|---|---|"]
        for f in problems:
            out.append(f"| {f.layer} | `{_row_subject(f)}` | {_md(f.found)} | `{f.chosen or f.spdx or '-'}` | "
                       f"{f.category} | {_action_text(f)} | {_md(f.reason)} |")
        out.append("")
    audit = result.waiver_audit
    if any(audit.values()):
        out += ["## Waivers", ""]
        for key in ("applied", "expired", "unmatched", "refused"):
            for w in audit.get(key, []):
                out.append(f"- **{key}** `{w['id']}` by {w['by']}, expires {w['expires']}: {_md(w['reason'])}")
        out.append("")
    out += ["## All findings", "", "| layer | file / subject | license as found | SPDX | category | action |",
            "|---|---|---|---|---|---|"]
    for f in _sorted(result):
        out.append(f"| {f.layer} | `{_row_subject(f)}` | {_md(f.found)} | `{f.chosen or f.spdx or '-'}` | "
                   f"{f.category} | {_action_text(f)} |")
    out += ["", f"SCANOSS: {result.scanoss.note}.", ""]
    return "\n".join(out)


def _md(text: str | None) -> str:
    return " ".join(str(text or "-").split()).replace("|", "\\|")[:160]
