# SPDX-License-Identifier: Apache-2.0
"""Per-node capability of an ONNX model on a device profile, and where each node will run.

For every node: TensorRT (operator table of the profile's TensorRT version + machine-checked limits),
DLA (Orin AGX/NX: native layer list, FP16/INT8 only, static shapes, size limits), CUDA EP and CPU EP
(asked of ONNX Runtime itself, see :mod:`ort_probe`; not when planning, see :func:`check_view`). Each node
is placed on the first backend of the chain that takes it (DLA -> TensorRT -> CUDA EP -> CPU, limited to what
the profile has), and nodes placed together form partitions (:mod:`partition`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from edgesdk.capability import tables
from edgesdk.capability.graph import GraphView, PlainNode, load_graph
from edgesdk.capability.ort_probe import OrtProbe

BACKENDS = ("dla", "tensorrt", "cuda_ep", "cpu")
BACKEND_LABEL = {"dla": "DLA", "tensorrt": "TensorRT", "cuda_ep": "CUDA EP", "cpu": "CPU EP"}
ORT_PROVIDER = {"cuda_ep": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


@dataclass
class Verdict:
    status: str  # yes | no | unknown | n/a
    reason: str
    category: str = ""  # op | attribute | dynamic-shape | precision | size | platform | probe

    def to_dict(self) -> dict:
        d = {"status": self.status, "reason": self.reason}
        if self.category:
            d["category"] = self.category
        return d


@dataclass
class NodeResult:
    index: int
    name: str
    op_type: str
    domain: str
    support: dict[str, Verdict]
    placement: str = "none"  # a backend, "folded", "unknown" (only unverifiable backends left) or "none"
    uncertain: bool = False  # an earlier backend in the chain could not be checked here

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "op_type": self.op_type,
            "domain": self.domain,
            "placement": self.placement,
            "uncertain": self.uncertain,
            "support": {b: v.to_dict() for b, v in self.support.items()},
        }


@dataclass
class CapabilityReport:
    model: str
    profile: str
    tensorrt_version: str | None
    precision: str
    opset: int
    chain: list[str]
    dynamic_inputs: dict
    nodes: list[NodeResult]
    view: GraphView = field(repr=False)
    notes: list[str] = field(default_factory=list)
    partitions: list = field(default_factory=list)

    def unsupported_everywhere(self) -> list[NodeResult]:
        return [n for n in self.nodes if n.placement == "none"]

    def op_summary(self) -> list[dict]:
        """One row per op type: count, per-backend supported count, placement counts, distinct reasons."""
        rows: dict[str, dict] = {}
        for n in self.nodes:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
            row = rows.setdefault(
                key,
                {
                    "op_type": key,
                    "count": 0,
                    "placement": {},
                    **{b: {"yes": 0, "no": 0, "unknown": 0, "n/a": 0, "reasons": []} for b in BACKENDS},
                },
            )
            row["count"] += 1
            row["placement"][n.placement] = row["placement"].get(n.placement, 0) + 1
            for b, v in n.support.items():
                row[b][v.status] += 1
                if v.status in ("no", "unknown") and v.reason not in row[b]["reasons"]:
                    row[b]["reasons"].append(v.reason)
        return sorted(rows.values(), key=lambda r: (-r["count"], r["op_type"]))

    def to_dict(self) -> dict:
        from edgesdk.capability.partition import boundary_summary

        placed: dict[str, int] = {}
        ops_by: dict[str, set] = {}
        for n in self.nodes:
            placed[n.placement] = placed.get(n.placement, 0) + 1
            ops_by.setdefault(n.placement, set()).add(n.op_type)
        return {
            "model": self.model,
            "profile": self.profile,
            "tensorrt_version": self.tensorrt_version,
            "precision": self.precision,
            "opset": self.opset,
            "chain": self.chain,
            "dynamic_inputs": self.dynamic_inputs,
            "notes": self.notes,
            "summary": {
                "nodes": len(self.nodes),
                "placement": placed,
                "ops_by_placement": {k: sorted(v) for k, v in ops_by.items() if k != "folded"},
                "partitions": {b: sum(1 for p in self.partitions if p.backend == b) for b in placed if b != "folded"},
                "uncertain": sum(1 for n in self.nodes if n.uncertain),
                "unsupported_everywhere": sorted({n.op_type for n in self.unsupported_everywhere()}),
                **boundary_summary(self),
            },
            "ops": self.op_summary(),
            "partitions": [p.to_dict() for p in self.partitions],
            "nodes": [n.to_dict() for n in self.nodes],
        }


# --------------------------------------------------------------------------------------------- limit checks


def _attr(node, name):
    if isinstance(node, PlainNode):  # a view from facts: attributes already plain
        return node.attrs.get(name)
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return None


def failed_check(node, view: GraphView, check: dict) -> Verdict | None:
    """Evaluate one data-file check on a real node; None when the node satisfies it."""
    kind = check["kind"]
    reason = check["reason"]
    if kind == "const_input":
        i = check["index"]
        if len(node.input) > i and node.input[i] and not view.is_constant(node.input[i]):
            return Verdict("no", f"constant input needed: {reason}", "attribute")
    elif kind == "zero_input":
        i = check["index"]
        if len(node.input) > i and node.input[i]:
            if not view.is_zero_constant(node.input[i]):
                return Verdict("no", f"attribute limit: {reason}", "attribute")
    elif kind == "no_output":
        i = check["index"]
        if (
            len(node.output) > i
            and node.output[i]
            and (node.output[i] in view.consumers or node.output[i] in view.outputs)
        ):
            return Verdict("no", f"attribute limit: {reason}", "attribute")
    elif kind == "attr_in":
        value = _attr(node, check["attr"])
        if value is not None and value not in check["values"]:
            return Verdict("no", f"attribute limit: {reason} ({check['attr']}={value!r})", "attribute")
    elif kind == "attr_not_contains":
        value = _attr(node, check["attr"])
        if isinstance(value, str) and check["text"] in value:
            return Verdict("no", f"attribute limit: {reason}", "attribute")
    elif kind == "spatial_rank":
        kernel = _attr(node, "kernel_shape")
        rank = len(kernel) if kernel else None
        if rank is None and node.input and view.shape.get(node.input[0]) is not None:
            rank = len(view.shape[node.input[0]]) - 2
        if rank is not None and rank not in check["ranks"]:
            return Verdict("no", f"attribute limit: {reason} (got {rank}D)", "attribute")
    elif kind == "static_shape":
        if node.input and not view.is_static(node.input[0]):
            return Verdict("no", f"dynamic shape: {reason}", "dynamic-shape")
    return None


# --------------------------------------------------------------------------------------------- backends

# ONNX elem type -> the label the TensorRT operator tables use; only types whose absence means "cannot run".
_TRT_TYPE = {6: "INT32", 7: "INT64", 16: "BF16"}
# Ops whose first input is a shape/size or whose type column describes outputs, not input 0.
_TYPE_EXEMPT = {
    "Shape",
    "Size",
    "ConstantOfShape",
    "Cast",
    "CastLike",
    "EyeLike",
    "RandomNormalLike",
    "RandomUniformLike",
    "NonZero",
}


def _type_problem(node, view: GraphView, info, trt_version: str | None) -> Verdict | None:
    if node.op_type in _TYPE_EXEMPT or not node.input or not node.input[0]:
        return None
    label = _TRT_TYPE.get(view.elem_type.get(node.input[0], 0))
    if label is None or not info.types:
        return None
    major = tables.version_tuple(trt_version)[:1] or (10,)
    if label == "INT64" and major[0] < 9:
        label = "INT32"  # 8.x casts INT64 down to INT32 (onnx-tensorrt operators.md note)
    if label not in info.types:
        return Verdict(
            "no",
            f"precision: TensorRT {trt_version} documents {node.op_type} for {', '.join(info.types)}; input is {label}",
            "precision",
        )
    return None


def _tensorrt_verdict(node, view: GraphView, trt_version: str | None, opset_problem: str | None) -> Verdict:
    info = tables.tensorrt_op(node.op_type, trt_version, node.domain)
    if not info.supported:
        return Verdict("no", info.reason, "op")
    if opset_problem:
        return Verdict("no", opset_problem, "op")
    bad_type = _type_problem(node, view, info, trt_version)
    if bad_type is not None:
        return bad_type
    for check in info.checks:
        bad = failed_check(node, view, check)
        if bad is not None:
            return bad
    return Verdict("yes", f"TensorRT {trt_version} parser table ({info.source})")


def _dla_verdict(node, view: GraphView, trt_version: str, precision: str, trt: Verdict) -> Verdict:
    data = tables.dla_table()
    rules = data["rules"]
    if precision not in rules["precisions"]["value"]:
        return Verdict("no", f"precision: DLA runs FP16/INT8 only (plan precision {precision})", "precision")
    native, which = tables.dla_native_ops(trt_version)
    build_time = set(data["build_time"]["ops"])
    if node.op_type not in native and node.op_type not in build_time:
        if node.op_type in data["reconstruction"]["ops"]:
            return Verdict("no", "op not DLA-native (a DLA-SW reconstruction recipe exists; not applied)", "op")
        return Verdict("no", f"op not DLA-native ({which.split(' (')[0]})", "op")
    tensors = [t for t in list(node.input) + list(node.output) if t and not view.is_constant(t)]
    if any(not view.is_float(t) for t in tensors):
        return Verdict(
            "no",
            "precision: DLA runs FP16/INT8 tensors only (integer/bool shape arithmetic runs on the GPU)",
            "precision",
        )
    if any(not view.is_static(t) for t in tensors):
        return Verdict("no", "dynamic shape: DLA needs static shapes", "dynamic-shape")
    limit = rules["max_non_batch_dim"]["value"]
    for t in tensors:
        dims = view.shape.get(t) or []
        if dims and (dims[0] > rules["max_batch"]["value"] or any(d > limit for d in dims[1:])):
            return Verdict(
                "no",
                f"size limit: {t} {dims} exceeds DLA batch <= {rules['max_batch']['value']} / dims <= {limit}",
                "size",
            )
    for check in (data.get("checks") or {}).get(node.op_type, []):
        bad = failed_check(node, view, check)
        if bad is not None:
            return bad
    if trt.status != "yes":
        return Verdict("no", f"TensorRT cannot import it: {trt.reason}", "op")
    return Verdict("yes", which)


def backend_chain(profile, use_dla: bool | None = None) -> tuple[list[str], list[str]]:
    """Backends the profile offers, best first, and notes on what was left out and why."""
    notes: list[str] = []
    if not profile.is_gpu:
        return ["cpu"], [f"profile {profile.name} has no NVIDIA GPU: TensorRT, DLA and CUDA EP do not apply"]
    chain: list[str] = []
    trt = profile.software_version("tensorrt")
    if use_dla is not False and profile.dla_cores > 0:
        ok, why = tables.dla_available(trt or "")
        if ok:
            chain.append("dla")
        else:
            notes.append(why)
    elif use_dla is not False:
        notes.append(f"profile {profile.name} has no DLA")
    if trt:
        chain.append("tensorrt")
    else:
        notes.append(f"profile {profile.name} names no TensorRT version")
    return chain + ["cuda_ep", "cpu"], notes


# Domains ONNX Runtime registers ops in; a node of any other domain has no kernel on any of its providers.
ORT_DOMAINS = (
    "",
    "ai.onnx",
    "ai.onnx.ml",
    "com.microsoft",
    "com.microsoft.nchwc",
    "com.ms.internal.nhwc",
    "ai.onnx.training",
    "ai.onnx.preview.training",
    "com.microsoft.experimental",
)


def _unprobed(node, backend: str) -> Verdict:
    """The CUDA/CPU EP verdict when planning: ONNX Runtime is not asked (its kernels are probed at build time,
    by the engine stage and ``edgesdk inspect capability``); only a domain it has no ops in is a sure no."""
    if node.domain not in ORT_DOMAINS:
        return Verdict(
            "no",
            f"{node.domain}::{node.op_type} is not a registered op in onnxruntime (no op of domain {node.domain})",
            "op",
        )
    return Verdict("unknown", f"{BACKEND_LABEL[backend]} kernels are probed at build time, not when planning", "probe")


def check_capability(
    onnx_path: str | os.PathLike, profile, precision: str | None = None, use_dla: bool | None = None
) -> CapabilityReport:
    """Check every node of ``onnx_path`` against ``profile``; place it; partition the graph. CUDA/CPU EP
    support is asked of this host's ONNX Runtime (:mod:`ort_probe`)."""
    return check_view(load_graph(onnx_path), profile, precision, use_dla)


