# SPDX-License-Identifier: Apache-2.0
"""Accuracy-aware INT8 (edgesdk.formats.onnx.quant) on the real all-MiniLM-L6-v2 export."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import InputError, ModelError, ParityError
from edgesdk.formats.onnx import parity as P
from edgesdk.formats.onnx.quant import optimize_transformer, quantize_int8_accuracy_aware

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SEQ = 128


@pytest.fixture(scope="module")
def minilm(minilm_dir, tmp_path_factory):
    """FP32 ONNX export (optimum-onnx), tokenized calibration and held-out sentences, PyTorch outputs."""
    torch = pytest.importorskip("torch")
    exporters = pytest.importorskip("optimum.exporters.onnx")
    from transformers import AutoModel

    out = tmp_path_factory.mktemp("minilm_fp32")
    exporters.main_export(str(minilm_dir), output=out, task="feature-extraction", library_name="transformers")
    tok = P.load_tokenizer(minilm_dir, SEQ)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    calibration = P.encode_texts(tok, P.sample_sentences(16, offset=64), names)
    held_out = P.encode_texts(tok, P.sample_sentences(32, offset=0), names)  # disjoint from calibration
    model = AutoModel.from_pretrained(str(minilm_dir)).eval()
    with torch.no_grad():

        def reference(feeds):
            return [model(**{k: torch.from_numpy(v) for k, v in f.items()}).last_hidden_state.numpy() for f in feeds]

        return {
            "fp32": out / "model.onnx",
            "cal": calibration,
            "cal_ref": reference(calibration),
            "held": held_out,
            "held_ref": reference(held_out),
        }


def _parity_fn(feeds):
    masks = [f["attention_mask"] for f in feeds]
    return lambda ref, cand: P.compare(ref, cand, masks[: len(ref)])


def _first_outputs(path: Path, feeds) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [session.run(None, f)[0] for f in feeds]


@pytest.mark.slow
def test_int8_meets_min_cosine_on_held_out_sentences(minilm, tmp_path):
    import onnx

    result = quantize_int8_accuracy_aware(
        minilm["fp32"],
        tmp_path / "int8.onnx",
        calibration_feeds=minilm["cal"],
        reference_outputs=minilm["cal_ref"],
        parity_fn=_parity_fn(minilm["cal"]),
        min_cosine=0.995,
    )
    assert result.path.is_file() and result.parity["min_cosine"] >= 0.995
    held = P.compare(
        minilm["held_ref"], _first_outputs(result.path, minilm["held"]), [f["attention_mask"] for f in minilm["held"]]
    )
    assert held["min_cosine"] >= 0.995, held  # sentences the calibration never saw
    ops = [n.op_type for n in onnx.load(str(result.path)).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 36 - len(result.excluded_nodes) > 18
    assert result.latency_ms["int8"] > 0 and result.latency_ms["fp32"] > 0
    assert result.steps[0]["excluded"] == 0


@pytest.mark.slow
def test_tighter_threshold_keeps_the_most_damaging_nodes_in_fp32(minilm, tmp_path):
    result = quantize_int8_accuracy_aware(
        minilm["fp32"],
        tmp_path / "int8.onnx",
        calibration_feeds=minilm["cal"],
        reference_outputs=minilm["cal_ref"],
        parity_fn=_parity_fn(minilm["cal"]),
        min_cosine=0.998,
    )
    first = result.steps[0]["parity"]["min_cosine"]
    if first >= 0.998:
        pytest.skip(f"all-INT8 already reaches 0.998 here ({first:.5f}); nothing to exclude")
    assert result.excluded_nodes and result.parity["min_cosine"] >= 0.998
    sensitivity = next(s["sensitivity"] for s in result.steps if "sensitivity" in s)
    assert set(result.excluded_nodes) <= set(sensitivity)


@pytest.mark.slow
def test_unreachable_threshold_raises_parity_error(minilm, tmp_path):
    with pytest.raises(ParityError, match="cannot reach min cosine 0.99999"):
        quantize_int8_accuracy_aware(
            minilm["fp32"],
            tmp_path / "int8.onnx",
            calibration_feeds=minilm["cal"],
            reference_outputs=minilm["cal_ref"],
            parity_fn=_parity_fn(minilm["cal"]),
            min_cosine=0.99999,
            max_excluded_fraction=0.1,
        )
    assert not (tmp_path / "int8.onnx").exists()


@pytest.mark.slow
def test_transformer_fusion_fires_and_the_fused_graph_quantizes(minilm, tmp_path):
    path, report = optimize_transformer(
        minilm["fp32"], tmp_path / "fused.onnx", model_type="bert", num_heads=12, hidden_size=384
    )
    assert report["applied"] and report["fused"]["Attention"] == 6
    assert report["fused"]["SkipLayerNormalization"] == 12 and report["fused"].get("BiasGelu") == 6
    fused = P.compare(
        minilm["held_ref"], _first_outputs(path, minilm["held"]), [f["attention_mask"] for f in minilm["held"]]
    )
    assert fused["min_cosine"] > 0.99999
    # the fused graph quantizes too (Attention -> QAttention), still within the threshold on held-out text
    result = quantize_int8_accuracy_aware(
        path,
        tmp_path / "int8.onnx",
        calibration_feeds=minilm["cal"],
        reference_outputs=minilm["cal_ref"],
        parity_fn=_parity_fn(minilm["cal"]),
        min_cosine=0.995,
    )
    import onnx

    ops = [n.op_type for n in onnx.load(str(result.path)).graph.node]
    assert ops.count("QAttention") + len([n for n in result.excluded_nodes if "Attention" in n]) == 6
    held = P.compare(
        minilm["held_ref"], _first_outputs(result.path, minilm["held"]), [f["attention_mask"] for f in minilm["held"]]
    )
    assert held["min_cosine"] >= 0.995, held


def _tiny_matmul_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4])],
        initializer=[w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def test_fusion_on_a_non_transformer_copies_the_model_with_a_reason(tmp_path):
    src = _tiny_matmul_model(tmp_path / "tiny.onnx")
    path, report = optimize_transformer(src, tmp_path / "out.onnx", model_type="bert", num_heads=2, hidden_size=8)
    assert not report["applied"] and "no bert fusion" in report["reason"]
    assert path.read_bytes() == src.read_bytes()


def test_tiny_model_int8_matches_fp32_and_bad_inputs_are_one_line_errors(tmp_path):
    src = _tiny_matmul_model(tmp_path / "tiny.onnx")
    feeds = [{"x": np.random.default_rng(i).normal(size=(1, 3, 8)).astype(np.float32)} for i in range(4)]
    refs = _first_outputs(src, feeds)
    result = quantize_int8_accuracy_aware(
        src, tmp_path / "q.onnx", calibration_feeds=feeds, reference_outputs=refs, parity_fn=P.compare, min_cosine=0.99
    )
    assert result.parity["min_cosine"] >= 0.99 and result.excluded_nodes == []
    common = {"reference_outputs": refs, "parity_fn": P.compare}
    with pytest.raises(ModelError, match="not found"):
        quantize_int8_accuracy_aware(tmp_path / "missing.onnx", tmp_path / "x.onnx", calibration_feeds=feeds, **common)
    with pytest.raises(InputError, match="one reference output per calibration feed"):
        quantize_int8_accuracy_aware(src, tmp_path / "x.onnx", calibration_feeds=feeds[:2], **common)
    with pytest.raises(InputError, match="lacks model input"):
        quantize_int8_accuracy_aware(
            src, tmp_path / "x.onnx", calibration_feeds=[{"z": f["x"]} for f in feeds], **common
        )
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(ModelError, match="cannot parse"):
        quantize_int8_accuracy_aware(tmp_path / "junk.onnx", tmp_path / "x.onnx", calibration_feeds=feeds, **common)
