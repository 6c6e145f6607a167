# SPDX-License-Identifier: Apache-2.0
"""Calibration for :mod:`edgesdk.formats.onnx.quant`: activation capture, SmoothQuant, node sensitivity.

Everything here works on an FP32 ONNX model and the caller's calibration feeds:

- :func:`capture_activations` runs the model once and keeps, for every quantizable node's input,
  per-channel ranges and a sample of real-token rows;
- :func:`plan_smoothing` / :func:`apply_smoothing` implement SmoothQuant (Xiao et al. 2022) with an
  explicit ``Mul`` per smoothed tensor, kept only where a numpy simulation of ORT's dynamic
  quantization says it cuts the error;
- :func:`output_sensitivity` measures each node's effect on the final output by injecting its
  simulated INT8 error into one FP32 session, one node at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import InputError

if TYPE_CHECKING:
    import os

    from onnx import ModelProto, NodeProto
    from onnxruntime import InferenceSession  # untyped package: Any to mypy

Feed = Mapping[str, np.ndarray]  # one calibration/parity input: graph input name -> array
# parity_fn(references, candidates) -> metrics with "min_cosine" (edgesdk.formats.onnx.parity.compare)
ParityFn = Callable[[list[np.ndarray], list[np.ndarray]], Mapping[str, Any]]

MIN_SMOOTH_GAIN = 0.85  # a smoothing Mul costs a few microseconds per call; pay it only for a real gain
_SIMULATED_ROWS = 512  # token rows kept per tensor for the error simulation (the scale uses whole tensors)


def ort_session(
    model_or_path: ModelProto | str | os.PathLike[str], threads: int, *, optimize: bool = True, spin: bool = False
) -> InferenceSession:
    """A CPU session. ``spin=False`` (calibration work): ORT's worker threads otherwise keep spinning
    after each run and fight numpy, which runs in between, for the same cores."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not optimize:  # basic rewrites only: the probed intermediate tensors keep their values
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    source = model_or_path.SerializeToString() if hasattr(model_or_path, "SerializeToString") else str(model_or_path)
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def feed_for(session: InferenceSession, feed: Feed) -> dict[str, np.ndarray]:
    """The session's inputs picked from ``feed``; a missing one is the caller's error, in one line."""
    names = [i.name for i in session.get_inputs()]
    missing = [n for n in names if n not in feed]
    if missing:
        raise InputError(f"calibration feed lacks model input(s) {', '.join(missing)}")
    return {n: feed[n] for n in names}


@dataclass
class _Activation:
    """One quantizable node input, seen over the calibration feeds."""

    absmax: np.ndarray  # per input channel, over all rows of all feeds
    ch_min: np.ndarray  # [feeds, channels] per-feed channel minima (the runtime scale is per call)
    ch_max: np.ndarray  # [feeds, channels]
    rows: np.ndarray  # [feeds * rows_per_feed, channels] sampled rows of real (unpadded) tokens
    rows_per_feed: int
    token_aligned: bool = False  # one row per attention_mask token: padded rows are zeroed at run time (quant.py)


