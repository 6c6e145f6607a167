# SPDX-License-Identifier: Apache-2.0
"""When ONNX export fails on an op without an ONNX symbolic, keep the model anyway: a ``torch.export``
program (``model.pt2``) that the runtime's torch backend runs eagerly, with a report of which ops forced
it and what it costs (measured here, estimated for the target from the docs/devices.md H200 figures).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgesdk.errors import ModelError

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from edgesdk.formats import BuildContext

_OP_RE = re.compile(r"operator '([\w:.]+)'")


def _aten_ops(ep: ExportedProgram) -> list[str]:
    ops: list[str] = []
    for node in ep.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "name", None)
            name = name() if callable(name) else str(node.target)
            if name not in ops:
                ops.append(name)
    return ops


def forcing_ops(export_error: BaseException) -> list[str]:
    """Ops named by the exporter's error (``Exporting the operator 'aten::cummax' ... is not supported``)."""
    return list(dict.fromkeys(_OP_RE.findall(str(export_error))))


def _time_ms(fn: Callable[..., object], args: Sequence[object], runs: int = 10) -> float:
    fn(*args)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(*args)
        samples.append((time.perf_counter() - t0) * 1000)
    return round(float(np.median(samples)), 4)


def build_torch_fallback(ctx: BuildContext, export_error: BaseException) -> None:
    """Save ``torch.export`` of the module as the bundle's model (format ``torch``) and record why."""
    import torch

    from edgesdk.capability.tables import eager_cost_estimate

    module = ctx.options.option("module")
    example = ctx.options.option("example_inputs")
    if module is None or example is None:
        raise ModelError(
            f"ONNX export failed ({str(export_error).splitlines()[0][:160]}) and there is no module "
            "with example inputs to keep as a torch.export program"
        )
    example = example if isinstance(example, tuple) else (example,)
    names = ctx.options.option("input_names") or [f"input_{i}" for i in range(len(example))]
    first_line = str(export_error).splitlines()[0][:300]
    ctx.progress(f"ONNX export failed ({first_line}); keeping a torch.export program instead")
    with torch.no_grad():
        try:
            ep = torch.export.export(module.eval(), example)
        except Exception as exc:  # torch.export raises many types (UserError, Unsupported, ...)
            raise ModelError(
                f"ONNX export failed ({first_line}) and torch.export failed too "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
            ) from exc
        path = ctx.staging / "model.pt2"
        torch.export.save(ep, str(path))
        loaded = torch.export.load(str(path)).module()
        reference = module(*example)
        got = loaded(*example)
        ref_t = reference if isinstance(reference, tuple) else (reference,)
        got_t = got if isinstance(got, tuple) else (got,)
        max_abs = max(float((a - b).abs().max()) for a, b in zip(ref_t, got_t))
        eager_ms = _time_ms(loaded, example)
    ctx.add_artifact("model.pt2", "exported-program")
    declared = ctx.options.option("license")
    if declared:
        # An in-memory module has no model card: write one stating the license the caller declared, so the
        # license gate sees a model-level declaration (front matter, as on Hugging Face model cards).
        card = (
            f"---\nlicense: {declared}\n---\n\n# {ctx.facts.name} (torch.export program)\n\n"
            f"Kept as a torch.export program because ONNX export failed: {first_line}\n"
        )
        (ctx.staging / "README.md").write_text(card, encoding="utf-8")
        ctx.add_artifact("README.md", "model-card")
    ops = forcing_ops(export_error)
    ctx.set_precision("fp32")  # the program runs in the module's own dtype
    ctx.manifest.format = "torch"
    ctx.manifest.runtime.backend_chain = ["torch-eager"]
    ctx.manifest.io = {
        "inputs": [
            {"name": n, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
            for n, t in zip(names, example)
        ],
        "outputs": [
            {"name": f"output_{i}", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
            for i, t in enumerate(ref_t)
        ],
    }
    ctx.manifest.parity["torch-export"] = {"max_abs_diff": max_abs, "samples": 1, "reference": "the nn.Module itself"}
    ctx.manifest.extras["torch_fallback"] = {
        "reason": f"ONNX export failed: {first_line}",
        "forcing_ops": ops,
        "graph_ops": _aten_ops(ep),
        "cost": {
            "measured_here": {
                "eager_ms_p50": eager_ms,
                "device": "cpu",
                "runs": 10,
                "batch": int(example[0].shape[0]) if hasattr(example[0], "shape") and len(example[0].shape) else 1,
            },
            "estimated_on_gpu": eager_cost_estimate(ctx.precision),
            "note": "no ONNX/TensorRT graph: the target runs this eagerly (no fused kernels, no CUDA graphs "
            "unless the runtime can compile); on a GPU at batch 1 that costs the ratios above",
        },
    }
    ctx.runtime_requires.append("torch")
    ctx.tools["torch"] = torch.__version__
