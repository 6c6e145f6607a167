# SPDX-License-Identifier: Apache-2.0
"""Accuracy-aware INT8 for ONNX transformer encoders on CPU, and transformer graph fusion.

Why this exists: plain dynamic INT8 of an encoder such as all-MiniLM-L6-v2 is fast but loses
accuracy (min cosine 0.95 with per-tensor weights, 0.99 per-channel; docs/int8.md). The loss
comes from activation outliers: a few channels of the LayerNorm / GELU outputs are 10-20x larger
than the rest, and dynamic quantization uses one scale per activation tensor. This module

1. runs the FP32 model once on the calibration feeds and records every quantizable node's input
   (per-channel absolute maxima plus a sample of rows);
2. smooths activations (SmoothQuant, Xiao et al. 2022): divides input channel j by s_j and
   multiplies weight row j by s_j, so X W is unchanged in exact arithmetic but the activation
   range is flatter. The division is an explicit ``Mul`` before the consumers because the tensor
   also feeds residual connections; a tensor is smoothed only where a numpy simulation of the
   runtime quantization says it cuts the error (each Mul costs a little latency);
3. quantizes with ONNX Runtime's dynamic INT8 (u8 activations, per-channel s8 weights);
4. measures parity with the caller's ``parity_fn`` against the caller's reference outputs. Below
   ``min_cosine`` it measures each node's effect on the final output once: one FP32 session in
   which every quantizable node's output gets an additive input, fed with that node's simulated
   INT8 error, one node at a time, scored with ``parity_fn`` (a local error proxy ranks nodes
   badly: Q/K projections show the same relative error as the FFN but softmax hides it). Nodes
   then leave INT8 in order of output damage per unit of compute saved (a latency model: a node's
   INT8 gain scales with its K*N MACs), the excluded set growing 1, 2, 4, ... and then bisected,
   so only a handful of re-quantizations run.

It raises :class:`~edgesdk.errors.ParityError` when the threshold cannot be met with at most
``max_excluded_fraction`` of the quantizable nodes in FP32.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import InputError, ModelError, ParityError
from edgesdk.formats.onnx.calibration import (
    apply_smoothing,
    capture_activations,
    feed_for,
    ort_session,
    output_sensitivity,
    parity_on,
    plan_smoothing,
)

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto, TensorProto

    from edgesdk.formats.onnx.calibration import Feed

# One INT8 attempt: (parity passed, model path, parity metrics).
_Attempt = tuple[bool, Path, dict[str, Any]]

# SmoothQuant migration strength. On all-MiniLM-L6-v2 (64 held-out sentences, docs/int8.md) 0.5 gave
# min cosine 0.9888, 0.6 0.9962, 0.7 0.9970, 0.8 0.9942, 0.9 0.9899; picking alpha per tensor by the
# local error simulation chose 0.8 mostly and generalised worse (0.9951), so one global value.
DEFAULT_SMOOTH_ALPHA = 0.7
_SENSITIVITY_FEEDS = 3  # the worst feeds of the first INT8 attempt drive the min cosine
QUANTIZABLE_OPS = ("MatMul", "Attention")


@dataclass
class QuantResult:
    """What :func:`quantize_int8_accuracy_aware` produced and how it got there."""

    path: Path
    method: str
    excluded_nodes: list[str]
    parity: dict[str, Any]
    latency_ms: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""


# ----------------------------------------------------------------------------------- fusion


def optimize_transformer(
    fp32_onnx: Path,
    out_path: Path,
    *,
    model_type: str,
    num_heads: int,
    hidden_size: int,
    use_gpu_fusions: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Fuse attention / LayerNorm / GELU subgraphs with ONNX Runtime's transformer optimizer.

    Returns ``(path, report)``; ``report["fused"]`` counts each fused op. Only the optimizer's
    Python fusions run (opt_level 0), so the file stays valid for every execution provider.
    When nothing fuses, the input is copied unchanged and ``report["reason"]`` says why.
    """
    fp32_onnx, out_path = Path(fp32_onnx), Path(out_path)
    _require_model_file(fp32_onnx)
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        options = FusionOptions(model_type)
        model = optimize_model(
            str(fp32_onnx),
            model_type=model_type,
            num_heads=num_heads,
            hidden_size=hidden_size,
            optimization_options=options,
            opt_level=0,
            use_gpu=use_gpu_fusions,
        )
    except KeyError as exc:
        raise InputError(f"unsupported transformer model_type {model_type!r} for graph fusion") from exc
    except Exception as exc:  # the optimizer raises bare exceptions on graphs it cannot parse
        raise ModelError(f"graph fusion failed on {fp32_onnx}: {type(exc).__name__}: {exc}") from exc
    fused = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    report: dict[str, Any] = {
        "fused": fused,
        "model_type": model_type,
        "num_heads": num_heads,
        "hidden_size": hidden_size,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not fused:
        shutil.copyfile(fp32_onnx, out_path)
        report["applied"] = False
        report["reason"] = f"no {model_type} fusion pattern matched this graph; copied unchanged"
        return out_path, report
    model.save_model_to_file(str(out_path))
    report["applied"] = True
    report["reason"] = "fused " + ", ".join(f"{n} {op}" for op, n in sorted(fused.items()))
    return out_path, report


# ------------------------------------------------------------------------- calibration data


def _require_model_file(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"ONNX model not found: {path}")


def _load_onnx(path: Path) -> ModelProto:
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as exc:
        raise ModelError(f"cannot parse ONNX model {path}: {type(exc).__name__}") from exc


def _weight_nodes(model: ModelProto) -> list[NodeProto]:
    """Nodes ORT's dynamic INT8 can quantize: MatMul / fused Attention with a 2-D constant weight."""
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    return [
        node
        for node in model.graph.node
        if node.op_type in QUANTIZABLE_OPS and len(node.input) > 1 and len(shapes.get(node.input[1], ())) == 2
    ]


# ------------------------------------------------------------------ quantize, measure, search


def _int8_model(
    smoothed: ModelProto,
    nodes: list[NodeProto],
    exclude: set[str],
    out_path: Path,
    masked: frozenset[str] = frozenset(),
) -> None:
    """Write the INT8 model: MatMul -> DynamicQuantizeLinear + MatMulIntegerToFloat (per-column s8 weights).

    Activations in ``masked`` (one row per token of the ``attention_mask`` input) are multiplied by the
    mask first: DynamicQuantizeLinear takes one scale per tensor, and padded rows would otherwise set it
    (MiniLM: padding a short text to 256 tokens widened the GELU-output scales 1.5-1.9x and took its min
    cosine from 0.9971 to 0.9942). Zeroed rows leave the scale to the real tokens; pooling and attention
    ignore padded rows, so their values do not matter.

    Numerically what ``onnxruntime.quantization.quantize_dynamic(per_channel=True)`` produces after
    ORT's own fusions, but vectorised: ORT's quantizer loops over channels in Python (seconds per
    call), this takes milliseconds, which keeps the exclusion search cheap. Fused ``Attention`` nodes
    go through ``quantize_dynamic`` (QAttention).
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(smoothed)
    inits = {init.name: init for init in model.graph.initializer}
    todo = {n.name for n in nodes if n.op_type == "MatMul" and n.name not in exclude}
    users: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    biases = _foldable_bias_adds(model, todo, inits)
    folded = {id(add) for add, _ in biases.values()}
    quantized_inputs: dict[str, tuple[str, str, str]] = {}
    ordered: list[NodeProto] = []
    wants_mask = any(n.input[0] in masked for n in model.graph.node if n.name in todo)
    mask_f = _float_mask(model, ordered) if wants_mask else None
    for node in model.graph.node:
        if id(node) in folded:
            continue
        if node.name not in todo:
            ordered.append(node)
            continue
        x = node.input[0]
        if x not in quantized_inputs:  # one DynamicQuantizeLinear per activation, shared by its consumers
            names = (f"{x}_u8", f"{x}_scale", f"{x}_zero_point")
            source = x
            if mask_f is not None and x in masked:
                source = f"{x}_unpadded"
                ordered.append(helper.make_node("Mul", [x, mask_f], [source], name=f"{x}_ZeroPadding"))
            ordered.append(
                helper.make_node("DynamicQuantizeLinear", [source], list(names), name=f"{x}_DynamicQuantize")
            )
            quantized_inputs[x] = names
        x_u8, x_scale, x_zp = quantized_inputs[x]
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        scale = (np.abs(w).max(axis=0) / 127.0).astype(np.float32)
        scale[scale == 0] = 1.0
        w_s8 = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        base = f"{node.name}_int8"
        model.graph.initializer.extend(
            [
                numpy_helper.from_array(w_s8, f"{base}_weight"),
                numpy_helper.from_array(scale, f"{base}_weight_scale"),
                numpy_helper.from_array(np.zeros_like(w_s8[0]), f"{base}_weight_zero_point"),
            ]
        )
        inputs = [x_u8, f"{base}_weight", x_scale, f"{base}_weight_scale", x_zp, f"{base}_weight_zero_point"]
        outputs = list(node.output)
        if node.name in biases:  # the bias Add rides along inside the INT8 kernel
            add, bias = biases[node.name]
            inputs.append(bias)
            outputs = list(add.output)
        ordered.append(helper.make_node("MatMulIntegerToFloat", inputs, outputs, name=base, domain="com.microsoft"))
        users[node.input[1]] -= 1
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    unused = [init for init in model.graph.initializer if users.get(init.name, 1) == 0]
    for init in unused:  # the FP32 weights that only quantized nodes used
        model.graph.initializer.remove(init)
    if not any(d.domain == "com.microsoft" for d in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    attention = [n.name for n in nodes if n.op_type == "Attention" and n.name not in exclude]
    if not attention:
        onnx.save(model, str(out_path))
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        model,
        out_path,
        op_types_to_quantize=["Attention"],
        per_channel=True,
        weight_type=QuantType.QInt8,
        nodes_to_quantize=attention,
        # contrib ops (fused Attention, SkipLayerNormalization) defeat ONNX shape inference
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _float_mask(model: ModelProto, ordered: list[NodeProto]) -> str | None:
    """Append nodes computing ``attention_mask`` as float [batch, seq, 1] to ``ordered``; None without one."""
    from onnx import TensorProto, helper, numpy_helper

    mask = next((i for i in model.graph.input if i.name == "attention_mask"), None)
    if mask is None or len(mask.type.tensor_type.shape.dim) != 2:
        return None
    opset = next((d.version for d in model.opset_import if d.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray([-1], np.int64), "attention_mask_axes_int8"))
        unsqueeze = helper.make_node(
            "Unsqueeze",
            ["attention_mask", "attention_mask_axes_int8"],
            ["attention_mask_3d_int8"],
            name="attention_mask_Unsqueeze_int8",
        )
    else:
        unsqueeze = helper.make_node(
            "Unsqueeze", ["attention_mask"], ["attention_mask_3d_int8"], axes=[-1], name="attention_mask_Unsqueeze_int8"
        )
    ordered.append(unsqueeze)
    ordered.append(
        helper.make_node(
            "Cast",
            ["attention_mask_3d_int8"],
            ["attention_mask_float_int8"],
            to=TensorProto.FLOAT,
            name="attention_mask_Cast_int8",
        )
    )
    return "attention_mask_float_int8"


def _foldable_bias_adds(
    model: ModelProto, todo: set[str], inits: dict[str, TensorProto]
) -> dict[str, tuple[NodeProto, str]]:
    """MatMul name -> (Add node, bias name) where the MatMul's only consumer adds a constant [N] bias.

    Folding it into MatMulIntegerToFloat's bias input saves one elementwise pass per MatMul. (Fusing
    the residual Add + LayerNorm into SkipLayerNormalization as well was tried: ORT 1.31's CPU
    kernel took 1.4 ms for 12 of them against 0.3 ms for the unfused pair, so it is not done.)
    """
    consumers: dict[str, list[NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    found: dict[str, tuple[NodeProto, str]] = {}
    for node in model.graph.node:
        if node.name not in todo or node.output[0] in graph_outputs:
            continue
        users = consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
            continue
        add = users[0]
        bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        weight = inits[node.input[1]]
        if bias in inits and list(inits[bias].dims) == [weight.dims[1]] and inits[bias].data_type == 1:
            found[node.name] = (add, bias)
    return found


def _run_first_output(path: Path, feeds: Sequence[Feed], threads: int) -> list[np.ndarray]:
    session = ort_session(path, threads)
    return [session.run(None, feed_for(session, f))[0] for f in feeds]


def measure_latency_ms(paths: list[Path], feed: dict[str, np.ndarray], **timing: Any) -> list[float]:
    """p50 latency of each model on ``feed``; the models take turns so machine load hits all alike. ``timing``:
    :func:`latency_samples_ms`'s keywords (threads, rounds, runs per round, warm-up runs, settle time)."""
    return [float(np.median(x)) for x in latency_samples_ms(paths, feed, **timing)]