def capture_activations(
    model: ModelProto, tensor_names: list[str], feeds: Sequence[Feed], threads: int
) -> dict[str, _Activation]:
    import onnx
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    graph_inputs = {i.name for i in probe.graph.input}
    for name in tensor_names:
        if name not in present and name not in graph_inputs:
            probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort_session(probe, threads, optimize=False)
    probed = [n for n in tensor_names if n not in graph_inputs]
    rng = np.random.default_rng(0)
    rows_per_feed = max(4, _SIMULATED_ROWS // len(feeds))
    seen: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {
        name: ([], [], []) for name in tensor_names
    }
    aligned = dict.fromkeys(tensor_names, True)
    absmax: dict[str, np.ndarray] = {}
    for feed in feeds:
        ort_feed = feed_for(session, feed)
        values = dict(zip(probed, session.run(probed, ort_feed) if probed else []))
        mask = feed.get("attention_mask")
        for name in tensor_names:
            value = values[name] if name in values else ort_feed[name]
            rows = value.reshape(-1, value.shape[-1])
            # Pooling ignores padded positions, so the error that matters is on real tokens. A tensor with
            # one row per token gets its padded rows zeroed before quantization (quant.py), so its runtime
            # scale comes from the real tokens too; any other tensor's scale comes from all of it. (Zeroing
            # only where padding widened the calibration range was tried: 6-9 of 24 tensors, but padding
            # to 256 then still moved the embeddings.)
            token_rows = mask is not None and value.ndim == mask.ndim + 1 and value.shape[:-1] == mask.shape
            aligned[name] = aligned[name] and token_rows
            valid = rows[mask.reshape(-1) > 0] if token_rows and mask is not None else rows
            mins, maxs, kept = seen[name]
            mins.append(valid.min(axis=0))
            maxs.append(valid.max(axis=0))
            # SmoothQuant's channel maxima over every row, padded ones included: measured on MiniLM, maxima
            # from real tokens only smoothed less and a 256-token neighbour then cost more (0.9917 vs 0.9942)
            peak = np.abs(rows).max(axis=0)
            absmax[name] = np.maximum(absmax[name], peak) if name in absmax else peak
            kept.append(valid[rng.choice(len(valid), rows_per_feed, replace=len(valid) < rows_per_feed)])
    acts: dict[str, _Activation] = {}
    for name, (mins, maxs, kept) in seen.items():
        ch_min, ch_max = np.stack(mins), np.stack(maxs)
        acts[name] = _Activation(
            absmax[name], ch_min, ch_max, np.concatenate(kept).astype(np.float32), rows_per_feed, aligned[name]
        )
    return acts


# ----------------------------------------------------------------------- error simulation


def _quantize_rows_u8(rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """What ORT's DynamicQuantizeLinear does to a tensor whose range is [lo, hi] (0 included)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255.0 or 1.0)
    zero_point = np.float32(np.clip(np.round(-lo / scale), 0, 255))
    out: np.ndarray = (np.clip(np.round(rows / scale) + zero_point, 0, 255) - zero_point) * scale
    return out


def _quantize_weight_s8(weight: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric int8, as ORT's per_channel=True does for MatMul weights."""
    scale = np.abs(weight).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    out: np.ndarray = np.clip(np.round(weight / scale), -127, 127) * scale
    return out


def _simulated_error(
    act: _Activation, weights: list[np.ndarray], references: list[np.ndarray], smooth: np.ndarray | None
) -> list[float]:
    """Relative output error ||XqWq - XW|| / ||XW|| of each consumer weight, over the kept rows.

    ``references[i]`` is ``act.rows @ weights[i]`` (computed once by the caller).
    """
    inv = np.ones(weights[0].shape[0], np.float32) if smooth is None else (1.0 / smooth).astype(np.float32)
    # the runtime scale comes from each whole (smoothed) tensor: its range is the extreme of the
    # per-channel ranges after dividing by s (s > 0 keeps each channel's min/max order)
    lo = np.minimum(np.min(act.ch_min * inv, axis=1), 0.0)
    hi = np.maximum(np.max(act.ch_max * inv, axis=1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0)
    zero_point = np.clip(np.round(-lo / scale), 0, 255)
    row_scale, row_zp = np.repeat(scale, act.rows_per_feed)[:, None], np.repeat(zero_point, act.rows_per_feed)[:, None]
    xq = (np.clip(np.round(act.rows * inv / row_scale) + row_zp, 0, 255) - row_zp) * row_scale
    errors: list[float] = []
    for w, ref in zip(weights, references):
        ws = w if smooth is None else w * smooth[:, None]
        errors.append(float(np.linalg.norm(xq @ _quantize_weight_s8(ws) - ref) / max(np.linalg.norm(ref), 1e-30)))
    return errors


def _smooth_factors(act: _Activation, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """SmoothQuant's s_j = max|X_j|^alpha / max|W_j|^(1-alpha), over every consumer's weight row j."""
    w_max = np.max(np.stack([np.abs(w).max(axis=1) for w in weights]), axis=0)
    s = np.maximum(act.absmax, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1.0 - alpha)
    out: np.ndarray = s.astype(np.float32)
    return out


@dataclass
class SmoothingPlan:
    """Per activation tensor: chosen smoothing and each consumer's simulated error."""

    smooth: dict[str, tuple[float, np.ndarray]]  # tensor -> (alpha, s)
    node_error: dict[str, float]  # node name -> simulated relative output error after smoothing
    node_macs: dict[str, int]  # node name -> K*N, the work INT8 saves per token


def plan_smoothing(
    model: ModelProto, nodes: Sequence[NodeProto], acts: dict[str, _Activation], alpha: float
) -> SmoothingPlan:
    """Smooth a node input tensor where that cuts its consumers' simulated error by >= 1 - MIN_SMOOTH_GAIN."""
    from onnx import numpy_helper

    inits = {init.name: init for init in model.graph.initializer}
    by_input: dict[str, list[NodeProto]] = {}
    for node in nodes:
        by_input.setdefault(node.input[0], []).append(node)
    plan = SmoothingPlan({}, {}, {})
    for tensor, consumers in by_input.items():
        weights = [numpy_helper.to_array(inits[n.input[1]]).astype(np.float32) for n in consumers]
        for n, w in zip(consumers, weights):
            plan.node_macs[n.name] = int(w.shape[0] * w.shape[1])
        refs = [acts[tensor].rows @ w for w in weights]
        err = _simulated_error(acts[tensor], weights, refs, None)
        s = _smooth_factors(acts[tensor], weights, alpha)
        smoothed_err = _simulated_error(acts[tensor], weights, refs, s)
        if sum(smoothed_err) < MIN_SMOOTH_GAIN * sum(err):
            plan.smooth[tensor] = (alpha, s)
            err = smoothed_err
        for n, e in zip(consumers, err):
            plan.node_error[n.name] = float(e)
    return plan


def apply_smoothing(model: ModelProto, nodes: Sequence[NodeProto], plan: SmoothingPlan) -> ModelProto:
    """Return a copy of ``model`` with X/s (one Mul per tensor) feeding the consumers and W*s weights."""
    import onnx
    from onnx import helper, numpy_helper

    smoothed = onnx.ModelProto()
    smoothed.CopyFrom(model)
    inits = {init.name: init for init in smoothed.graph.initializer}
    node_names = {n.name for n in nodes}
    consumers = [n for n in smoothed.graph.node if n.name in node_names and n.input[0] in plan.smooth]
    weight_users: dict[str, int] = {}
    for node in smoothed.graph.node:
        for name in node.input:
            weight_users[name] = weight_users.get(name, 0) + 1
    muls: dict[str, NodeProto] = {}
    for tensor, (_alpha, s) in plan.smooth.items():
        inv_name, out_name = f"{tensor}_smooth_inv", f"{tensor}_smoothed"
        smoothed.graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), inv_name))
        muls[out_name] = helper.make_node("Mul", [tensor, inv_name], [out_name], name=f"{tensor}_SmoothMul")
    for node in consumers:
        _alpha, s = plan.smooth[node.input[0]]
        weight_name = node.input[1]
        w = numpy_helper.to_array(inits[weight_name]).astype(np.float32) * s[:, None]
        if weight_users.get(weight_name, 0) > 1:  # a shared weight must not be scaled for everyone
            weight_name = f"{weight_name}_smoothed_{node.name}"
            smoothed.graph.initializer.append(numpy_helper.from_array(w, weight_name))
            node.input[1] = weight_name
        else:
            inits[weight_name].CopyFrom(numpy_helper.from_array(w, weight_name))
        node.input[0] = f"{node.input[0]}_smoothed"
    # keep the node list topologically sorted: each Mul goes right before its first consumer
    ordered: list[NodeProto] = []
    for node in smoothed.graph.node:
        for name in list(node.input):
            if name in muls:
                ordered.append(muls.pop(name))
        ordered.append(node)
    del smoothed.graph.node[:]
    smoothed.graph.node.extend(ordered)
    return smoothed


def parity_on(parity_fn: ParityFn, references: list[np.ndarray], candidates: dict[int, np.ndarray]) -> float:
    """Min cosine over the feeds in ``candidates``: the others are given their reference (cosine 1).

    ``parity_fn`` always sees full, aligned lists, so a caller's per-feed data (attention masks for
    pooling) stays in step with the references.
    """
    full = [candidates.get(i, ref) for i, ref in enumerate(references)]
    return float(parity_fn(references, full)["min_cosine"])


def output_sensitivity(
    smoothed: ModelProto,
    nodes: Sequence[NodeProto],
    plan: SmoothingPlan,
    all_feeds: Sequence[Feed],
    picked: list[int],
    references: list[np.ndarray],
    parity_fn: ParityFn,
    threads: int,
    masked: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """Per node: 1 - min cosine of the FP32 model when only that node carries its simulated INT8 error.

    One session serves every node: each MatMul output gets an ``Add`` of an extra graph input, fed
    with zeros except for the node under test, on the feeds in ``picked`` only.
    """
    import onnx
    from onnx import helper, numpy_helper

    feeds = [all_feeds[i] for i in picked]
    wanted = {n.name for n in nodes}
    matmuls = [n for n in smoothed.graph.node if n.name in wanted and n.op_type == "MatMul"]
    x_names = sorted({n.input[0] for n in matmuls})
    probe = onnx.ModelProto()
    probe.CopyFrom(smoothed)
    graph_inputs = {i.name for i in probe.graph.input}
    probed = [x for x in x_names if x not in graph_inputs]
    probe.graph.output.extend(helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in probed)
    probe_session = ort_session(probe, threads, optimize=False)
    inputs = [
        {**f, **dict(zip(probed, probe_session.run(probed, feed_for(probe_session, f)) if probed else []))}
        for f in feeds
    ]

    inject = onnx.ModelProto()
    inject.CopyFrom(smoothed)
    ordered: list[NodeProto] = []
    for node in inject.graph.node:
        ordered.append(node)
        if node.name in wanted and node.op_type == "MatMul":
            clean, error = f"{node.output[0]}_fp32", f"{node.name}_int8_error"
            ordered.append(helper.make_node("Add", [clean, error], [node.output[0]], name=f"{node.name}_inject"))
            node.output[0] = clean
            inject.graph.input.append(helper.make_tensor_value_info(error, onnx.TensorProto.FLOAT, None))
    del inject.graph.node[:]
    inject.graph.node.extend(ordered)
    session = ort_session(inject, threads)
    inits = {init.name: init for init in smoothed.graph.initializer}
    base: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    for feed, xs in zip(feeds, inputs):
        f = feed_for(session, {**feed, **{f"{n.name}_int8_error": np.zeros(1, np.float32) for n in matmuls}})
        base.append((f, xs))
    sensitivity: dict[str, float] = {}
    for node in matmuls:
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        wq = _quantize_weight_s8(w)
        outputs: dict[int, np.ndarray] = {}
        for feed_index, (f, xs) in zip(picked, base):
            x = xs[node.input[0]]
            rows = x.reshape(-1, x.shape[-1])
            mask = all_feeds[feed_index].get("attention_mask")
            ranged = rows[mask.reshape(-1) > 0] if node.input[0] in masked and mask is not None else rows
            xq = _quantize_rows_u8(rows, float(ranged.min()), float(ranged.max()))
            delta = (xq @ wq - rows @ w).reshape(*x.shape[:-1], w.shape[1]).astype(np.float32)
            outputs[feed_index] = session.run(None, {**f, f"{node.name}_int8_error": delta})[0]
        sensitivity[node.name] = max(0.0, 1.0 - parity_on(parity_fn, references, outputs))
    # fused Attention nodes cannot take an additive error on their projection: scale their local error
    # by the typical output-to-local ratio of the MatMuls
    ratios = [sensitivity[n] / plan.node_error[n] for n in sensitivity if plan.node_error[n] > 0]
    scale = float(np.median(ratios)) if ratios else 1.0
    for node in nodes:
        sensitivity.setdefault(node.name, plan.node_error[node.name] * scale)
    return sensitivity
