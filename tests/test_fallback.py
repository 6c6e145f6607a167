# SPDX-License-Identifier: Apache-2.0
"""Fallback building blocks against the real ONNX Runtime and the real host: provider probing (listed is not
usable), per-node kernel probes, and host detection for pre-flight."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from edgesdk.capability.graph import load_graph  # noqa: E402
from edgesdk.capability.ort_probe import OrtProbe, provider_usable  # noqa: E402
from edgesdk.host import host_env  # noqa: E402


def _save(tmp_path, nodes, inputs, outputs, opsets=(("", 18),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 9
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return load_graph(path)


def test_listed_providers_are_probed_not_trusted():
    assert provider_usable("CPUExecutionProvider") == (True, "")
    for ep in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        ok, why = provider_usable(ep)
        if ep in ort.get_available_providers() and not ok:
            assert "libraries do not load here" in why or "failed to start" in why
        if ep not in ort.get_available_providers():
            assert not ok and "not in this onnxruntime build" in why
    assert provider_usable("NoSuchExecutionProvider")[0] is False


def test_cpu_kernel_probe_yes_no_and_custom_domain(tmp_path):
    view = _save(
        tmp_path,
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Col2Im", ["d", "s", "b"], ["c"]),
            helper.make_node("Mystery", ["a"], ["m"], domain="com.example"),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("d", TensorProto.DOUBLE, [1, 4, 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("b", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("m", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("c", TensorProto.DOUBLE, None),
        ],
        opsets=(("", 18), ("com.example", 1)),
    )
    probe = OrtProbe("CPUExecutionProvider")
    relu, col2im, mystery = (probe.check(n, view) for n in view.nodes)
    assert relu.status == "yes"
    # Col2Im exists on CPU only for float: ONNX Runtime itself answers NOT_IMPLEMENTED for double.
    assert col2im.status == "no" and "kernel" in col2im.reason
    assert mystery.status == "no" and "not a registered op" in mystery.reason


def test_unusable_provider_probe_answers_unknown_with_reason(tmp_path):
    ok, why = provider_usable("CUDAExecutionProvider")
    if ok:
        pytest.skip("CUDA EP loads on this host: its probe answers yes/no for real")
    view = _save(
        tmp_path,
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    result = OrtProbe("CUDAExecutionProvider").check(view.nodes[0], view)
    assert result.status == "unknown" and why in result.reason


def test_host_env_reports_evidence():
    env = host_env()
    assert set(env) >= {"tensorrt", "sm", "l4t", "trtexec", "evidence"}
    assert env["evidence"] and all(isinstance(e, str) for e in env["evidence"])
    if env["tensorrt"] is None:
        assert any("TensorRT Python API not importable" in e for e in env["evidence"])


def test_host_env_reads_a_jetson_tree(tmp_path):
    """A device-tree/L4T layout as JetPack 6.2 writes it: platform tegra234 -> sm_87, L4T 36.4.3."""
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc/device-tree/compatible").write_bytes(b"nvidia,p3737-0000+p3701-0005\0nvidia,tegra234\0")
    (tmp_path / "proc/device-tree/model").write_text("NVIDIA Jetson AGX Orin Developer Kit")
    (tmp_path / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 4.3, GCID: 1, BOARD: generic")
    env = host_env(str(tmp_path))
    assert (env["platform"], env["sm"], env["l4t"]) == ("tegra234", "8.7", "36.4.3")
