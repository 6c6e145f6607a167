# SPDX-License-Identifier: Apache-2.0
"""Partition a placed graph: connected components of nodes that run on the same backend.

This is how ONNX Runtime's TensorRT EP and TensorRT's own DLA/GPU split work: a run of supported nodes
becomes one engine (or one DLA loadable), and every tensor that crosses from one partition to another is a
copy and, usually, a format/precision conversion. Counting those crossings is what explains "the engine
is fast but the model is slow".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Partition:
    id: int
    backend: str
    nodes: list[int] = field(default_factory=list)
    op_types: dict[str, int] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)  # tensors entering from another partition / graph input
    outputs: list[str] = field(default_factory=list)  # tensors leaving to another partition / graph output

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "backend": self.backend,
            "node_count": len(self.nodes),
            "op_types": dict(sorted(self.op_types.items(), key=lambda kv: -kv[1])),
            "inputs": self.inputs,
            "outputs": self.outputs,
        }


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _stages(report) -> list[int]:
    """Backend switches on the longest path to each node (ONNX nodes are stored in topological order).

    Grouping by (placement, stage) before taking connected components keeps partitions acyclic: a region
    that feeds a CPU node whose result flows back into the same region must be two engines, not one.
    """
    view, nodes = report.view, report.nodes
    stage = [0] * len(nodes)
    preds: dict[int, list[int]] = {}
    for src, dst, _ in view.edges():
        preds.setdefault(dst, []).append(src)
    for n in nodes:
        best = 0
        for p in preds.get(n.index, []):
            if nodes[p].placement == "folded":
                continue
            best = max(best, stage[p] + (nodes[p].placement != n.placement))
        stage[n.index] = best
    return stage


def partition(report) -> list[Partition]:
    """Acyclic connected components (over data edges) of nodes with the same placement, in graph order."""
    view = report.view
    nodes = report.nodes
    stage = _stages(report)
    uf = _UnionFind(len(nodes))
    for src, dst, _ in view.edges():
        if nodes[src].placement == nodes[dst].placement and stage[src] == stage[dst]:
            uf.union(src, dst)
    by_root: dict[int, Partition] = {}
    node_part: dict[int, Partition] = {}
    for n in nodes:
        if n.placement == "folded":
            continue
        root = uf.find(n.index)
        part = by_root.get(root)
        if part is None:
            part = by_root[root] = Partition(id=len(by_root), backend=n.placement)
        part.nodes.append(n.index)
        part.op_types[n.op_type] = part.op_types.get(n.op_type, 0) + 1
        node_part[n.index] = part
    for part in by_root.values():
        ins: list[str] = []
        outs: list[str] = []
        for i in part.nodes:
            node = view.nodes[i]
            for t in node.input:
                src = view.producer.get(t)
                if not t or view.is_constant(t) or (src is not None and src not in node_part):
                    continue
                if (src is None or node_part[src] is not part) and t not in ins:
                    ins.append(t)
            for t in node.output:
                if not t:
                    continue
                leaves = (
                    any(c in node_part and node_part[c] is not part for c in view.consumers.get(t, []))
                    or t in view.outputs
                )
                if leaves and t not in outs:
                    outs.append(t)
        part.inputs, part.outputs = ins, outs
    report.node_partition = {i: p.id for i, p in node_part.items()}
    return list(by_root.values())


def crossings(report) -> list[dict]:
    """Every (tensor, from partition, to partition) edge between partitions, with its element type."""
    mapping = getattr(report, "node_partition", {})
    parts = {p.id: p for p in report.partitions}
    seen = set()
    out = []
    for src, dst, tensor in report.view.edges():
        a, b = mapping.get(src), mapping.get(dst)
        if a is None or b is None or a == b or (tensor, b) in seen:
            continue
        seen.add((tensor, b))
        out.append(
            {
                "tensor": tensor,
                "from": parts[a].backend,
                "to": parts[b].backend,
                "from_partition": a,
                "to_partition": b,
                "float": report.view.is_float(tensor),
            }
        )
    return out


def boundary_summary(report) -> dict:
    cross = crossings(report)
    by_pair: dict[str, int] = {}
    for c in cross:
        key = f"{c['from']}->{c['to']}"
        by_pair[key] = by_pair.get(key, 0) + 1
    return {"boundary_crossings": len(cross), "boundary_crossings_by_backend": by_pair}
