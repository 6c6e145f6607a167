# SPDX-License-Identifier: Apache-2.0
"""The VLM vision encoder + projector as one FP16 ONNX graph (the second vision runtime of issue 15).

What is exported is exactly what the decoder consumes: LLaVA's ``get_image_features(pixel_values)``
(the vision tower's ``vision_feature_layer`` hidden states, the feature selection, the MLP projector),
one image at the checkpoint's static size:

* input ``pixel_values`` float32 ``[1, 3, H, W]``, already normalised with the processor's
  ``rescale_factor`` / ``image_mean`` / ``image_std`` (:func:`normalise`; the names and the normalisation are the
  artifact's contract, :mod:`edgesdk.contracts.vlm_encoder`, which the runtime imports too);
* output ``image_features`` float32 ``[1, n_image_tokens, n_embd]``.

``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``) traces one static shape with
eager attention, so the graph has no control flow (no If/Loop) and only static shapes: what
TensorRT's ONNX parser builds an engine from. The FP32 graph is converted to FP16 by
``onnxruntime.transformers.float16`` with ``keep_io_types=True`` (inputs and outputs stay float32:
callers need no casts, the weights and every inner op are FP16). The export runs in a child process
(torch stays out of the build process, as the PyTorch reference does):
``python -m edgesdk.formats.vlm._children.encoder_export`` (edgesdk/formats/vlm/_children/encoder_export.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.contracts.vlm_encoder import INPUT_NAME, OUTPUT_NAME, normalise
from edgesdk.errors import ExternalToolError

ONNX_OPSET = 17  # ONNX Runtime 1.1x+ and TensorRT 8.6/10.x (JetPack 6) both parse opset 17
# Ops TensorRT-friendly graphs must not have: data-dependent control flow.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def export_encoder(hf_dir: Path, fp32: Path, fp16: Path, *, opset: int = ONNX_OPSET) -> dict[str, Any]:
    """Export encoder + projector to ``fp32`` (child process), convert it to FP16 at ``fp16``; returns facts
    for the manifest (opset, sizes, op census, control-flow check)."""
    import tempfile

    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from edgesdk.formats.gguf.convert import reference_dir, run_child
    from edgesdk.formats.vlm.convert import canonical_name

    with tempfile.TemporaryDirectory(prefix="edgesdk-vlm-export-") as tmp:
        # a transformers 5 checkpoint as this host's transformers 4 loads it (unchanged otherwise)
        src = reference_dir(Path(hf_dir), Path(tmp), rename=canonical_name)
        what = "ONNX export of the vision encoder"
        proc = run_child("edgesdk.formats.vlm._children.encoder_export", [src, fp32, opset], fp32, what)
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    model = onnx.load(str(fp32))
    m16 = convert_float_to_float16(model, keep_io_types=True)
    topological_sort(m16.graph)  # the converter appends its input casts last; TensorRT's parser wants order
    onnx.checker.check_model(m16)
    onnx.save(m16, str(fp16))
    ops = sorted({n.op_type for n in m16.graph.node})
    flow = sorted(CONTROL_FLOW_OPS & set(ops))
    if flow:
        raise ExternalToolError(
            f"the exported vision encoder has control flow ({', '.join(flow)}): not TensorRT-friendly"
        )
    return {
        **info,
        "opset": opset,
        "exporter": "torch.onnx.export (TorchScript, static shape, eager attention)",
        "fp16": "onnxruntime.transformers.float16 (keep_io_types: float32 input/output)",
        "input": {"name": INPUT_NAME, "dtype": "float32", "shape": [1, 3, info["image_size"], info["image_size"]]},
        "output": {"name": OUTPUT_NAME, "dtype": "float32", "shape": [1, info["image_tokens"], info["n_embd"]]},
        "nodes": len(m16.graph.node),
        "op_types": ops,
        "control_flow": flow,
        "bytes_fp32": fp32.stat().st_size,
        "bytes": fp16.stat().st_size,
    }


def topological_sort(graph: Any) -> None:
    """Reorder ``graph.node`` in place so every node comes after the producers of its inputs."""
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(i in produced for i in node.input):
                ordered.append(node)
                produced.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise ExternalToolError(
                f"the exported vision encoder has a cycle or a dangling input at node {rest[0].name or rest[0].op_type}"
            )
        pending = rest
    copies = [type(n)() for n in ordered]
    for c, n in zip(copies, ordered, strict=True):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)


def onnx_features(path: Path, pixels: list[np.ndarray], preprocessor: dict[str, Any]) -> list[np.ndarray]:
    """Image features from the ONNX encoder on CPU for a list of resized HxWx3 uint8 images."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    out = []
    for p in pixels:
        f = sess.run([OUTPUT_NAME], {INPUT_NAME: normalise(p, preprocessor)})[0]
        out.append(f.reshape(-1, f.shape[-1]))
    return out


