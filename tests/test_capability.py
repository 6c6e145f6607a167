# SPDX-License-Identifier: Apache-2.0
"""Capability checker on real ONNX exports (CNN, LSTM, BERT): per-op support, placement, partitions per
profile, precision report, bad input. CUDA EP cannot load on these hosts: its column must say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_capability_models as models
import yaml

from edgesdk.capability import check_capability, precision_report, render_table, tables
from edgesdk.errors import ModelError
from edgesdk.profiles import resolve_profile


@pytest.fixture(scope="session")
def capability_models(tmp_path_factory) -> dict[str, Path]:
    return models.build_all(tmp_path_factory)


@pytest.fixture(scope="module")
def jetpack5_profile(tmp_path_factory) -> Path:
    """AGX Orin on JetPack 5.1 (L4T 35, TensorRT 8.5.2): same board, older TensorRT (docs/devices.md)."""
    data = yaml.safe_load(resolve_profile("orin-agx-64gb").path.read_text())
    data["name"] = "orin-agx-64gb-jp5"
    data["aliases"] = []
    data["software"] = {
        "jetpack": "5.1",
        "l4t": "35.3",
        "cuda": "11.4",
        "tensorrt": "8.5",
        "source": "docs/devices.md: JetPack 5.1 = L4T 35, CUDA 11.4, TensorRT 8.5.2",
    }
    path = tmp_path_factory.mktemp("profiles") / "orin-jp5.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _placed(report) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in report.nodes:
        out[n.placement] = out.get(n.placement, 0) + 1
    return out


def _by_op(report, op: str):
    return [n for n in report.nodes if n.op_type == op]


def test_cnn_on_orin_agx_splits_dla_and_gpu(capability_models):
    report = check_capability(capability_models["cnn"], resolve_profile("orin-agx-64gb"), "fp16")
    assert report.chain == ["dla", "tensorrt", "cuda_ep", "cpu"]
    assert {n.placement for n in _by_op(report, "Conv")} == {"dla"}
    pool = _by_op(report, "GlobalAveragePool")[0]
    assert pool.placement == "tensorrt" and "not DLA-native" in pool.support["dla"].reason
    # Conv/ReLU/MaxPool on DLA, pool+flatten on the GPU, the classifier Gemm back on DLA.
    assert [p.backend for p in report.partitions] == ["dla", "tensorrt", "dla"]
    summary = report.to_dict()["summary"]
    assert summary["boundary_crossings_by_backend"] == {"dla->tensorrt": 1, "tensorrt->dla": 1}


def test_cnn_without_dla_is_one_tensorrt_partition(capability_models):
    for name in ("orin-nano-8gb", "a10", "h200"):
        report = check_capability(capability_models["cnn"], resolve_profile(name), "fp16")
        assert "dla" not in report.chain
        assert [p.backend for p in report.partitions] == ["tensorrt"], name


def test_dla_needs_fp16_or_int8(capability_models):
    report = check_capability(capability_models["cnn"], resolve_profile("orin-agx-64gb"), "fp32")
    conv = _by_op(report, "Conv")[0]
    assert conv.support["dla"].status == "no" and conv.support["dla"].category == "precision"
    assert all(n.placement == "tensorrt" for n in report.nodes)


def test_cpu_profile_runs_everything_on_cpu_ep(capability_models):
    report = check_capability(capability_models["lstm"], resolve_profile("cpu-x86_64"))
    assert report.chain == ["cpu"]
    assert set(_placed(report)) <= {"cpu", "folded"}
    assert all(n.support["tensorrt"].status == "n/a" for n in report.nodes)


def test_lstm_dynamic_shapes_keep_it_off_the_dla(capability_models):
    report = check_capability(capability_models["lstm"], resolve_profile("orin-agx-64gb"), "fp16")
    assert set(report.dynamic_inputs) == {"x"}
    lstm = _by_op(report, "LSTM")[0]
    assert lstm.placement == "tensorrt"
    assert lstm.support["dla"].status == "no"
    assert [p.backend for p in report.partitions] == ["tensorrt"]
    gemm = _by_op(report, "Gemm")[0]
    assert gemm.support["dla"].category == "dynamic-shape"


def test_lstm_layout_attribute_limit(capability_models):
    report = check_capability(capability_models["lstm_layout1"], resolve_profile("a10"), "fp16")
    lstm = _by_op(report, "LSTM")[0]
    assert lstm.support["tensorrt"].status == "no"
    assert lstm.support["tensorrt"].category == "attribute" and "layout" in lstm.support["tensorrt"].reason
    # ONNX Runtime's CPU LSTM kernel refuses layout=1 too (found by the probe, not a table): nothing runs it.
    assert lstm.support["cpu"].status == "no" and "layout == 1" in lstm.support["cpu"].reason
    cuda_checkable = lstm.support["cuda_ep"].status != "unknown"
    assert lstm.placement == ("none" if cuda_checkable else "unknown")


def test_bert_on_tensorrt_10_is_one_partition(capability_models):
    report = check_capability(capability_models["bert"], resolve_profile("orin-agx-64gb"), "fp16")
    placed = _placed(report)
    assert set(placed) == {"tensorrt", "folded"}
    assert [p.backend for p in report.partitions] == ["tensorrt"]
    ln = _by_op(report, "LayerNormalization")[0]
    assert ln.support["tensorrt"].status == "yes"
    assert any("dynamic shape" in n.support["dla"].reason for n in _by_op(report, "MatMul"))


def test_bert_on_tensorrt_8_5_loses_layernorm(capability_models, jetpack5_profile):
    """TensorRT 8.5's parser has no LayerNormalization (added in 8.6): those nodes leave the engine."""
    report = check_capability(capability_models["bert"], resolve_profile(jetpack5_profile), "fp16")
    assert report.tensorrt_version == "8.5"
    for ln in _by_op(report, "LayerNormalization"):
        assert ln.support["tensorrt"].status == "no"
        assert "first documented in 8.6" in ln.support["tensorrt"].reason
        assert ln.placement == "cpu"  # CUDA EP unknown here, CPU EP probed yes
    trt_parts = [p for p in report.partitions if p.backend == "tensorrt"]
    assert len(trt_parts) >= 5  # 5 LayerNorms cut the TensorRT region apart
    prec = precision_report(capability_models["bert"], resolve_profile(jetpack5_profile), "fp16")
    kept = {r["op_type"]: r for r in prec["kept_higher_precision"]}
    assert kept["LayerNormalization"]["runs_in"] == "fp32"
    assert prec["float_partition_crossings"] >= 10
    assert any("cross between partitions" in line for line in prec["explanation"])


