# SPDX-License-Identifier: Apache-2.0
"""End-to-end ONNX builds of the real MiniLM model, and the bad-input contract of `edgesdk build`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.build import build
from edgesdk.errors import ParityError
from edgesdk.plan import BuildOptions


def test_orin_bundle_manifest(minilm_orin_bundle):
    m = json.loads((minilm_orin_bundle / "manifest.json").read_text())
    assert m["format"] == "onnx" and m["precision"] == "fp16"
    assert m["profile"]["name"] == "orin-agx-64gb"
    p = m["parity"]["fp16"]
    assert p["passed"] and p["min_cosine"] >= 0.999 and p["reference"] == "pytorch"
    roles = {a["role"] for a in m["artifacts"]}
    assert {"model", "tokenizer"} <= roles
    assert all(len(a["sha256"]) == 64 for a in m["artifacts"])
    assert m["model"]["source_sha256"] and any(k.startswith("onnxruntime") for k in m["tools"])
    assert [d["key"] for d in m["plan"]["decisions"]][:3] == ["profile", "format", "precision"]
    assert set(m["build"]["stage_s"]) >= {"export", "optimize", "quantize", "verify", "license_gate"}


@pytest.mark.slow
def test_impossible_parity_fails_and_leaves_nothing(minilm_dir, tmp_path, monkeypatch):
    import edgesdk.plan as plan_mod

    monkeypatch.setitem(plan_mod.DEFAULT_PARITY, "fp32", {"min_cosine": 1.01, "max_abs": None})
    out = tmp_path / "never"
    with pytest.raises(ParityError, match="min cosine"):
        build(
            minilm_dir,
            "cpu-x86_64",
            out,
            BuildOptions(precision="fp32", progress=False, parity_samples=4, calibration_samples=2),
        )
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [], "staging directory left behind"


def test_onnx_input_taken_as_is_and_shape_errors(minilm_orin_bundle, tmp_path):
    import onnx

    import edgesdk
    from edgesdk.errors import ShapeError

    src = tmp_path / "plain.onnx"
    src.write_bytes((minilm_orin_bundle / "model.onnx").read_bytes())
    # The build stamped the card's license into the ONNX: a bare .onnx input still carries it.
    assert {p.key: p.value for p in onnx.load(str(src)).metadata_props}.get("license") == "apache-2.0"
    out = build(
        src,
        "cpu",
        tmp_path / "b",
        BuildOptions(precision="fp32", progress=False, parity_samples=4, calibration_samples=2),
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["parity"]["fp32"]["reference"] == "onnx-fp32" and m["parity"]["fp32"]["passed"]
    s = edgesdk.load(out)
    ids = np.ones((1, 8), dtype=np.int64)
    res = s.run({"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})
    assert next(iter(res.values())).shape == (1, 8, 384)
    with pytest.raises(ShapeError, match="missing"):
        s.run({"input_ids": ids})
    with pytest.raises(ShapeError, match="rank"):
        s.run({"input_ids": ids[0], "attention_mask": ids, "token_type_ids": ids})
    with pytest.raises(ShapeError, match="dtype"):
        s.run({"input_ids": ids.astype(np.float32) + 0.5, "attention_mask": ids, "token_type_ids": ids})


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["build", "{minilm}", "--profile", "orin-nanoo", "-o", "{tmp}/x"], 3, "unknown device profile"),
        (["build", "{tmp}/missing", "--profile", "orin", "-o", "{tmp}/x"], 3, "model not found"),
        (["build", "{tmp}/corrupt.onnx", "--profile", "cpu", "-o", "{tmp}/x"], 3, "not a valid ONNX model"),
        (["build", "{tmp}/pickled", "--profile", "cpu", "-o", "{tmp}/x"], 3, "only pickle weights"),
        (["build", "{minilm}", "--profile", "cpu", "-o", "{tmp}/exists"], 4, "output directory exists"),
        (["build", "{minilm}", "--profile", "{tmp}/bad.yaml", "-o", "{tmp}/x"], 3, "invalid profile"),
    ],
)
def test_cli_bad_input_is_one_line_with_exit_code(run_cli, minilm_dir, tmp_path, args, code, needle):
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 50)
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text((minilm_dir / "config.json").read_text())
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04")
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "precious.txt").write_text("keep me")
    (tmp_path / "bad.yaml").write_text("schema_version: 1\nname: 5\n")
    argv = [a.format(minilm=minilm_dir, tmp=tmp_path) for a in args]
    res = run_cli(*argv, "--no-progress")
    assert res.returncode == code, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not (tmp_path / "x").exists()
    assert (tmp_path / "exists" / "precious.txt").read_text() == "keep me"


def test_debug_flag_shows_traceback(run_cli, tmp_path):
    res = run_cli("--debug", "build", str(tmp_path / "missing"), "--profile", "orin", "-o", str(tmp_path / "x"))
    assert res.returncode != 0 and "Traceback" in res.stderr


@pytest.mark.slow
def test_parity_miss_falls_back_to_next_precision_when_asked(minilm_dir, tmp_path, monkeypatch):
    import edgesdk.plan as plan_mod
    from edgesdk.formats.onnx.plan import next_precision

    assert next_precision("int8", ["int8", "fp32"]) == "fp32"
    assert next_precision("int8", ["fp16", "int8", "fp32"]) == "fp16"
    assert next_precision("fp32", ["fp32"]) is None
    monkeypatch.setitem(plan_mod.DEFAULT_PARITY, "fp16", {"min_cosine": 1.01, "max_abs": None})
    out = build(
        minilm_dir,
        "orin-nx-16gb",
        tmp_path / "fb",
        BuildOptions(on_parity_fail="fallback", progress=False, parity_samples=4, calibration_samples=2),
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"] == "fp32" and m["plan"]["precision"] == "fp32"
    assert not m["parity"]["fp16"]["passed"] and m["parity"]["fp32"]["passed"]
    assert m["fallbacks"] == [{"from": "fp16", "to": "fp32", "reason": m["fallbacks"][0]["reason"], "stage": "verify"}]
    assert "min cosine" in m["fallbacks"][0]["reason"]
