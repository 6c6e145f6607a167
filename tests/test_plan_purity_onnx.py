# SPDX-License-Identifier: Apache-2.0
"""The planner's purity for an ``.onnx`` source with ``--format tensorrt`` (issue 22 item 2): the graph's input
dims, the image inputs' channels, the sibling config's image size and the shape-inferred graph the capability
checks read (the DLA decision and the precision report) are facts read by ``inspect_model``
(``ModelFacts.graph``), so ``plan_build`` opens no file, loads no graph and starts no ONNX Runtime session (the
CUDA/CPU EP kernel probes run at build time, in the engine stage)."""

from __future__ import annotations

import builtins
import io
import json

import pytest

from edgesdk.host import HostFacts
from edgesdk.plan import BuildOptions, inspect_model, plan_build
from edgesdk.profiles import resolve_profile


@pytest.fixture
def conv_onnx(tmp_path):
    """A tiny image model: pixel_values [N, 3, H, W] (H/W dynamic) -> Conv -> y, with a preprocessor_config.json
    beside it that gives the image size."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["pixel_values", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 96, "width": 96}}))
    return path


def _refuse_io(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"plan_build opened a file or probed: {args[:1]}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(io, "open", refuse)
    monkeypatch.setattr("pathlib.Path.open", refuse)
    monkeypatch.setattr("pathlib.Path.read_text", refuse)
    monkeypatch.setattr("pathlib.Path.read_bytes", refuse)
    monkeypatch.setattr("edgesdk.host.probe", refuse)
    monkeypatch.setattr("onnx.load", refuse)
    monkeypatch.setattr("edgesdk.capability.graph.load_graph", refuse)
    monkeypatch.setattr("edgesdk.capability.checker.load_graph", refuse)
    monkeypatch.setattr("edgesdk.capability.checker.OrtProbe", refuse)
    monkeypatch.setattr("onnxruntime.InferenceSession", refuse)


def _plan(facts, profile, precision: str):
    prof = resolve_profile(profile) if isinstance(profile, str) else profile
    return plan_build(facts, prof, BuildOptions(format="tensorrt", precision=precision), HostFacts()).to_dict()


def test_graph_facts_come_from_inspect(conv_onnx):
    facts = inspect_model(conv_onnx)
    capability = facts.graph.pop("capability")
    assert facts.graph == {
        "input_dims": {"pixel_values": ["N", 3, "H", "W"]},
        "conv_channels": {"pixel_values": 3},
        "sibling_config": {"file": "preprocessor_config.json", "config": {"size": {"height": 96, "width": 96}}},
    }
    assert [(n["op_type"], n["input"], n["output"]) for n in capability["nodes"]] == [
        ("Conv", ["pixel_values", "W"], ["y"])
    ]
    assert capability["constants"] == ["W"] and capability["inputs"] == ["pixel_values"]
    assert capability["shape"]["pixel_values"] == ["N", 3, "H", "W"]
    assert json.loads(json.dumps(capability)) == capability  # plain data
    facts.graph["capability"] = capability
    assert "graph" not in facts.to_dict()  # not part of the plan's JSON (bundles unchanged)
    plan = _plan(facts, "h200", "fp32")
    profiles = next(d["value"] for d in plan["decisions"] if d["key"] == "tensorrt_optimization_profiles")
    assert profiles[0]["pixel_values"]["opt"] == [1, 3, 96, 96]  # C from the Conv, H/W from the sibling config


def test_onnx_source_tensorrt_plan_reads_no_file(conv_onnx, monkeypatch):
    facts, h200 = inspect_model(conv_onnx), resolve_profile("h200")
    expected = _plan(facts, h200, "fp32")
    _refuse_io(monkeypatch)
    assert _plan(facts, h200, "fp32") == expected


@pytest.mark.parametrize("profile,precision", [("h200", "fp16"), ("orin", "fp16"), ("orin", "int8")])
def test_onnx_source_tensorrt_plan_with_probes_reads_no_file(conv_onnx, monkeypatch, profile, precision):
    facts, prof = inspect_model(conv_onnx), resolve_profile(profile)
    expected = _plan(facts, prof, precision)
    assert any(d["key"] == "precision_report" for d in expected["decisions"])
    _refuse_io(monkeypatch)
    assert _plan(facts, prof, precision) == expected


def test_planned_capability_matches_the_probed_report_where_tensorrt_takes_every_node(conv_onnx):
    """The planner's report (tables only, from facts) and the build's (this host's ONNX Runtime probed) agree
    whenever TensorRT or the DLA takes every node: the probes only place nodes they leave."""
    from edgesdk.capability import check_capability, precision_report_from
    from edgesdk.capability.checker import check_view
    from edgesdk.capability.graph import GraphView

    facts = inspect_model(conv_onnx)
    for profile, dla in (("h200", None), ("orin", True)):
        prof = resolve_profile(profile)
        planned = check_view(GraphView.from_facts(facts.graph["capability"]), prof, "fp16", use_dla=dla, probe=False)
        probed = check_capability(conv_onnx, prof, "fp16", use_dla=dla)
        assert [n.placement for n in planned.nodes] == [n.placement for n in probed.nodes]
        assert precision_report_from(planned) == precision_report_from(probed)


def test_planned_placement_of_nodes_tensorrt_leaves(tmp_path):
    """Without the probes a node TensorRT leaves is "unknown" in the plan (the build's report places it on the
    CUDA/CPU EP), except an op of a domain ONNX Runtime has no ops in: no backend runs it, as probed."""
    import onnx
    from onnx import TensorProto, helper

    from edgesdk.capability import check_capability
    from edgesdk.capability.checker import check_view
    from edgesdk.capability.graph import GraphView

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"]),
            helper.make_node("Mystery", ["a"], ["b"], domain="com.example"),
            helper.make_node("Det", ["b"], ["y"]),
        ],
        "g",  # Det: not in TensorRT's parser
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 9
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    prof = resolve_profile("h200")
    planned = check_view(GraphView.from_facts(inspect_model(path).graph["capability"]), prof, "fp16", probe=False)
    probed = check_capability(path, prof, "fp16")
    assert [n.placement for n in planned.nodes] == ["tensorrt", "none", "unknown"]
    assert [n.placement for n in probed.nodes][:2] == ["tensorrt", "none"]
