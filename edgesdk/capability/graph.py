# SPDX-License-Identifier: Apache-2.0
"""A read-only view of an ONNX graph for the capability checker: producers, consumers, constants,
inferred element types and shapes (onnx shape inference), dynamic inputs.

:func:`load_graph` reads a file (``edgesdk inspect capability``, the build's engine stage). For the planner,
:func:`graph_view_facts` turns a view into plain data that inspect keeps in ``ModelFacts.graph``
(``capability``) and :meth:`GraphView.from_facts` rebuilds a view from it without opening anything."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import ModelError

if TYPE_CHECKING:
    from onnx import TensorProto

FLOAT_TYPES = {1: "fp32", 10: "fp16", 11: "fp64", 16: "bf16"}  # onnx.TensorProto elem types


@dataclass
class GraphView:
    path: Path
    model: object  # onnx.ModelProto
    opset: int
    nodes: list = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    initializers: dict[str, TensorProto] = field(default_factory=dict)
    constant_outputs: dict[str, TensorProto] = field(default_factory=dict)  # Constant node output -> value
    elem_type: dict[str, int] = field(default_factory=dict)
    shape: dict[str, list] = field(default_factory=dict)  # dims: int, str (symbolic) or None (unknown)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # A view rebuilt from facts (model None): constant tensor names, and those known to be all zeros.
    constants: set[str] = field(default_factory=set)
    zero_constants: set[str] = field(default_factory=set)

    def is_constant(self, tensor: str) -> bool:
        return tensor in self.initializers or tensor in self.constant_outputs or tensor in self.constants

    def constant_value(self, tensor: str, base_dir: str = ""):
        from onnx import numpy_helper

        proto = self.initializers.get(tensor) or self.constant_outputs.get(tensor)
        return None if proto is None else numpy_helper.to_array(proto, base_dir)

    def is_zero_constant(self, tensor: str) -> bool:
        """A constant whose values are all zero (a view from facts: as inspect found it)."""
        if self.model is None:
            return tensor in self.zero_constants
        value = self.constant_value(tensor)
        return value is not None and not value.any()

    @classmethod
    def from_facts(cls, data: dict[str, Any]) -> GraphView:
        """The view :func:`graph_view_facts` described: plain nodes, no ONNX model, nothing read."""
        view = cls(path=Path(data["path"]), model=None, opset=int(data["opset"]))
        view.elem_type = dict(data["elem_type"])
        view.shape = {k: list(v) for k, v in data["shape"].items()}
        view.inputs, view.outputs = list(data["inputs"]), list(data["outputs"])
        view.constants, view.zero_constants = set(data["constants"]), set(data["zero_constants"])
        for i, n in enumerate(data["nodes"]):
            node = PlainNode(n["op_type"], n["domain"], list(n["input"]), list(n["output"]), dict(n["attrs"]))
            view._add(i, node, n["name"])
        return view

    def _add(self, i: int, node: Any, name: str) -> None:
        """Node ``i`` with its name, and the producer / consumer edges of its tensors."""
        self.nodes.append(node)
        self.names.append(name)
        for out in node.output:
            if out:
                self.producer[out] = i
        for inp in node.input:
            if inp:
                self.consumers.setdefault(inp, []).append(i)

    def is_static(self, tensor: str) -> bool:
        dims = self.shape.get(tensor)
        return dims is not None and all(isinstance(d, int) and d > 0 for d in dims)

    def dynamic_inputs(self) -> dict[str, list]:
        return {n: self.shape.get(n, []) for n in self.inputs if not self.is_static(n)}

    def is_float(self, tensor: str) -> bool:
        return self.elem_type.get(tensor) in FLOAT_TYPES

    def edges(self):
        """(producer_index, consumer_index, tensor) for every data edge between two nodes."""
        for tensor, src in self.producer.items():
            for dst in self.consumers.get(tensor, []):
                yield src, dst, tensor


@dataclass
class PlainNode:
    """A node of a view rebuilt from facts: what the checks read, attributes as plain values."""

    op_type: str
    domain: str
    input: list[str]
    output: list[str]
    attrs: dict[str, Any]


def _plain_attr(attr) -> Any:
    from onnx import helper

    if attr.type in (4, 5, 9, 10, 11, 12, 13, 14):  # tensors, graphs, sparse tensors, type protos
        return f"<{attr.type}>"
    try:
        value = helper.get_attribute_value(attr)
    except Exception:  # noqa: BLE001 - a malformed attribute: inspect describes the model, the checks see "<?>"
        return "<?>"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def graph_view_facts(view: GraphView, zero_checked: set[tuple[str, int]]) -> dict[str, Any]:
    """``view`` as plain data for ``ModelFacts.graph`` (what the capability checks read): nodes with plain
    attributes, element types, shapes, constants, graph inputs/outputs. Which constants are all zeros is
    read only for the inputs ``zero_checked`` names ((op type, input index): the ``zero_input`` checks of the
    capability tables), loading such a tensor's external data beside the model if it has any."""
    zeros: list[str] = []
    for node in view.nodes:
        for op, i in zero_checked:
            t = node.input[i] if node.op_type == op and len(node.input) > i else ""
            if t and t not in zeros and view.is_constant(t):
                try:
                    value = view.constant_value(t, str(view.path.parent))
                except Exception:  # noqa: BLE001 - unreadable external data: not known to be zero
                    value = None
                if value is not None and not value.any():
                    zeros.append(t)
    return {
        "path": str(view.path),
        "opset": view.opset,
        "nodes": [
            {
                "name": name,
                "op_type": n.op_type,
                "domain": n.domain,
                "input": list(n.input),
                "output": list(n.output),
                "attrs": {a.name: _plain_attr(a) for a in n.attribute},
            }
            for name, n in zip(view.names, view.nodes)
        ],
        "elem_type": dict(view.elem_type),
        "shape": {k: list(v) for k, v in view.shape.items()},
        "inputs": list(view.inputs),
        "outputs": list(view.outputs),
        "constants": sorted({*view.initializers, *view.constant_outputs}),
        "zero_constants": sorted(zeros),
    }