def check_view(
    view: GraphView, profile, precision: str | None = None, use_dla: bool | None = None, probe: bool = True
) -> CapabilityReport:
    """:func:`check_capability` of a loaded view. ``probe=False`` (the planner, over a view rebuilt from
    ``ModelFacts.graph``) starts no ONNX Runtime session: CUDA/CPU EP verdicts are "unknown" (probed at build
    time) except for ops of a domain ONNX Runtime has no ops in."""
    from edgesdk.capability.partition import partition

    precision = precision or next((p for p in profile.precision_order if p in ("fp32", "fp16", "int8")), "fp32")
    chain, notes = backend_chain(profile, use_dla)
    trt_version = profile.software_version("tensorrt") if profile.is_gpu else None
    opset_problem = None
    if trt_version:
        max_opset, source = tables.tensorrt_opset_max(trt_version)
        if max_opset is not None and view.opset > max_opset:
            opset_problem = f"model opset {view.opset} > {max_opset}, the highest TensorRT {trt_version} parses"
            notes.append(f"{opset_problem} ({source}); re-export at opset <= {max_opset}")
    probes = {b: OrtProbe(ORT_PROVIDER[b]) for b in ("cuda_ep", "cpu") if b in chain and probe}
    if "cuda_ep" in probes and not probes["cuda_ep"].usable:
        notes.append(f"CUDA EP column not checkable here: {probes['cuda_ep'].unusable_reason}")
    results: list[NodeResult] = []
    folded: set[str] = set()
    for i, node in enumerate(view.nodes):
        static_shape_of = node.op_type == "Shape" and node.input and view.is_static(node.input[0])
        if (
            node.op_type == "Constant"
            or static_shape_of
            or (node.input and all(not t or view.is_constant(t) or t in folded for t in node.input))
        ):
            # Constant-foldable: TensorRT and ONNX Runtime evaluate it once at build/load time.
            folded.update(t for t in node.output if t)
            results.append(
                NodeResult(
                    i,
                    view.names[i],
                    node.op_type,
                    node.domain,
                    {b: Verdict("n/a", "constant-folded at build time") for b in BACKENDS},
                    placement="folded",
                )
            )
            continue
        support: dict[str, Verdict] = {}
        trt = (
            _tensorrt_verdict(node, view, trt_version, opset_problem)
            if "tensorrt" in chain
            else Verdict("n/a", "not in this profile's chain")
        )
        support["tensorrt"] = trt
        support["dla"] = (
            _dla_verdict(node, view, trt_version or "", precision, trt)
            if "dla" in chain
            else Verdict("n/a", "not in this profile's chain")
        )
        for b in ("cuda_ep", "cpu"):
            if b in probes:
                pr = probes[b].check(node, view)
                support[b] = Verdict(
                    pr.status, pr.reason, "probe" if pr.status == "unknown" else ("op" if pr.status == "no" else "")
                )
            elif b in chain and not probe:
                support[b] = _unprobed(node, b)
            else:
                support[b] = Verdict("n/a", "not in this profile's chain")
        cpu = support["cpu"]
        if support["cuda_ep"].status == "unknown" and cpu.status == "no" and "not a registered op" in cpu.reason:
            # Not in ONNX Runtime's op registry at all: no execution provider of this onnxruntime can run it.
            support["cuda_ep"] = Verdict("no", cpu.reason, "op")
        res = NodeResult(i, view.names[i], node.op_type, node.domain, support)
        for b in chain:
            status = support[b].status
            if status == "yes":
                res.placement = b
                break
            if status == "unknown":
                res.uncertain = True
        else:
            # Nothing said yes. "none" only when every backend said no; a backend that could not be checked
            # here (CUDA EP without CUDA libraries) may still take it on the device.
            res.placement = "unknown" if res.uncertain else "none"
        results.append(res)
    contrib = sorted({n.op_type for n in view.nodes if n.domain == "com.microsoft"})
    if contrib and "tensorrt" in chain:
        notes.append(
            f"onnxruntime contrib ops ({', '.join(contrib)}): this ONNX was fused for ONNX Runtime; "
            "TensorRT parses only standard ONNX ops, so export unfused ONNX for a TensorRT engine"
        )
    report = CapabilityReport(
        model=str(view.path),
        profile=profile.name,
        tensorrt_version=trt_version,
        precision=precision,
        opset=view.opset,
        chain=chain,
        dynamic_inputs=view.dynamic_inputs(),
        nodes=results,
        view=view,
        notes=notes,
    )
    report.partitions = partition(report)
    return report
