# SPDX-License-Identifier: Apache-2.0
"""`run --output/--json` outputs, `build --name`, and TensorRT shape profiles (`--shapes`, image defaults,
`--seq-len`), all through the real `edgesdk` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

D = 8


def make_two_output_bundle(out: Path) -> Path:
    """A real ONNX graph with two outputs (y = relu(x W), s = sum over the last axis), written as a bundle."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.bundle import artifact_entry, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((D, D)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", D])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 1])
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=1),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "two", [x], [y, s], [w, axes]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, out / "model.onnx")
    write_manifest(
        out,
        {
            "bundle_id": "two-out",
            "model": {"name": "two-out", "task": "other"},
            "profile": {"name": "cpu-x86_64"},
            "format": "onnx",
            "precision": "fp32",
            "artifacts": [artifact_entry(out, "model.onnx", "model")],
            "runtime": {"backend_chain": ["CPUExecutionProvider"]},
        },
    )
    return out


def make_dynamic_cnn(path: Path, config: dict | None = None) -> Path:
    """A Conv classifier exported with every dim of pixel_values dynamic (as optimum exports a ResNet)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path.parent.mkdir(parents=True, exist_ok=True)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", "num_channels", "height", "width"])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Conv", ["pixel_values", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["logits"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "cnn", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    if config is not None:
        (path.parent / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def two_out(tmp_path_factory) -> Path:
    return make_two_output_bundle(tmp_path_factory.mktemp("two") / "bundle")


@pytest.fixture
def x_npz(tmp_path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(1).standard_normal((3, D)).astype(np.float32)
    path = tmp_path / "x.npz"
    np.savez(path, x=x)
    return path, x


def _expected(bundle: Path, x: np.ndarray) -> dict:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip(("y", "s"), sess.run(["y", "s"], {"x": x})))


@pytest.mark.slow
def test_run_output_npz_npy_json_and_no_silent_overwrite(two_out, x_npz, tmp_path, run_cli):
    npz, x = x_npz
    want = _expected(two_out, x)
    out = tmp_path / "o" / "outs.npz"
    res = run_cli("run", two_out, "--inputs", npz, "--output", out)
    assert res.returncode == 0, res.stderr
    with np.load(out) as got:
        assert sorted(got.files) == ["s", "y"]
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5)
        np.testing.assert_allclose(got["s"], want["s"], rtol=1e-5)
    # exists: exit 4 and the file is untouched; --force overwrites
    before = out.read_bytes()
    res = run_cli("run", two_out, "--inputs", npz, "--output", out)
    assert res.returncode == 4 and "pass --force" in res.stderr and out.read_bytes() == before
    assert run_cli("run", two_out, "--inputs", npz, "--output", out, "--force").returncode == 0
    # .npy holds one array: two outputs is a usage mistake (exit 3), nothing written
    res = run_cli("run", two_out, "--inputs", npz, "--output", tmp_path / "o.npy")
    assert res.returncode == 3 and "use .npz or .json" in res.stderr and not (tmp_path / "o.npy").exists()
    # .json: every output as lists, same numbers
    res = run_cli("run", two_out, "--inputs", npz, "--output", tmp_path / "o.json")
    assert res.returncode == 0, res.stderr
    body = json.loads((tmp_path / "o.json").read_text())
    np.testing.assert_allclose(np.array(body["outputs"]["y"]["values"], dtype=np.float32), want["y"], rtol=1e-5)
    assert body["outputs"]["s"]["shape"] == [3, 1]
    # unknown suffix: exit 3 before loading anything
    assert run_cli("run", two_out, "--inputs", npz, "--output", tmp_path / "o.csv").returncode == 3


def test_run_json_carries_the_arrays_or_names_the_file(two_out, x_npz, tmp_path, run_cli):
    npz, x = x_npz
    want = _expected(two_out, x)
    res = run_cli("run", two_out, "--inputs", npz, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["outputs"]
    np.testing.assert_allclose(np.array(out["y"]["values"], dtype=np.float32), want["y"], rtol=1e-5)
    res = run_cli("run", two_out, "--inputs", npz, "--json", "--output", tmp_path / "f.npz")
    body = json.loads(res.stdout)
    assert body["output_file"] == str(tmp_path / "f.npz") and "values" not in body["outputs"]["y"]


@pytest.fixture(scope="module")
def named_minilm(minilm_dir, tmp_path_factory, run_cli_module) -> Path:
    """MiniLM built through the CLI from a directory called ``model``, with ``--name minilm-l6``."""
    out = tmp_path_factory.mktemp("named") / "bundle"
    res = run_cli_module(
        "build", minilm_dir, "--profile", "cpu", "--precision", "fp32", "-o", out, "--name", "minilm-l6"
    )
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def run_cli_module():
    import os
    import subprocess
    import sys

    def _run(*args, timeout=600):
        return subprocess.run(
            [sys.executable, "-m", "edgesdk", *map(str, args)],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=timeout,
        )

    return _run


@pytest.mark.slow
def test_build_name_names_spans_manifest_sbom(named_minilm, minilm_dir, tmp_path, run_cli):
    assert Path(minilm_dir).name == "model"  # the default name would be "model"
    manifest = json.loads((named_minilm / "manifest.json").read_text())
    assert manifest["model"]["name"] == "minilm-l6"
    sbom = json.loads((named_minilm / "sbom.cdx.json").read_text())
    assert sbom["metadata"]["component"]["name"] == "minilm-l6"
    assert "minilm-l6 model" in [c["name"] for c in sbom["components"]]
    trace = tmp_path / "t.jsonl"
    res = run_cli("run", named_minilm, "--input", "hello", "--json", "--trace-file", trace)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["report"]["model"] == "minilm-l6"
    assert '"embeddings minilm-l6"' in trace.read_text()
    assert run_cli("build", minilm_dir, "-p", "cpu", "--plan-only", "--name", "bad/name").returncode == 3


@pytest.mark.slow
def test_run_embeddings_output_and_json_vectors(named_minilm, tmp_path, run_cli):
    res = run_cli("run", named_minilm, "--input", "a cat", "--input", "a dog", "--json")
    vecs = np.array(json.loads(res.stdout)["embeddings"]["values"], dtype=np.float32)
    assert vecs.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    res = run_cli("run", named_minilm, "--input", "a cat", "--input", "a dog", "--output", tmp_path / "e.npy")
    assert res.returncode == 0, res.stderr
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), vecs, atol=1e-6)


# ------------------------------------------------------------------------------------ TensorRT shapes


def _plan(run_cli, *args) -> dict:
    res = run_cli("build", *args, "--plan-only", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _profiles(plan: dict):
    return next(d["value"] for d in plan["decisions"] if d["key"] == "tensorrt_optimization_profiles")


@pytest.mark.slow
def test_image_input_default_profile_keeps_chw_from_the_model(tmp_path, run_cli):
    cnn = make_dynamic_cnn(tmp_path / "a" / "model.onnx")
    prof = _profiles(_plan(run_cli, cnn, "-p", "orin-nx-16gb", "--format", "tensorrt"))
    assert prof == [{"pixel_values": {"min": [1, 3, 224, 224], "opt": [1, 3, 224, 224], "max": [8, 3, 224, 224]}}]
    cnn = make_dynamic_cnn(tmp_path / "b" / "model.onnx", config={"image_size": 160, "num_channels": 3})
    prof = _profiles(_plan(run_cli, cnn, "-p", "orin-nx-16gb", "--format", "tensorrt", "--max-batch", "4"))
    assert prof[0]["pixel_values"]["max"] == [4, 3, 160, 160]


@pytest.mark.slow
def test_shapes_flag_is_recorded_in_plan_and_refused_when_wrong(tmp_path, run_cli):
    cnn = make_dynamic_cnn(tmp_path / "model.onnx")
    spec = "pixel_values:1x3x224x224:4x3x224x224:8x3x224x224"
    plan = _plan(run_cli, cnn, "-p", "orin-nx-16gb", "--format", "tensorrt", "--shapes", spec)
    assert _profiles(plan) == [
        {"pixel_values": {"min": [1, 3, 224, 224], "opt": [4, 3, 224, 224], "max": [8, 3, 224, 224]}}
    ]
    key = next(d["value"] for d in plan["decisions"] if d["key"] == "engine_cache_key")
    assert key["profiles"] == _profiles(plan)
    for bad in (
        "pixel_values:1x3x224x224:4x3x224x224",
        "nope:1:1:1",
        "pixel_values:4x3x224x224:1x3x224x224:8x3x224x224",
        "pixel_values:1x3x224:4x3x224x224:8x3x224x224",
        "pixel_values:1x3xAx224:4x3x224x224:8x3x224x224",
    ):
        res = run_cli("build", cnn, "-p", "orin-nx-16gb", "--format", "tensorrt", "--plan-only", "--shapes", bad)
        assert res.returncode == 3, (bad, res.stderr)
        assert res.stderr.count("\n") == 1 and "--shapes" in res.stderr
    res = run_cli("build", cnn, "-p", "cpu", "--plan-only", "--shapes", spec)  # an ONNX plan has no TRT profiles
    assert res.returncode == 3 and "--format tensorrt" in res.stderr


def test_seq_len_flags_shape_text_profiles(minilm_dir, run_cli):
    plan = _plan(run_cli, minilm_dir, "-p", "orin", "--format", "tensorrt", "--seq-len", "64", "--max-seq-len", "256")
    ids = _profiles(plan)[0]["input_ids"]
    assert ids == {"min": [1, 1], "opt": [1, 64], "max": [8, 256]}


@pytest.mark.slow
def test_shapes_reach_the_engine_config_and_engine_show(tmp_path, run_cli):
    cnn = make_dynamic_cnn(tmp_path / "src" / "model.onnx")
    out = tmp_path / "cnn-trt"
    res = run_cli(
        "build",
        cnn,
        "-p",
        "orin-nx-16gb",
        "--format",
        "tensorrt",
        "-o",
        out,
        "--model-license",
        "Apache-2.0",
        "--shapes",
        "pixel_values:1x3x224x224:4x3x224x224:8x3x224x224",
    )
    assert res.returncode == 0, res.stderr
    config = json.loads((out / "tensorrt" / "engine_config.json").read_text())
    assert config["optimization_profiles"][0]["pixel_values"]["opt"] == [4, 3, 224, 224]
    assert "--optShapes=pixel_values:4x3x224x224" in config["trtexec"]
    shown = run_cli("engine", "show", out)
    assert shown.returncode == 0, shown.stderr
    assert "pixel_values  1x3x224x224  4x3x224x224  8x3x224x224" in shown.stdout
    assert "trtexec equivalent: trtexec" in shown.stdout
    as_json = json.loads(run_cli("engine", "show", out, "--json").stdout)
    assert as_json["config"]["optimization_profiles"] == config["optimization_profiles"]