def _dims(value_info) -> list | None:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def load_graph(path: str | os.PathLike) -> GraphView:
    """Load and shape-infer an ONNX file; a missing, corrupt or non-ONNX file is a one-line ModelError."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"ONNX model not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError, OSError on external data, ValueError
        raise ModelError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {str(exc)[:120]})") from exc
    if not model.graph.node:
        raise ModelError(f"{path}: ONNX graph has no nodes (is this an ONNX model?)")
    return view_of(model, path)


def view_of(model: Any, path: Path) -> GraphView:
    """The view of a loaded ``onnx.ModelProto`` (shape-inferred here; external data need not be loaded)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort: unknown types/shapes are reported as such
        inferred = model
    if any(n.domain == "com.microsoft" for n in model.graph.node):
        # onnx's inference stops at ONNX Runtime contrib ops; ONNX Runtime's own symbolic inference knows them.
        try:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            inferred = SymbolicShapeInference.infer_shapes(inferred, auto_merge=True, guess_output_rank=True)
        except Exception:  # noqa: BLE001 - best effort, as above
            pass
    g = inferred.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    view = GraphView(path=path, model=model, opset=opset)
    view.initializers = {t.name: t for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        view.elem_type[vi.name] = vi.type.tensor_type.elem_type
        dims = _dims(vi)
        if dims is not None:
            view.shape[vi.name] = dims
    for t in g.initializer:
        view.elem_type.setdefault(t.name, t.data_type)
        view.shape.setdefault(t.name, list(t.dims))
    view.inputs = [i.name for i in g.input if i.name not in view.initializers]
    view.outputs = [o.name for o in g.output]
    seen: dict[str, int] = {}
    for i, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}#{i}"
        seen[name] = i
        view._add(i, node, name)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    view.constant_outputs[node.output[0]] = a.t
    return view
