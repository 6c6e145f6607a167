# SPDX-License-Identifier: Apache-2.0
"""Ask ONNX Runtime itself whether an execution provider has a kernel for a node.

No table: each distinct (op, domain, opset, input types, attributes) becomes a one-node model and ONNX
Runtime creates a session for it on the provider in question. ``NOT_IMPLEMENTED`` (no kernel) or an
unregistered op means "no"; for a GPU provider, CPU fallback is disabled so that a node the provider
cannot take fails the session instead of silently landing on the CPU. A provider whose libraries do not
load on this machine (onnxruntime-gpu lists CUDA/TensorRT EPs even without CUDA) is reported as
"unknown here", with the reason, never guessed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

PROBE_IR_VERSION = 9  # onnx 1.23 writes IR 11+, which older ONNX Runtime builds refuse


@dataclass(frozen=True)
class ProbeResult:
    status: str  # yes | no | unknown
    reason: str


@functools.cache
def provider_usable(provider: str) -> tuple[bool, str]:
    """Create a tiny session on ``provider`` and read back ``get_providers()``: listed is not usable."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as exc:
        return False, f"onnxruntime not importable ({exc})"
    if provider not in ort.get_available_providers():
        return False, f"{provider} is not in this onnxruntime build ({ort.__version__})"
    if provider == "CPUExecutionProvider":
        return True, ""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = PROBE_IR_VERSION
    so = ort.SessionOptions()
    so.log_severity_level = 4
    # The provider-library load error goes to ORT's default logger: silence it for the probe only
    # (2 = ORT's default severity, warnings and up).
    ort.set_default_logger_severity(4)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=[provider, "CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable", with the message as the reason
        return False, f"{provider} failed to start: {str(exc).splitlines()[0][:160]}"
    finally:
        ort.set_default_logger_severity(2)
    if provider not in sess.get_providers():
        return False, (
            f"{provider} is listed by onnxruntime {ort.__version__} but its libraries do not load "
            "here (session fell back to CPU)"
        )
    return True, ""


def _attr_key(node) -> str:
    parts = []
    for a in sorted(node.attribute, key=lambda a: a.name):
        if a.type in (5, 10):  # GRAPH / GRAPHS: keyed by name only
            parts.append(f"{a.name}=<graph>")
        else:
            parts.append(f"{a.name}={a.SerializeToString().hex()[:64]}")
    return ";".join(parts)


def _one_node_model(node, view, as_float32: bool = False) -> bytes:
    """One-node model with the node's real input types; ``as_float32`` re-types FP16/BF16 tensors to FP32
    (what ONNX Runtime's cast insertion does for a CPU node without a half-precision kernel)."""
    from onnx import ValueInfoProto, helper

    known = [view.elem_type.get(n) for n in node.input if n and view.elem_type.get(n) in (1, 10, 16)]
    fallback = known[0] if known else 1  # an unknown input (inference stopped) likely shares the float type

    def typed(elem):
        return 1 if as_float32 and elem in (10, 16) else elem

    inputs: list[ValueInfoProto] = []
    for name in node.input:
        if name and name not in {i.name for i in inputs}:
            elem = view.elem_type.get(name) or fallback
            inputs.append(helper.make_tensor_value_info(name, typed(elem), None))
    outputs = []
    for name in node.output:
        if not name:
            continue
        elem = view.elem_type.get(name)
        if elem:
            outputs.append(helper.make_tensor_value_info(name, typed(elem), None))
        else:
            vi = ValueInfoProto()
            vi.name = name
            outputs.append(vi)
    graph = helper.make_graph([node], "probe", inputs, outputs)
    imports = [helper.make_opsetid(o.domain, o.version) for o in view.model.opset_import]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = PROBE_IR_VERSION
    return model.SerializeToString()


class OrtProbe:
    """Per-provider kernel probe with a cache keyed by the node's signature."""

    def __init__(self, provider: str):
        self.provider = provider
        self.usable, self.unusable_reason = provider_usable(provider)
        self._cache: dict[tuple, ProbeResult] = {}

    def check(self, node, view) -> ProbeResult:
        if not self.usable:
            return ProbeResult("unknown", f"not checkable here: {self.unusable_reason}")
        key = (node.domain, node.op_type, tuple(view.elem_type.get(i, 0) for i in node.input), _attr_key(node))
        if key not in self._cache:
            self._cache[key] = self._probe(node, view)
        return self._cache[key]

    def _probe(self, node, view) -> ProbeResult:
        if any(a.type in (5, 10) for a in node.attribute):
            # Subgraphs (If/Loop/Scan) reference outer-scope tensors: a one-node copy is not a valid model.
            return ProbeResult("unknown", "control-flow op with subgraphs: not probed node by node")
        result = self._session(node, view, as_float32=False)
        half = any(view.elem_type.get(t) in (10, 16) for t in list(node.input) + list(node.output) if t)
        if result.status == "no" and half and self.provider == "CPUExecutionProvider":
            # ONNX Runtime inserts Casts around a CPU node that has no FP16/BF16 kernel: it runs, in FP32.
            as32 = self._session(node, view, as_float32=True)
            if as32.status == "yes":
                return ProbeResult("yes", "no half-precision CPU kernel: runs in FP32 between inserted Casts")
        return result

    def _session(self, node, view, as_float32: bool) -> ProbeResult:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        providers = [self.provider]
        if self.provider != "CPUExecutionProvider":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            ort.InferenceSession(_one_node_model(node, view, as_float32), so, providers=providers)
        except Exception as exc:  # noqa: BLE001 - classify ORT's error text below
            text = str(exc)
            if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
                return ProbeResult("no", f"no {self.provider} kernel for {node.op_type} with these input types")
            if "is not a registered function/op" in text:
                return ProbeResult(
                    "no", f"{node.domain or 'ai.onnx'}::{node.op_type} is not a registered op in onnxruntime"
                )
            if "Exception during initialization" in text:
                # The kernel exists but refuses this node's attributes (e.g. LSTM layout=1 on CPU).
                detail = text.split(" was false. ", 1)[-1] if " was false. " in text else text
                return ProbeResult(
                    "no",
                    f"{self.provider} kernel rejects this node: "
                    f"{detail.splitlines()[0].split(' If you need')[0][:160]}",
                )
            if "fallback to the CPU EP has been explicitly disabled" in text or "assigned to the default CPU" in text:
                return ProbeResult("no", f"{self.provider} does not take {node.op_type} (would run on CPU)")
            return ProbeResult("unknown", f"probe inconclusive: {text.splitlines()[0][:140]}")
        return ProbeResult("yes", f"onnxruntime {ort.__version__} has a {self.provider} kernel (probed)")