def latency_samples_ms(
    paths: list[Path],
    feed: dict[str, np.ndarray],
    *,
    threads: int = 2,
    rounds: int = 8,
    runs_per_round: int = 2,
    warmup: int = 3,
    settle_s: float = 0.02,
) -> list[list[float]]:
    """Per model, one mean latency per round; round r of every model ran back to back.

    ``settle_s``: a pause before each model's turn so the previous session's spinning worker threads
    (ORT's default) have gone idle; without it, on 2 cores, every model was timed ~2x slow and the
    ratios drifted with the order (measured: FP32 23 ms interleaved vs 11 ms alone, same machine)."""
    sessions = [ort_session(p, threads, spin=True) for p in paths]  # ORT's default, as deployed
    feeds = [feed_for(s, feed) for s in sessions]
    for s, f in zip(sessions, feeds):
        for _ in range(warmup):
            s.run(None, f)
    samples: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for i, (s, f) in enumerate(zip(sessions, feeds)):
            time.sleep(settle_s)
            start = time.perf_counter()
            for _ in range(runs_per_round):
                s.run(None, f)
            samples[i].append((time.perf_counter() - start) * 1e3 / runs_per_round)
    return samples


def quantize_int8_accuracy_aware(
    fp32_onnx: Path,
    out_path: Path,
    *,
    calibration_feeds: list[dict[str, np.ndarray]],
    reference_outputs: list[np.ndarray],
    parity_fn: Callable[[list[np.ndarray], list[np.ndarray]], dict[str, Any]],
    min_cosine: float = 0.995,
    max_excluded_fraction: float = 0.5,
    intra_op_threads: int = 2,
    progress: Callable[[str], None] | None = None,
    smooth_alpha: float = DEFAULT_SMOOTH_ALPHA,
) -> QuantResult:
    """Dynamic INT8 with activation smoothing, keeping the costliest nodes in FP32 until parity holds.

    ``reference_outputs[i]`` is the source model's first output for ``calibration_feeds[i]``;
    ``parity_fn(reference, candidate)`` returns at least ``{"min_cosine": float}`` and is always
    called with full lists aligned with ``calibration_feeds`` (feeds not under test get their
    reference as candidate), so it may index per-feed data such as attention masks by position.
    """

    fp32_onnx, out_path = Path(fp32_onnx), Path(out_path)
    _require_model_file(fp32_onnx)
    if not calibration_feeds or len(calibration_feeds) != len(reference_outputs):
        raise InputError(
            f"need one reference output per calibration feed (got {len(calibration_feeds)} feeds, "
            f"{len(reference_outputs)} references)"
        )
    if not 0.0 < min_cosine <= 1.0 or not 0.0 <= max_excluded_fraction <= 1.0:
        raise InputError("min_cosine must be in (0, 1] and max_excluded_fraction in [0, 1]")
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    model = _load_onnx(fp32_onnx)
    if model.ByteSize() > 2_000_000_000:  # one protobuf: the rewrite does not write external data
        raise ModelError(f"{fp32_onnx} is over 2 GB; the INT8 step handles single-file models only")
    for i, node in enumerate(model.graph.node):  # exclusion lists and smoothing address nodes by name
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    nodes = _weight_nodes(model)
    if not nodes:
        raise ModelError(f"{fp32_onnx} has no MatMul/Attention node with a constant 2-D weight to quantize")
    op_types = sorted({n.op_type for n in nodes})

    say(f"calibrating {len(nodes)} quantizable nodes on {len(calibration_feeds)} feeds")
    acts = capture_activations(model, sorted({n.input[0] for n in nodes}), calibration_feeds, intra_op_threads)
    plan = plan_smoothing(model, nodes, acts, smooth_alpha)
    smoothed = apply_smoothing(model, nodes, plan)
    # activations with one row per token: padded rows are zeroed before quantization (see _int8_model)
    has_mask = any(i.name == "attention_mask" and len(i.type.tensor_type.shape.dim) == 2 for i in model.graph.input)
    masked = frozenset(
        t for name, act in acts.items() if has_mask and act.token_aligned for t in (name, f"{name}_smoothed")
    )
    max_excluded = int(max_excluded_fraction * len(nodes))
    order: list[str] = []  # exclusion order, decided after the first attempt if that one fails
    steps: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="edgesdk-int8-") as tmp:

        def attempt(n_excluded: int) -> tuple[bool, Path, dict[str, Any], list[np.ndarray]]:
            candidate = Path(tmp) / f"int8_excl{n_excluded}.onnx"
            t0 = time.perf_counter()
            _int8_model(smoothed, nodes, set(order[:n_excluded]), candidate, masked)
            outputs = _run_first_output(candidate, calibration_feeds, intra_op_threads)
            parity = parity_fn(reference_outputs, outputs)
            ok = float(parity["min_cosine"]) >= min_cosine
            steps.append(
                {
                    "excluded": n_excluded,
                    "excluded_nodes": order[:n_excluded],
                    "parity": parity,
                    "passed": ok,
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
            say(
                f"INT8 with {n_excluded} node(s) in FP32: min cosine {parity['min_cosine']:.5f}"
                f" ({'pass' if ok else 'below'} {min_cosine})"
            )
            return ok, candidate, parity, outputs

        first = attempt(0)
        best: tuple[int, Path, dict[str, Any]] | None = (0, first[1], first[2]) if first[0] else None
        if best is None and max_excluded > 0:
            t0 = time.perf_counter()
            per_feed = [parity_on(parity_fn, reference_outputs, {i: o}) for i, o in enumerate(first[3])]
            worst = [int(i) for i in np.argsort(per_feed)[:_SENSITIVITY_FEEDS]]
            sensitivity = output_sensitivity(
                smoothed,
                nodes,
                plan,
                calibration_feeds,
                worst,
                reference_outputs,
                parity_fn,
                intra_op_threads,
                masked,
            )
            # damage to the output per MAC that INT8 would save: the cheapest accuracy first
            order.extend(sorted(sensitivity, key=lambda n: sensitivity[n] / plan.node_macs[n], reverse=True))
            steps.append(
                {
                    "sensitivity": {n: round(sensitivity[n], 6) for n in order},
                    "feeds": [int(i) for i in worst],
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
            say(f"measured each node's output sensitivity on the {len(worst)} worst feeds")
            best = _search_exclusions(lambda k: attempt(k)[:3], max_excluded)
        if best is None:
            tried = [s for s in steps if "parity" in s]
            top = max(tried, key=lambda s: s["parity"]["min_cosine"])
            raise ParityError(
                f"INT8 cannot reach min cosine {min_cosine}: best {top['parity']['min_cosine']:.5f} with "
                f"{top['excluded']} of {len(nodes)} nodes in FP32 (limit {max_excluded})",
                hint="use FP32/FP16 or allow more exclusions",
            )
        n_excluded, candidate, parity = best
        fp32_ms, int8_ms = measure_latency_ms([fp32_onnx, candidate], calibration_feeds[0], threads=intra_op_threads)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(candidate), out_path)

    alphas = sorted({a for a, _ in plan.smooth.values()})
    method = (
        f"dynamic INT8 (ONNX Runtime: u8 activations per tensor, s8 weights per channel) on "
        f"{len(nodes) - n_excluded}/{len(nodes)} {'/'.join(op_types)} nodes; SmoothQuant on "
        f"{len(plan.smooth)} activation tensors (alpha {', '.join(f'{a:g}' for a in alphas) or '-'})"
        + (
            f"; padded rows zeroed before quantizing {len({m.removesuffix('_smoothed') for m in masked})} tensors"
            if masked
            else ""
        )
    )
    reason = (
        f"min cosine {parity['min_cosine']:.5f} >= {min_cosine} on {len(calibration_feeds)} calibration "
        f"feeds with {n_excluded} node(s) kept in FP32; {sum('parity' in s for s in steps)} quantization(s) tried in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return QuantResult(
        path=out_path,
        method=method,
        excluded_nodes=order[:n_excluded],
        parity=parity,
        latency_ms={
            "fp32": round(fp32_ms, 3),
            "int8": round(int8_ms, 3),
            "ratio": round(int8_ms / fp32_ms, 3),
            "how": f"p50, ORT CPU EP, {intra_op_threads} intra-op threads, calibration feed 0, interleaved",
        },
        steps=steps,
        reason=reason,
    )


def _search_exclusions(
    attempt: Callable[[int], _Attempt], max_excluded: int
) -> tuple[int, Path, dict[str, Any]] | None:
    """Smallest k in 1..max_excluded (1, 2, 4, ... then bisection) whose INT8 model passes, else None.

    Assumes k = 0 already failed; parity grows with k in the usual case, which bisection relies on.
    """
    low, k = 0, 1
    while True:
        k = min(k, max_excluded)
        if k <= low:
            return None
        ok, path, parity = attempt(k)
        if ok:
            break
        if k == max_excluded:
            return None
        low, k = k, k * 2
    high, best = k, (k, path, parity)
    while high - low > 1:
        mid = (low + high) // 2
        ok, path, parity = attempt(mid)
        if ok:
            high, best = mid, (mid, path, parity)
        else:
            low = mid
    return best