def min_token_cosine(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    cos = (got * want).sum(1) / np.clip(np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-30, None)
    return float(cos.min())


def onnx_parity(
    decoder: Path,
    mmproj: Path,
    onnx: Path,
    preprocessor: dict[str, Any],
    images: list[Path],
    refs: list[dict[str, Any]],
    mmproj_results: list[dict[str, Any]],
    *,
    n_ctx: int,
    n_tokens: int,
    prompt: str,
    mmproj_encode_s: list[float],
    open_backend: Callable[..., Any],
) -> dict[str, Any]:
    """The FP16 ONNX encoder through the runtime's own path (VLMPipeline with the encoder forced onto the CPU
    provider): features vs PyTorch and vs the mmproj's, and greedy tokens vs the mmproj path and PyTorch.
    ``mmproj_results``: per image ``features`` and ``tokens`` from the mmproj pipeline. ``open_backend``: the
    runtime's :func:`edgesdk.runtime.backends.vlm.parity_backend`, handed over by the build (formats sit below
    the runtime and do not import it)."""
    backend = open_backend(decoder, mmproj, preprocessor, n_ctx=n_ctx, onnx=onnx)
    pipe = backend.pipe
    per_image, cos_min, cos_mm_min, eq_pt, eq_mm = [], 1.0, 1.0, 0, 0
    try:
        for path, ref, mm in zip(images, refs, mmproj_results, strict=True):
            got = backend.image_features(path)
            c_pt, c_mm = min_token_cosine(got, ref["features"]), min_token_cosine(got, mm["features"])
            backend.generate(prompt, images=[path], max_tokens=n_tokens, temperature=0.0, seed=0)
            toks = backend.last["output_ids"]
            eq_pt, eq_mm = eq_pt + int(toks == ref["tokens"]), eq_mm + int(toks == mm["tokens"])
            cos_min, cos_mm_min = min(cos_min, c_pt), min(cos_mm_min, c_mm)
            per_image.append(
                {
                    "image": path.name,
                    "min_cosine": round(c_pt, 6),
                    "min_cosine_vs_mmproj": round(c_mm, 6),
                    "max_abs": round(float(np.abs(got - ref["features"]).max()), 6),
                    "tokens_onnx": toks,
                    "tokens_pytorch": ref["tokens"],
                }
            )
    finally:
        backend.close()

    def ms(v: list[float]) -> float | None:  # the first run (session warm-up) left out when there are more
        return round(float(np.median(v[1:] or v)) * 1e3, 3) if v else None

    n = len(images)
    return {
        "provider": "CPUExecutionProvider (build host; the runtime prefers TensorRT > CUDA)",
        "encoder_min_cosine": round(cos_min, 6),
        "min_cosine_vs_mmproj": round(cos_mm_min, 6),
        "greedy_equal_pytorch": f"{eq_pt}/{n}",
        "greedy_equal_mmproj": f"{eq_mm}/{n}",
        "encode_ms_median": {"onnx_cpu": ms(pipe.encode_s["onnx"]), "mmproj_cpu": ms(mmproj_encode_s)},
        "per_image": per_image,
    }
