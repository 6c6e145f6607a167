# SPDX-License-Identifier: Apache-2.0
"""Planner facts of an ONNX source: :func:`onnx_file_facts` (the ONNX format's ``facts``, which
:func:`edgesdk.inspect.inspect_model` asks for an ``.onnx`` file) and its ``ModelFacts.graph``.

The ``onnx`` model object loaded once (headers, no external data) and its sibling files: the TensorRT planner
reads these facts instead of opening the graph and its sibling files itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgesdk.errors import ModelError
from edgesdk.types import ModelFacts


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


def onnx_external_files(model: Any, path: Path) -> list[str]:
    """The external-data files an ONNX model's initializers name, relative to its directory, checked:
    a plain relative path that stays inside the model's directory, a regular file (no symlink, FIFO or
    device), and every tensor's ``offset + length`` inside it. Anything else is a :class:`ModelError`."""
    from onnx import TensorProto

    base = path.resolve().parent
    sizes: dict[str, int] = {}
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    for t in tensors:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        rel = Path(loc)
        if not loc or rel.is_absolute() or ".." in rel.parts or "\\" in loc or ":" in loc:
            raise ModelError(
                f"{path}: tensor {t.name[:60]!r} names external data {loc[:80]!r} outside the model's directory",
                hint="external data must be a file beside the .onnx",
            )
        target = base / rel
        if target.is_symlink() or not target.is_file():
            raise ModelError(
                f"{path}: external data file {loc[:80]!r} of tensor {t.name[:60]!r} is missing or not a regular file",
                hint="keep the .data file beside the .onnx",
            )
        if target.resolve().parent != base and base not in target.resolve().parents:
            raise ModelError(f"{path}: external data {loc[:80]!r} resolves outside the model's directory")
        size = sizes.setdefault(rel.as_posix(), target.stat().st_size)
        try:
            offset, length = int(info.get("offset", 0) or 0), int(info.get("length", 0) or 0)
        except ValueError as exc:
            raise ModelError(f"{path}: tensor {t.name[:60]!r} has a non-numeric external data offset/length") from exc
        if offset < 0 or length < 0 or offset + length > size:
            raise ModelError(
                f"{path}: tensor {t.name[:60]!r} reads bytes {offset}..{offset + length} of "
                f"{loc[:80]!r}, which has {size} (truncated external data)"
            )
    return sorted(sizes)


def onnx_file_facts(path: Path) -> ModelFacts:
    """Model facts of an ``.onnx`` file (the ONNX format's ``facts``): the graph without its external data, which
    is checked (:func:`onnx_external_files`) and sized; ``graph`` holds :func:`onnx_graph_facts`."""
    import onnx

    if not path.is_file():
        raise ModelError(f"{path}: not a regular file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError / google.protobuf errors for corrupt files
        raise ModelError(f"{path}: not a valid ONNX model ({type(exc).__name__})") from exc
    if not model.graph.node:
        raise ModelError(f"{path}: ONNX model has an empty graph")
    external = onnx_external_files(model, path)
    params = 0
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        params += n
    inputs = [i.name for i in model.graph.input]
    task = "feature-extraction" if "input_ids" in inputs else "other"
    meta = {p.key: p.value for p in model.metadata_props}
    ops = sorted({n.op_type for n in model.graph.node})
    if task == "other" and any(op in ops for op in ("Conv", "ConvTranspose")):
        task = "vision"
    return ModelFacts(
        source=str(path),
        kind="onnx",
        task=task,
        name=path.stem,
        architecture=None,
        family=meta.get("model_type"),
        params=params,
        weight_bytes=path.stat().st_size + sum((path.parent / f).stat().st_size for f in external),
        extra={
            "external_data": external,
            "inputs": inputs,
            "outputs": [o.name for o in model.graph.output],
            "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None),
            "metadata": meta,
            "op_types": ops,
        },
        graph=onnx_graph_facts(model, path),
    )
