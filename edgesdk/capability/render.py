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
        runs = ", ".join(
            f"{BACKEND_LABEL.get(k, k)} {v}" if len(r["placement"]) > 1 else BACKEND_LABEL.get(k, k)
            for k, v in sorted(r["placement"].items(), key=lambda kv: -kv[1])
        )
        table.append([r["op_type"], str(r["count"])] + [_cell(r[b], r["count"]) for b in cols] + [runs])
    lines = [
        f"capability of {report.model} on {report.profile} (TensorRT {report.tensorrt_version or '-'}, "
        f"{report.precision}, opset {report.opset}, {len(report.nodes)} nodes)"
    ]
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
    lines.append(
        f"boundary crossings: {crossings['boundary_crossings']} "
        + (str(crossings["boundary_crossings_by_backend"]) if crossings["boundary_crossings"] else "")
    )
    uncertain = sum(1 for n in report.nodes if n.uncertain)
    if uncertain:
        lines.append(f"{uncertain} nodes placed after a backend that could not be checked here (marked ? above)")
    unknown = sorted({n.op_type for n in report.nodes if n.placement == "unknown"})
    if unknown:
        lines.append(
            f"only unverifiable backends left for: {', '.join(unknown)} (runs on the device only if its "
            "CUDA EP has the kernel)"
        )
    none = report.unsupported_everywhere()
    if none:
        lines.append(f"NO BACKEND runs: {', '.join(sorted({n.op_type for n in none}))}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


# ---------------------------------------------------------------- pictures: DOT and HTML

#: placement -> (fill colour, label). CPU EP on a GPU profile is the fallback the colour warns about.
PLACEMENT_STYLE = {
    "dla": ("#cc79a7", "DLA"),
    "tensorrt": ("#009e73", "TensorRT"),
    "cuda_ep": ("#56b4e9", "CUDA EP"),
    "cpu": ("#e69f00", "CPU EP"),
    "unknown": ("#bbbbbb", "unverified"),
    "none": ("#d55e00", "no backend"),
}


def _style(placement: str, report: CapabilityReport) -> tuple[str, str]:
    colour, label = PLACEMENT_STYLE.get(placement, ("#ffffff", placement))
    if placement == "cpu" and report.chain != ["cpu"]:
        label = "CPU fallback"
    return colour, label


def _dot_str(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def render_dot(report: CapabilityReport) -> str:
    """Graphviz DOT: one cluster per partition (labelled with its backend), nodes coloured by placement,
    edges that cross a partition boundary drawn bold red with the tensor name. Constant-folded nodes
    are left out."""
    from edgesdk.capability.partition import crossings

    title = (
        f"{report.model} on {report.profile} ({report.precision}): {len(report.partitions)} partitions, "
        f"{len(crossings(report))} boundary crossings"
    )
    lines = [
        "digraph capability {",
        f"  label={_dot_str(title)};",
        "  labelloc=t; rankdir=TB; fontname=Helvetica;",
        '  node [shape=box, style="filled,rounded", fontname=Helvetica, fontsize=10];',
        '  edge [color="#7f7f7f"];',
    ]
    by_index = {n.index: n for n in report.nodes}
    placed = getattr(report, "node_partition", {})
    for p in report.partitions:
        colour, label = _style(p.backend, report)
        lines.append(f"  subgraph cluster_p{p.id} {{")
        lines.append(
            f"    label={_dot_str(f'#{p.id} {label} ({len(p.nodes)} nodes)')}; style=dashed; "
            f"color={_dot_str(colour)}; penwidth=2;"
        )
        for i in p.nodes:
            n = by_index[i]
            tip = n.support.get(n.placement)
            text = n.op_type + ("\n" + n.name if n.name else "")
            lines.append(
                f"    n{i} [label={_dot_str(text)}, "
                f"fillcolor={_dot_str(colour)}, tooltip={_dot_str(tip.reason if tip else n.placement)}];"
            )
        lines.append("  }")
    cross = {(c["tensor"], c["to_partition"]) for c in crossings(report)}
    for src, dst, tensor in report.view.edges():
        if src not in placed or dst not in placed:
            continue
        if placed[src] != placed[dst] and (tensor, placed[dst]) in cross:
            lines.append(
                f'  n{src} -> n{dst} [color="#d55e00", penwidth=2.5, label={_dot_str(tensor)}, '
                'fontcolor="#d55e00", fontsize=8];'
            )
        else:
            lines.append(f"  n{src} -> n{dst};")
    lines.append("  subgraph cluster_legend {")
    lines.append('    label="placement"; style=solid; color="#cccccc";')
    shown = sorted(
        {p.backend for p in report.partitions},
        key=lambda b: list(PLACEMENT_STYLE).index(b) if b in PLACEMENT_STYLE else 99,
    )
    for b in shown:
        colour, label = _style(b, report)
        lines.append(f"    legend_{b.replace('-', '_')} [label={_dot_str(label)}, fillcolor={_dot_str(colour)}];")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_HTML_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem;color:#212529}
table{border-collapse:collapse;margin:.6rem 0 1.4rem;font-size:.85rem}
th,td{border:1px solid #ced4da;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#e9ecef}
.strip{display:flex;height:2.2rem;border:1px solid #888;margin:.4rem 0 .2rem}
.strip div{border-right:2px solid #fff;min-width:3px;color:#000;font-size:.7rem;overflow:hidden;text-align:center;
  line-height:2.2rem}
.swatch{display:inline-block;width:.9rem;height:.9rem;margin:0 .3rem 0 .8rem;vertical-align:middle}
.cross{color:#d55e00;font-weight:600} code{font-size:.85em}
"""


def render_html(report: CapabilityReport) -> str:
    """A self-contained HTML page (inline CSS, no scripts): a strip of the partitions in graph order,
    widths by node count and coloured by placement; the partitions with their op types and boundary
    tensors; every crossing; the per-op table."""
    from html import escape as e

    from edgesdk.capability.partition import crossings

    cross = crossings(report)
    summary = boundary_summary(report)
    total = sum(len(p.nodes) for p in report.partitions) or 1
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Capability: {e(report.model)} on {e(report.profile)}</title>",
        f"<style>{_HTML_CSS}</style></head><body>",
        f"<h1>{e(report.model)} on {e(report.profile)}</h1>",
        f"<p>TensorRT {e(report.tensorrt_version or '-')}, {e(report.precision)}, opset {report.opset}, "
        f"{len(report.nodes)} nodes; backend chain {e(' → '.join(BACKEND_LABEL.get(b, b) for b in report.chain))}. "
        f'<b>{len(report.partitions)} partitions, <span class="cross">{summary["boundary_crossings"]} boundary '
        f"crossings</span></b>.</p>",
        "<h2>Partitions in graph order</h2>",
        '<div class="strip" id="strip">',
    ]
    for p in report.partitions:
        colour, label = _style(p.backend, report)
        out.append(
            f'<div style="flex:{len(p.nodes)} 1 0;background:{colour}" title="#{p.id} {e(label)}: '
            f'{len(p.nodes)} nodes">#{p.id}</div>'
        )
    out.append("</div><p>")
    for b in sorted({p.backend for p in report.partitions}):
        colour, label = _style(b, report)
        nodes = sum(len(p.nodes) for p in report.partitions if p.backend == b)
        out.append(
            f'<span class="swatch" style="background:{colour}"></span>{e(label)} '
            f"({nodes} nodes, {100 * nodes / total:.0f}%)"
        )
    out.append("</p>")
    out += [
        '<table id="partitions"><tr><th>#</th><th>placement</th><th>nodes</th><th>op types</th>'
        "<th>tensors in</th><th>tensors out</th></tr>"
    ]
    for p in report.partitions:
        colour, label = _style(p.backend, report)
        ops = ", ".join(f"{k} {v}" for k, v in p.to_dict()["op_types"].items())
        out.append(
            f'<tr class="partition" data-backend="{e(p.backend)}"><td>{p.id}</td>'
            f'<td style="background:{colour}">{e(label)}</td><td>{len(p.nodes)}</td><td>{e(ops)}</td>'
            f"<td><code>{e(', '.join(p.inputs))}</code></td>"
            f"<td><code>{e(', '.join(p.outputs))}</code></td></tr>"
        )
    out.append("</table>")
    out.append(f"<h2>Boundary crossings ({len(cross)})</h2>")
    if cross:
        out.append('<table id="crossings"><tr><th>tensor</th><th>from</th><th>to</th><th>float</th></tr>')
        for c in cross:
            out.append(
                f'<tr class="crossing"><td><code>{e(c["tensor"])}</code></td>'
                f"<td>#{c['from_partition']} {e(_style(c['from'], report)[1])}</td>"
                f"<td>#{c['to_partition']} {e(_style(c['to'], report)[1])}</td>"
                f"<td>{'yes' if c['float'] else 'no'}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>None: the whole graph is one partition.</p>")
    out += [
        "<h2>Ops</h2>",
        '<table id="ops"><tr><th>op</th><th>count</th><th>runs on</th><th>why not elsewhere</th></tr>',
    ]
    for r in report.op_summary():
        runs = ", ".join(
            f"{_style(k, report)[1]} {v}" for k, v in sorted(r["placement"].items(), key=lambda kv: -kv[1])
        )
        why = "; ".join(f"{BACKEND_LABEL[b]}: {w}" for b in BACKENDS for w in r[b]["reasons"][:2])
        out.append(f"<tr><td>{e(r['op_type'])}</td><td>{r['count']}</td><td>{e(runs)}</td><td>{e(why)}</td></tr>")
    out.append("</table>")
    for note in report.notes:
        out.append(f"<p>note: {e(note)}</p>")
    out.append("<p>Generated by edgesdk inspect capability.</p></body></html>")
    return "\n".join(out) + "\n"
