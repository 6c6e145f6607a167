# SPDX-License-Identifier: Apache-2.0
""" "Why is lower precision slower?": which ops an FP16/INT8 plan leaves in higher precision, and how many
format conversions happen where precision or backend changes.

Each node placed on TensorRT/DLA gets the precision TensorRT can run it in (the op's documented types for
the profile's TensorRT version); nodes left to CUDA/CPU EP run in the ONNX tensors' own type. Every float
edge whose two ends run in different precisions is a reformat (a cast kernel and a memory round trip);
every edge between partitions is a copy, and between TensorRT and ONNX Runtime a sync as well. At batch 1
on small models those, not the math, set the latency.
"""

from __future__ import annotations

import os
from typing import Any

from edgesdk.capability import tables
from edgesdk.capability.checker import CapabilityReport, check_capability
from edgesdk.capability.graph import FLOAT_TYPES
from edgesdk.capability.partition import crossings

ORDER = {"int8": 0, "fp8": 0, "fp16": 1, "bf16": 1, "fp32": 2, "fp64": 3}
# Data-movement ops do no arithmetic: TensorRT runs them in whatever format their input arrives in.
PRECISION_NEUTRAL = {
    "Reshape",
    "Transpose",
    "Identity",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Slice",
    "Gather",
    "Concat",
    "Split",
    "Expand",
    "Tile",
    "Pad",
    "Dropout",
    "DepthToSpace",
    "SpaceToDepth",
}


def _node_float_type(node, view) -> str | None:
    """Float type of the node's outputs; None when it produces no float tensor (Shape, comparisons)."""
    for t in node.output:
        et = view.elem_type.get(t) if t else None
        if et in FLOAT_TYPES:
            return FLOAT_TYPES[et]
    return None


def _effective(node, placement: str, requested: str, trt_version: str | None, view) -> tuple[str | None, str]:
    """(precision the node runs in, why) -- None for nodes that carry no float tensor (shape arithmetic)."""
    own = _node_float_type(node, view)
    if own is None:
        return None, "no float tensors (shape/index arithmetic)"
    if placement not in ("tensorrt", "dla"):
        return own, f"runs on {placement} in the ONNX tensor type ({own})"
    if placement == "dla":
        return requested, "DLA runs the plan precision"
    if requested == "fp32":
        return "fp32", "plan precision"
    info = tables.tensorrt_op(node.op_type, trt_version or "", node.domain)
    types = set(info.types)
    major = tables.version_tuple(trt_version)[:1] or (10,)
    if requested == "int8":
        if major[0] >= 9:
            int8_ops = tables.tensorrt_table().get("int8_compute_10", {}).get("ops", [])
            if node.op_type in int8_ops:
                return "int8", "INT8 kernel (Q/DQ-fusible layer)"
        elif "INT8" in types:
            return "int8", "INT8 listed for this op"
        if "FP16" in types:
            return "fp16", f"no INT8 kernel for {node.op_type} in TensorRT {trt_version}: runs FP16"
        return "fp32", f"neither INT8 nor FP16 listed for {node.op_type}: runs FP32"
    if requested in ("fp16", "bf16"):
        want = "FP16" if requested == "fp16" else "BF16"
        if want in types:
            return requested, f"{want} listed for this op"
        return (
            "fp32",
            f"{want} not listed for {node.op_type} in TensorRT {trt_version} (types: "
            f"{', '.join(sorted(types)) or 'none'}): runs FP32",
        )
    return own, "precision not modelled"


def precision_report_from(report: CapabilityReport) -> dict:
    view = report.view
    requested = report.precision
    eff: dict[int, str | None] = {}
    kept: dict[tuple[str, str, str], int] = {}
    counts: dict[str, int] = {}
    for n in report.nodes:
        node = view.nodes[n.index]
        if n.placement == "folded":
            eff[n.index] = None
            continue
        p, why = _effective(node, n.placement, requested, report.tensorrt_version, view)
        if p is not None and node.op_type in PRECISION_NEUTRAL and n.placement in ("tensorrt", "dla"):
            src = next((view.producer[t] for t in node.input if t in view.producer), None)
            # follows its input; not counted as compute
            eff[n.index] = (eff.get(src) if src is not None else None) or p
            continue
        eff[n.index] = p
        if p is None:
            continue
        counts[p] = counts.get(p, 0) + 1
        if ORDER.get(p, 2) > ORDER.get(requested, 2):
            key = (n.op_type, p, f"on {n.placement}: {why}" if n.placement not in ("tensorrt", "dla") else why)
            kept[key] = kept.get(key, 0) + 1
    reformats: dict[str, int] = {}
    seen = set()
    for src, dst, tensor in view.edges():
        a, b = eff.get(src), eff.get(dst)
        if a is None or b is None or a == b or not view.is_float(tensor) or (tensor, dst) in seen:
            continue
        seen.add((tensor, dst))
        edge = f"{a}->{b}"
        reformats[edge] = reformats.get(edge, 0) + 1
    cross = crossings(report)
    float_cross = [c for c in cross if c["float"]]
    kept_rows: list[dict[str, Any]] = [
        {"op_type": op, "count": c, "runs_in": p, "reason": why}
        for (op, p, why), c in sorted(kept.items(), key=lambda kv: -kv[1])
    ]
    n_float = sum(counts.values())
    n_kept = sum(r["count"] for r in kept_rows)
    lines = [
        f"{requested.upper()} plan on {report.profile}: {n_float - n_kept} of {n_float} float ops run in "
        f"{requested.upper()}; {n_kept} stay in higher precision."
    ]
    for r in kept_rows[:8]:
        lines.append(f"  {r['count']} x {r['op_type']} run {r['runs_in'].upper()}: {r['reason']}")
    n_ref = sum(reformats.values())
    if n_ref:
        lines.append(
            f"{n_ref} precision conversions (reformat kernels) inside the graph: "
            + ", ".join(f"{k.upper()} x{v}" for k, v in sorted(reformats.items()))
        )
    if float_cross:
        lines.append(
            f"{len(float_cross)} float tensors cross between partitions "
            f"({', '.join(sorted({c['from'] + '->' + c['to'] for c in float_cross}))}): each is a copy plus a "
            "synchronisation (DLA <-> GPU, or TensorRT <-> ONNX Runtime)"
        )
    if n_ref or float_cross:
        lines.append(
            "At batch 1 these conversions and copies are memory/launch-bound and can outweigh the faster "
            "math: measure before trusting the lower precision."
        )
    return {
        "precision": requested,
        "profile": report.profile,
        "tensorrt_version": report.tensorrt_version,
        "float_nodes": n_float,
        "by_precision": counts,
        "kept_higher_precision": kept_rows,
        "precision_conversions": n_ref,
        "precision_conversions_by_pair": reformats,
        "partition_crossings": len(cross),
        "float_partition_crossings": len(float_cross),
        "explanation": lines,
        "method": "static: TensorRT operator types per version (edgesdk/data/capability) + placement; not measured",
    }


def precision_report(onnx_path: str | os.PathLike, profile, precision: str, use_dla: bool | None = None) -> dict:
    """For an INT8/FP16 plan: ops kept in higher precision and conversions at precision/partition boundaries."""
    return precision_report_from(check_capability(onnx_path, profile, precision, use_dla=use_dla))
