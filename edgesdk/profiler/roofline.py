# SPDX-License-Identifier: Apache-2.0
"""Roofline prediction: how fast will this bundle be on a device profile we may not have?

Work facts come from the bundle itself: ONNX graphs give weight bytes and MatMul/Gemm/Conv FLOPs
(static shapes after ONNX Runtime's symbolic shape inference with the batch/sequence we fix);
GGUF files give weight bytes, parameter count and the KV-cache bytes per token. The profile gives
memory bandwidth and peak rates. The bound is ``max(bytes / bandwidth, FLOPs / peak)``; real runs
land below it by an efficiency factor that depends on device class, workload, backend and model
size, read from ``edgesdk/data/profiler/efficiency.yaml`` (published figures + our measurements).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from edgesdk.errors import InputError, ModelError
from edgesdk.resources import Traversable, data_file

EFFICIENCY_FILE = data_file("profiler", "efficiency.yaml")
_LOOKUP_OPS = {"Gather", "EmbedLayerNormalization"}
_ONNX_DTYPE_BYTES = {
    1: 4,
    2: 1,
    3: 1,
    5: 2,
    6: 4,
    7: 8,
    9: 1,
    10: 2,
    11: 8,
    12: 4,
    13: 8,
    16: 2,
    17: 1,
    18: 1,
    19: 1,
    20: 1,
    21: 1,
    22: 1,
    23: 1,
}


@dataclass
class WorkFacts:
    """What one inference (encoder) or one token (LLM) costs, independent of the device."""

    kind: str  # "encoder" | "llm"
    format: str
    precision: str | None
    params: int | None
    weight_bytes: int  # bytes of weights streamed per forward pass / decode step
    flops: float | None = None  # encoder: per inference at the fixed shape
    tokens: int | None = None  # encoder: batch x sequence the FLOPs were counted for
    nodes: int | None = None
    kv_bytes_per_position: int | None = None  # LLM: K+V bytes one cached position adds per layer stack
    layers: int | None = None
    d_model: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- ONNX


def _static_shapes(model, batch: int, seq: int):
    """Fix dynamic input dims (batch first, the rest ``seq``) and infer every tensor's shape."""
    init_names = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        for axis, dim in enumerate(inp.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                dim.dim_value = batch if axis == 0 else seq
    try:  # onnxruntime's symbolic inference needs sympy (the [profiler] extra); without it, ONNX's own
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
    except Exception:  # noqa: BLE001 - fall back to ONNX's own (less complete) inference
        import onnx

        return onnx.shape_inference.infer_shapes(model)


def _shape_table(model) -> dict[str, list[int | None]]:
    table: dict[str, list[int | None]] = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        table[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    for init in model.graph.initializer:
        table[init.name] = list(init.dims)
    return table


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def onnx_work(path: str | Path, *, batch: int = 1, seq: int = 128) -> WorkFacts:
    """Weight bytes and MatMul/Gemm/Conv FLOPs of an ONNX graph at ``batch`` x ``seq``."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - DecodeError etc.: name the file, not the parser
        raise ModelError(f"cannot read ONNX graph {path}: {type(exc).__name__}") from exc
    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    weight_bytes = 0
    params = 0
    for name, init in inits.items():
        n = _prod(init.dims)
        params += n
        nbytes = n * _ONNX_DTYPE_BYTES.get(init.data_type, 4)
        # Embedding tables feed only lookups: a pass reads the rows it looks up, not the table.
        if consumers.get(name) and consumers[name] <= _LOOKUP_OPS and len(init.dims) == 2:
            nbytes = min(nbytes, batch * seq * init.dims[1] * _ONNX_DTYPE_BYTES.get(init.data_type, 4))
        weight_bytes += nbytes
    shapes = _shape_table(_static_shapes(model, batch, seq))
    flops = 0.0
    uncounted = 0
    for node in model.graph.node:
        # Any: a missing shape or symbolic dim raises TypeError below, counted as uncounted
        ins: list[Any] = [shapes.get(n) for n in node.input]
        outs: list[Any] = [shapes.get(n) for n in node.output]
        try:
            if node.op_type in ("MatMul", "MatMulInteger", "MatMulNBits", "QLinearMatMul"):
                a, b = (ins[0], ins[1]) if node.op_type != "QLinearMatMul" else (ins[0], ins[3])
                out = outs[0]
                if node.op_type == "MatMulNBits":
                    k = next(a.int_i for a in node.attribute if a.name == "K")
                    n_ = next(a.int_i for a in node.attribute if a.name == "N")
                    flops += 2.0 * _prod(ins[0][:-1]) * k * n_
                    continue
                k = a[-1]
                flops += 2.0 * _prod(out) * k
            elif node.op_type in ("Gemm", "QGemm"):
                a, out = ins[0], outs[0]
                trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
                k = a[0] if trans_a else a[1]
                flops += 2.0 * _prod(out) * k
            elif node.op_type == "Attention":  # com.microsoft fused attention: QKV projection + scores
                x, w = ins[0], ins[1]
                flops += 2.0 * _prod(x[:-1]) * w[0] * w[1] + 4.0 * x[0] * x[1] * x[1] * (w[1] // 3)
            elif node.op_type == "MultiHeadAttention":  # scores and weighted sum over projected Q/K/V
                q = ins[0]
                flops += 4.0 * q[0] * q[1] * q[1] * q[2]
            elif node.op_type in ("Conv", "ConvInteger", "QLinearConv"):
                w = ins[1] if node.op_type != "QLinearConv" else ins[3]
                out = outs[0]
                flops += 2.0 * _prod(out) * _prod(w[1:])
            else:
                continue
        except (TypeError, IndexError, StopIteration):
            uncounted += 1  # a dim stayed symbolic: the FLOP count is a floor
    facts = WorkFacts(
        kind="encoder",
        format="onnx",
        precision=None,
        params=params,
        weight_bytes=weight_bytes,
        flops=flops,
        tokens=batch * seq,
        nodes=len(model.graph.node),
    )
    if uncounted:
        facts.notes.append(f"{uncounted} MatMul/Gemm/Conv nodes had symbolic shapes: FLOPs are a lower bound")
    return facts


# ---------------------------------------------------------------- GGUF


def gguf_work(path: str | Path) -> WorkFacts:
    """Bytes streamed per decode step and KV bytes per cached position, from a GGUF file's header."""
    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.contracts.gguf_types import FTYPE_NAMES

    header = read_gguf_header(path)

    def field_value(key: str) -> Any:
        value = header.fields.get(key)
        return None if isinstance(value, tuple) else value

    arch = field_value("general.architecture") or ""
    layers = field_value(f"{arch}.block_count")
    d_model = field_value(f"{arch}.embedding_length")
    heads = field_value(f"{arch}.attention.head_count")
    kv_heads = field_value(f"{arch}.attention.head_count_kv") or heads
    key_len = field_value(f"{arch}.attention.key_length") or (d_model // heads if d_model and heads else None)
    value_len = field_value(f"{arch}.attention.value_length") or key_len
    names = {t.name for t in header.tensors}
    tied = "output.weight" not in names
    weight_bytes = 0
    params = 0
    embed_params = 0
    for t in header.tensors:
        params += t.n_elements
        if t.name == "token_embd.weight":
            embed_params = t.n_elements
            if not tied:  # an untied input embedding is a row lookup per token
                continue
        weight_bytes += t.n_bytes
    kv = None
    if layers and kv_heads and key_len:
        kv = int(layers * kv_heads * (key_len + value_len) * 2)  # llama.cpp caches K and V as F16 by default
    file_type = field_value("general.file_type")
    try:
        from gguf import LlamaFileType

        precision = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except (ImportError, ValueError):  # no gguf-py on a bare install, or a file type it does not name
        precision = FTYPE_NAMES.get(int(file_type)) if file_type is not None else None
    facts = WorkFacts(
        kind="llm",
        format="gguf",
        precision=precision,
        params=params,
        weight_bytes=weight_bytes,
        kv_bytes_per_position=kv,
        layers=layers,
        d_model=d_model,
    )
    facts.notes.append(
        f"architecture {arch}; {'tied' if tied else 'untied'} output embedding; "
        f"{params - embed_params:,} non-embedding parameters"
    )
    facts.flops = 2.0 * (params - (0 if tied else embed_params))  # matmul FLOPs per token
    return facts


def bundle_work(bundle, *, batch: int = 1, seq: int = 128) -> WorkFacts:
    """WorkFacts for an opened bundle (format from the manifest, artifact found by role or suffix)."""
    fmt = bundle.manifest.format
    arts = bundle.manifest.artifacts
    suffix = {"onnx": ".onnx", "gguf": ".gguf"}.get(fmt)
    if suffix is None:
        raise InputError(f"prediction supports ONNX and GGUF bundles; this bundle is {fmt!r}")
    chosen = next((a for a in arts if a.role == "model" and a.path.endswith(suffix)), None) or next(
        (a for a in arts if a.path.endswith(suffix)), None
    )
    if chosen is None:
        raise InputError(f"bundle {bundle.path} lists no {suffix} artifact")
    path = Path(bundle.path) / chosen.path
    facts = onnx_work(path, batch=batch, seq=seq) if fmt == "onnx" else gguf_work(path)
    facts.precision = bundle.manifest.precision or facts.precision
    return facts


# ---------------------------------------------------------------- efficiency + prediction


def backend_class(backend: str | None, dev_class: str) -> str | None:
    """Calibration class of a runtime backend on a device class: ONNX Runtime splits into its CPU EP and its
    CUDA EP (what a GPU/Jetson ONNX bundle runs on where TensorRT is absent; TensorRT is not calibrated)."""
    if backend == "onnxruntime":
        return "onnxruntime-cpu" if dev_class == "cpu" else "onnxruntime-cuda"
    return backend


def device_class(profile) -> str:
    return {"jetson": "jetson", "gpu": "gpu", "cpu": "cpu"}[profile.kind]


def load_efficiency_table(path: str | Path | Traversable = EFFICIENCY_FILE) -> list[dict]:
    data = yaml.safe_load((Path(path) if isinstance(path, str) else path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != "edgesdk.profiler.efficiency/1":
        raise InputError(f"{path}: not an edgesdk efficiency table (schema edgesdk.profiler.efficiency/1)")
    return list(data["entries"])


def pick_efficiency(
    table: list[dict], dev_class: str, workload: str, backend: str | None, params: int | None, quant: str | None = None
) -> dict | None:
    """Closest calibration entry: same class + workload; prefer same backend, quant, then nearest size."""
    pool = [
        e
        for e in table
        if e["device_class"] == dev_class and e["workload"] == workload and e.get("status") != "superseded"
    ]
    if not pool:
        return None

    def distance(e: dict) -> tuple:
        size = abs(math.log10(e["params"] / params)) if params and e.get("params") else 9.0
        # Size before quantization: launch overhead, not the weight format, dominates small models.
        return (
            0 if backend and e.get("backend") == backend else 1,
            round(size * 2) / 2,
            0 if (quant or None) == e.get("quant") else 1,
            size,
        )

    return min(pool, key=distance)


def _peak_flops(profile, precision: str | None) -> tuple[float | None, str]:
    keys = {
        "fp32": ["fp32_tflops", "fp16_tflops"],
        "int8": ["int8_tops", "fp16_tflops"],
        "fp8": ["fp8_tflops", "fp16_tflops"],
    }.get(precision or "", ["fp16_tflops", "fp32_tflops"])
    for k in keys:
        v = profile.figure(f"device.peak.{k}")
        if v:
            return float(v) * 1e12, k
    return None, "none"


def _encoder_prediction(
    facts: WorkFacts,
    bw: float,
    peak: float | None,
    table: list[dict],
    dev_class: str,
    backend: str | None,
    notes: list[str],
) -> dict[str, Any]:
    """An encoder's latency: the memory or compute bound (whichever is larger) over the calibrated efficiency,
    plus a per-node launch overhead; a calibration borrowed from another backend is noted in ``notes``."""
    t_mem = facts.weight_bytes / bw
    t_cmp = (facts.flops or 0.0) / peak if peak else 0.0
    bound = max(t_mem, t_cmp)
    # Launch-bound eager runs do not keep their efficiency across precisions: match it too.
    prec = None if (facts.precision or "fp32").lower() == "fp32" else (facts.precision or "fp32").lower()
    cls = backend_class(backend, dev_class)
    eff = pick_efficiency(table, dev_class, "encoder", cls, facts.params, prec)
    if eff is not None and eff.get("backend") != cls:
        notes.append(f"no {dev_class} encoder calibration for backend {cls}: used {eff.get('backend')}'s")
    overhead_ms = (facts.nodes or 0) * float(eff.get("overhead_us_per_node", 0.0)) / 1e3 if eff else 0.0
    return {
        "bound_ms": bound * 1e3,
        "memory_ms": t_mem * 1e3,
        "compute_ms": t_cmp * 1e3,
        "limited_by": "memory" if t_mem >= t_cmp else "compute",
        "backend_class": cls,
        "efficiency": eff["efficiency"] if eff else None,
        "overhead_us_per_node": eff.get("overhead_us_per_node") if eff else None,
        "overhead_ms": overhead_ms if eff else None,
        "efficiency_source": eff["source"] if eff else None,
        "model": "nodes x overhead per node + bound / efficiency",
        "latency_ms": overhead_ms + bound * 1e3 / eff["efficiency"] if eff else None,
    }


def _llm_prediction(
    facts: WorkFacts,
    bw: float,
    peak: float | None,
    table: list[dict],
    dev_class: str,
    backend: str | None,
    quant: str | None,
    prompt_tokens: int,
    context: int | None,
) -> dict[str, Any]:
    """An LLM's ``decode`` (weights + KV cache streamed per token, over the calibrated efficiency, plus a per-layer
    launch cost where calibrated), and with a peak figure its ``prefill`` and ``ttft_ms``."""
    ctx = context if context is not None else prompt_tokens
    kv = (facts.kv_bytes_per_position or 0) * ctx
    decode_bound = bw / (facts.weight_bytes + kv)
    eff_d = pick_efficiency(table, dev_class, "decode", backend, facts.params, quant)
    # Small models on big GPUs are launch-bound: where the calibration has a per-layer launch cost,
    # time per token = streaming time / efficiency + layers x launch cost.
    launch_us = float(eff_d.get("launch_us_per_layer", 0.0)) if eff_d else 0.0
    tpot_s = None
    if eff_d:
        tpot_s = 1.0 / (decode_bound * eff_d["efficiency"]) + (facts.layers or 0) * launch_us * 1e-6
    out: dict[str, Any] = {}
    out["decode"] = {
        "bound_tok_s": decode_bound,
        "bytes_per_token": facts.weight_bytes + kv,
        "kv_bytes_at_context": kv,
        "context": ctx,
        "efficiency": eff_d["efficiency"] if eff_d else None,
        "launch_us_per_layer": launch_us or None,
        "efficiency_source": eff_d["source"] if eff_d else None,
        "tok_s": 1.0 / tpot_s if tpot_s else None,
        "tpot_ms": tpot_s * 1e3 if tpot_s else None,
        "model": "bytes / (bandwidth x efficiency) + layers x launch cost"
        if launch_us
        else "bandwidth / bytes per token x efficiency",
    }
    if peak and facts.flops:
        attn = 2.0 * (facts.layers or 0) * (facts.d_model or 0) * prompt_tokens**2
        flops = facts.flops * prompt_tokens + attn
        prefill_bound_s = max(flops / peak, facts.weight_bytes / bw)
        eff_p = pick_efficiency(table, dev_class, "prefill", backend, facts.params, quant)
        out["prefill"] = {
            "bound_tok_s": prompt_tokens / prefill_bound_s,
            "flops": flops,
            "prompt_tokens": prompt_tokens,
            "efficiency": eff_p["efficiency"] if eff_p else None,
            "efficiency_source": eff_p["source"] if eff_p else None,
            "tok_s": prompt_tokens / prefill_bound_s * eff_p["efficiency"] if eff_p else None,
        }
        p_tok_s = out["prefill"]["tok_s"]
        out["ttft_ms"] = 1e3 * prompt_tokens / p_tok_s if p_tok_s else None
    return out
    return out


def predict(
    facts: WorkFacts,
    profile,
    *,
    backend: str | None = None,
    prompt_tokens: int = 128,
    context: int | None = None,
    table: list[dict] | None = None,
    measured_host: dict | None = None,
) -> dict:
    """Predicted latency/throughput of ``facts`` on ``profile``; each figure says what it rests on.

    ``measured_host`` ({bandwidth_gbps, peak_flops, method}) fills figures a generic profile lacks
    when the prediction is for the machine we are running on.
    """
    table = load_efficiency_table() if table is None else table
    bw_gbps = profile.figure("device.memory.bandwidth_gbps")
    peak, peak_key = _peak_flops(profile, facts.precision)
    notes = list(facts.notes)
    if measured_host:
        if not bw_gbps and measured_host.get("bandwidth_gbps"):
            bw_gbps = measured_host["bandwidth_gbps"]
            notes.append(f"bandwidth measured on this host: {measured_host.get('method')}")
        if not peak and measured_host.get("peak_flops"):
            peak, peak_key = measured_host["peak_flops"], "measured_fp32"
            notes.append(f"peak FLOP/s measured on this host: {measured_host.get('peak_method')}")
    dev_class = device_class(profile)
    out: dict[str, Any] = {
        "profile": profile.name,
        "device_class": dev_class,
        "bandwidth_gbps": bw_gbps,
        "peak_flops": peak,
        "peak_figure": peak_key,
        "work": facts.to_dict(),
        "notes": notes,
    }
    if not bw_gbps:
        out["unavailable"] = (
            f"profile {profile.name} has no memory bandwidth figure: run "
            "`edgesdk profiles detect --write` on the device to measure one"
        )
        return out
    bw = float(bw_gbps) * 1e9
    quant = "int4" if facts.precision and "4" in str(facts.precision) else None
    if peak_key not in ("fp32_tflops", "measured_fp32") and facts.precision == "fp32" and peak:
        out["notes"].append("profile has no FP32 peak: compute bound uses the FP16 tensor-core peak")
    if facts.kind == "encoder":
        out["encoder"] = _encoder_prediction(facts, bw, peak, table, dev_class, backend, notes)
        return out
    out.update(_llm_prediction(facts, bw, peak, table, dev_class, backend, quant, prompt_tokens, context))
    return out


def prediction_error(predicted: float | None, measured: float | None) -> float | None:
    """Signed relative error in percent: (predicted - measured) / measured."""
    if predicted is None or measured in (None, 0):
        return None
    return 100.0 * (predicted - measured) / measured


def efficiency_from_measurement(bound: float, measured: float, higher_is_better: bool) -> float:
    """The efficiency a measurement implies: measured/bound for rates, bound/measured for latencies."""
    return measured / bound if higher_is_better else bound / measured
