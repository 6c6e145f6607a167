# SPDX-License-Identifier: Apache-2.0
"""Planner facts of an ONNX source, read by :func:`edgesdk.inspect.inspect_model` (``ModelFacts.graph``).

The ``onnx`` model object inspect already loaded (headers, no external data) and its sibling files: the
TensorRT planner reads these facts instead of opening the graph and its sibling files itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def onnx_graph_facts(model: Any, path: Path) -> dict[str, Any]:
    """What planners read from an ONNX graph, read here once so the planner opens no file (``ModelFacts.graph``):
    each graph input's declared dims (int, a named axis or None; None without a shape), the input channels of
    the first Conv that reads an input (weight [M, C/group, kH, kW] from an initializer or a Constant), and the
    first sibling ``config.json`` / ``preprocessor_config.json`` that is a non-empty JSON object (image size),
    and the shape-inferred graph the capability checks read (``capability``: the DLA decision and the precision
    report of a TensorRT plan; :func:`edgesdk.capability.graph.graph_view_facts`)."""
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value" and a.HasField("t"):
                    weights[node.output[0]] = list(a.t.dims)
    initializers = {t.name for t in model.graph.initializer}
    dims: dict[str, list[Any] | None] = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        t = vi.type.tensor_type
        dims[vi.name] = (
            [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
            if t.HasField("shape")
            else None
        )
    channels: dict[str, int] = {}
    for name in dims:
        for node in model.graph.node:
            if node.op_type == "Conv" and node.input and node.input[0] == name and len(node.input) > 1:
                w = weights.get(node.input[1])
                group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
                if w and len(w) == 4 and isinstance(w[1], int) and w[1] > 0:
                    channels[name] = int(w[1]) * int(group)
                    break
    sibling: dict[str, Any] | None = None
    for fname in ("config.json", "preprocessor_config.json"):
        f = path.with_name(fname)
        try:
            data = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict) and data:
            sibling = {"file": fname, "config": data}
            break
    from edgesdk.capability.graph import graph_view_facts, view_of
    from edgesdk.capability.tables import zero_checked_inputs

    capability = graph_view_facts(view_of(model, path), zero_checked_inputs())
    return {"input_dims": dims, "conv_channels": channels, "sibling_config": sibling, "capability": capability}