def test_int8_precision_report_names_ops_kept_in_fp16(capability_models):
    prec = precision_report(capability_models["bert"], resolve_profile("orin-agx-64gb"), "int8")
    kept = {r["op_type"]: r for r in prec["kept_higher_precision"]}
    assert {"Softmax", "LayerNormalization", "Erf"} <= set(kept)
    assert all(r["runs_in"] == "fp16" for r in kept.values())
    assert prec["by_precision"]["int8"] == 16 + 1  # the 16 MatMuls and the pooler Gemm (Q/DQ-fusible layers)
    assert prec["precision_conversions"] > 0
    assert prec["explanation"][0].startswith("INT8 plan on orin-agx-64gb")


def test_op_no_backend_supports(capability_models):
    report = check_capability(capability_models["custom"], resolve_profile("orin-agx-64gb"), "fp16")
    mystery = _by_op(report, "Mystery")[0]
    assert mystery.placement == "none"
    assert "plugin" in mystery.support["tensorrt"].reason
    assert mystery.support["cpu"].status == "no"
    assert report.to_dict()["summary"]["unsupported_everywhere"] == ["Mystery"]
    assert "NO BACKEND runs: Mystery" in render_table(report)


def test_cuda_ep_column_says_why_it_is_unknown_here(capability_models):
    from edgesdk.capability.ort_probe import provider_usable

    usable, _ = provider_usable("CUDAExecutionProvider")
    if usable:
        pytest.skip("CUDA EP works on this host: the column is probed for real")
    report = check_capability(capability_models["cnn"], resolve_profile("a10"), "fp16")
    assert {n.support["cuda_ep"].status for n in report.nodes} == {"unknown"}
    assert any("CUDA EP column not checkable here" in note for note in report.notes)


def test_corrupt_and_missing_models_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a protobuf" * 50)
    with pytest.raises(ModelError, match="not a readable ONNX model|no nodes"):
        check_capability(bad, resolve_profile("orin"))
    with pytest.raises(ModelError, match="not found"):
        check_capability(tmp_path / "missing.onnx", resolve_profile("orin"))


@pytest.mark.slow
def test_cli_table_json_and_strict(capability_models, run_cli):
    res = run_cli("inspect", "capability", capability_models["cnn"], "--profile", "orin-agx-64gb")
    assert res.returncode == 0, res.stderr
    assert "partitions (3):" in res.stdout and "DLA" in res.stdout
    res = run_cli("inspect", "capability", capability_models["bert"], "-p", "a10", "--json", "--precision", "int8")
    data = json.loads(res.stdout)
    assert data["summary"]["partitions"] == {"tensorrt": 1}
    assert data["precision_report"]["precision"] == "int8"
    res = run_cli("inspect", "capability", capability_models["custom"], "-p", "orin", "--strict")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("error: no backend")
    res = run_cli("inspect", "capability", "/nonexistent.onnx", "-p", "orin")
    assert res.returncode == 3 and "Traceback" not in res.stderr


def test_data_files_carry_sources_and_versions():
    trt = tables.tensorrt_table()
    assert trt["ops"]["LayerNormalization"]["since"] == "8.6"
    assert tables.tensorrt_op("LayerNormalization", "8.5").supported is False
    assert tables.tensorrt_op("LayerNormalization", "10.3").supported is True
    # `axes` of Slice had to be constant before 10.3, not after (onnx-tensorrt changelog 10.3).
    assert [c["kind"] for c in tables.tensorrt_op("Slice", "8.6").checks] == ["const_input"]
    assert tables.tensorrt_op("Slice", "10.3").checks == ()
    assert tables.dla_available("10.3")[0] and not tables.dla_available("10.13")[0]
    native, which = tables.dla_native_ops("10.3")
    assert "Conv" in native and "Div" not in native and "8.6" in which
    for name in ("tensorrt_onnx_ops.yaml", "dla.yaml", "kernels.yaml"):
        text = (tables.DATA_DIR / name).read_text()
        assert text.startswith("# SPDX-License-Identifier: Apache-2.0")
        assert "sources:" in text


def test_integer_matmul_is_a_precision_limit(tmp_path):
    """TensorRT documents MatMul for float types only; ONNX Runtime's CPU EP has an INT32 MatMul."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "imm",
        [
            helper.make_tensor_value_info("a", TensorProto.INT32, [2, 3]),
            helper.make_tensor_value_info("b", TensorProto.INT32, [3, 4]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "imm.onnx"
    onnx.save(model, str(path))
    node = check_capability(path, resolve_profile("a10"), "fp16").nodes[0]
    assert node.support["tensorrt"].status == "no" and node.support["tensorrt"].category == "precision"
    assert "input is INT32" in node.support["tensorrt"].reason
    assert node.support["cpu"].status == "yes"
