# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

import pytest

from edgesdk.errors import ModelError
from edgesdk.plan import BuildOptions, inspect_model, plan_build
from edgesdk.profiles import resolve_profile


def test_minilm_facts(minilm_dir):
    facts = inspect_model(minilm_dir)
    assert facts.kind == "hf" and facts.task == "feature-extraction" and facts.family == "bert"
    # all-MiniLM-L6-v2 has ~22.7M parameters (safetensors header count, no tensor data read).
    assert 22_000_000 < facts.params < 23_500_000


def test_plan_gpu_profile_is_fp16_and_every_decision_has_a_reason(minilm_dir):
    facts = inspect_model(minilm_dir)
    plan = plan_build(facts, resolve_profile("orin"), BuildOptions())
    assert plan.format == "onnx" and plan.precision == "fp16"
    assert plan.ep_chain[-1] == "CPUExecutionProvider"
    assert all(d.reason for d in plan.decisions)
    text = plan.explain()
    assert "alias 'orin' resolves to orin-agx-64gb" in text
    assert plan.to_dict()["decisions"][0]["key"] == "profile"


def test_plan_cpu_profile_is_int8_with_threshold(minilm_dir):
    plan = plan_build(inspect_model(minilm_dir), resolve_profile("cpu-x86_64"), BuildOptions())
    assert plan.precision == "int8" and plan.parity["min_cosine"] == 0.995
    assert plan.ep_chain == ["CPUExecutionProvider"]


def test_plan_is_pure(minilm_dir):
    facts = inspect_model(minilm_dir)
    prof = resolve_profile("l4")
    assert plan_build(facts, prof).to_dict() == plan_build(facts, prof).to_dict()


def test_pickle_only_dir_is_refused_unless_allowed(tmp_path, minilm_dir):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text((minilm_dir / "config.json").read_text())
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ModelError, match="only pickle weights"):
        inspect_model(d)
    assert inspect_model(d, BuildOptions(allow_pickle=True)).extra["pickle_weights"] is True


def test_remote_code_refused_by_default(tmp_path, minilm_dir):
    import json

    d = tmp_path / "custom"
    d.mkdir()
    cfg = json.loads((minilm_dir / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_x.XModel"}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError):
        inspect_model(d)


def test_missing_and_unknown_sources(tmp_path):
    with pytest.raises(ModelError, match="model not found"):
        inspect_model(tmp_path / "nope")
    f = tmp_path / "weights.pt"
    f.write_bytes(b"x")
    with pytest.raises(ModelError, match="pickle"):
        inspect_model(f)
    g = tmp_path / "model.onnx"
    g.write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        inspect_model(g)
