# SPDX-License-Identifier: Apache-2.0
"""Human-readable capability table (the ``--json`` form is ``CapabilityReport.to_dict()``)."""

from __future__ import annotations

from edgesdk.capability.checker import BACKEND_LABEL, BACKENDS, CapabilityReport
from edgesdk.capability.partition import boundary_summary
from edgesdk.textable import format_table


def _cell(stats: dict, count: int) -> str:
    count -= stats["n/a"]
    if count <= 0:
        return "-"
    if stats["yes"] == count:
        return "yes"
    if stats["no"] == count:
        return "no"
    if stats["unknown"] == count:
        return "?"
    return f"{stats['yes']}/{count}" + ("?" if stats["unknown"] else "")


def render_table(report: CapabilityReport) -> str:
    cols = [b for b in BACKENDS if any(n.support[b].status != "n/a" for n in report.nodes)]
    rows = report.op_summary()
    header = ["op", "count"] + [BACKEND_LABEL[b] for b in cols] + ["runs on"]
    table = []
    for r in rows:
        runs = ", ".join(f"{BACKEND_LABEL.get(k, k)} {v}" if len(r["placement"]) > 1 else BACKEND_LABEL.get(k, k)
                         for k, v in sorted(r["placement"].items(), key=lambda kv: -kv[1]))
        table.append([r["op_type"], str(r["count"])] + [_cell(r[b], r["count"]) for b in cols] + [runs])
    lines = [f"capability of {report.model} on {report.profile} (TensorRT {report.tensorrt_version or '-'}, "
             f"{report.precision}, opset {report.opset}, {len(report.nodes)} nodes)"]
    if report.dynamic_inputs:
        lines.append("dynamic inputs: " + ", ".join(f"{k}{v}" for k, v in report.dynamic_inputs.items()))
    lines.append("")
    lines.append(format_table(table, header))
    grouped: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for b in cols:
            for why in r[b]["reasons"]:
                grouped.setdefault((b, why), []).append(r["op_type"])
    if grouped:
        lines += ["", "why not:"]
        for (b, why), ops in list(grouped.items())[:40]:
            shown = ", ".join(ops[:12]) + (f" (+{len(ops) - 12})" if len(ops) > 12 else "")
            lines.append(f"  {BACKEND_LABEL[b]}: {why}: {shown}")
        if len(grouped) > 40:
            lines.append(f"  ... {len(grouped) - 40} more reasons (see --json)")
    lines += ["", f"partitions ({len(report.partitions)}):"]
    for p in report.partitions[:30]:
        top = ", ".join(f"{k} {v}" for k, v in list(p.to_dict()["op_types"].items())[:5])
        lines.append(f"  #{p.id} {BACKEND_LABEL.get(p.backend, p.backend)}: {len(p.nodes)} nodes ({top})")
    if len(report.partitions) > 30:
        lines.append(f"  ... {len(report.partitions) - 30} more")
    crossings = boundary_summary(report)
    lines.append(f"boundary crossings: {crossings['boundary_crossings']} "
                 + (str(crossings["boundary_crossings_by_backend"]) if crossings["boundary_crossings"] else ""))
    uncertain = sum(1 for n in report.nodes if n.uncertain)
    if uncertain:
        lines.append(f"{uncertain} nodes placed after a backend that could not be checked here (marked ? above)")
    unknown = sorted({n.op_type for n in report.nodes if n.placement == "unknown"})
    if unknown:
        lines.append(f"only unverifiable backends left for: {', '.join(unknown)} (runs on the device only if its "
                     "CUDA EP has the kernel)")
    none = report.unsupported_everywhere()
    if none:
        lines.append(f"NO BACKEND runs: {', '.join(sorted({n.op_type for n in none}))}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
