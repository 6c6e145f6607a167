# SPDX-License-Identifier: Apache-2.0
"""TensorRT path: planning, the deferred engine build up to the point TensorRT is needed, pre-flight,
engine cache, and the runtime fallback chain exercised for real with ONNX Runtime on this CPU.

TensorRT cannot be installed on these machines (docs/versions.md): tests that need it carry the ``tensorrt``
marker and skip with that reason. Nothing here imitates TensorRT.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_capability_models as models

from edgesdk.errors import BundleIntegrityError, ExternalToolError, InputError
from edgesdk.formats.tensorrt import engine as E
from edgesdk.formats.tensorrt.engine import preflight
from edgesdk.formats.tensorrt.plan import plan_tensorrt
from edgesdk.host import host_env, tensorrt_python
from edgesdk.plan import BuildOptions, inspect_model
from edgesdk.profiles import resolve_profile

TRT_VERSION, TRT_WHY = tensorrt_python()
needs_tensorrt = pytest.mark.skipif(
    TRT_VERSION is None,
    reason=f"needs a real TensorRT: {TRT_WHY} (not installable on these machines, docs/versions.md)",
)


@pytest.fixture(scope="session")
def capability_models(tmp_path_factory) -> dict[str, Path]:
    return models.build_all(tmp_path_factory)


def _plan(source, profile, **opts) -> dict:
    facts = inspect_model(str(source))
    decisions = plan_tensorrt(facts, resolve_profile(profile), BuildOptions(**opts))
    return {d.key: d for d in decisions}


def test_plan_on_cpu_profile_or_dla_without_dla_is_an_input_error(capability_models):
    with pytest.raises(InputError, match="needs an NVIDIA GPU profile"):
        _plan(capability_models["cnn"], "cpu-x86_64")
    with pytest.raises(InputError, match="has no DLA"):
        _plan(capability_models["cnn"], "orin-nano-8gb", dla=True)
    with pytest.raises(InputError, match="has no DLA"):
        _plan(capability_models["cnn"], "a10", dla=True)
    with pytest.raises(InputError, match="FP16/INT8 only"):
        _plan(capability_models["cnn"], "orin-agx-64gb", dla=True, precision="fp32")


def test_plan_chooses_dla_only_when_the_model_suits_it(capability_models):
    plan = _plan(capability_models["dla_cnn"], "orin-agx-64gb")
    assert plan["dla"].value == {"core": 0, "gpu_fallback": True}
    assert "DLA-native with static shapes" in plan["dla"].reason
    plan = _plan(capability_models["cnn"], "orin-agx-64gb")  # pool+flatten off-DLA: 6/8 < 80 %
    assert plan["dla"].value is None and "DLA-native" in plan["dla"].reason
    plan = _plan(capability_models["lstm"], "orin-nx-16gb")
    assert plan["dla"].value is None and "static shapes" in plan["dla"].reason
    assert _plan(capability_models["dla_cnn"], "orin-agx-64gb", dla=False).get("dla") is None


def test_plan_flags_profiles_and_cache_key(capability_models):
    plan = _plan(capability_models["lstm"], "orin-nx-16gb", precision="int8")
    assert plan["tensorrt_precision_flags"].value == ["int8", "fp16"]
    (prof,) = plan["tensorrt_optimization_profiles"].value
    assert prof["x"] == {"min": [1, 1, 8], "opt": [1, 128, 8], "max": [8, 512, 8]}
    key = plan["engine_cache_key"].value
    assert key["sm"] == "8.7" and key["tensorrt"] == "10.3" and key["l4t"] == "36.4" and key["precision"] == "int8"
    other = _plan(capability_models["lstm"], "a10", precision="int8")["engine_cache_key"].value
    assert E.cache_key(key) != E.cache_key(other)  # different SM / TensorRT / L4T -> different engine
    static = _plan(capability_models["cnn"], "a10")
    assert static["tensorrt_optimization_profiles"].value == "static shapes: none needed"
    if host_env()["sm"] is None:
        assert static["engine_build"].value == "deferred to the device"


def test_preflight_names_every_mismatch():
    target = {"sm": "8.7", "tensorrt": "10.3", "l4t": "36.4"}
    assert preflight(target, {"sm": "8.7", "tensorrt": "10.3.0", "l4t": "36.4.3"}) == []
    problems = preflight(target, {"sm": "8.6", "tensorrt": "8.6.2", "l4t": "36.2"})
    assert problems == [
        "engine targets sm_8.7, this GPU is sm_8.6",
        "engine targets TensorRT 10.3, this host has 8.6.2",
        "engine targets L4T 36.4, this Jetson runs L4T 36.2",
    ]
    assert preflight(target, {"sm": None, "tensorrt": None}) == ["no NVIDIA GPU here", "TensorRT is not installed here"]


def _config(tmp_path: Path) -> dict:
    fields = {"sm": "8.7", "tensorrt": "10.3", "l4t": "36.4", "precision": "fp16", "model_sha256": "ab" * 32}
    return {
        "schema": 1,
        "onnx": "model.onnx",
        "precision": "fp16",
        "precision_flags": ["fp16"],
        "dla": {"core": 1, "gpu_fallback": True},
        "optimization_profiles": [{"x": {"min": [1, 3], "opt": [1, 128], "max": [8, 512]}}],
        "workspace_mb": 1024,
        "builder_optimization_level": 3,
        "target": {"sm": "8.7", "tensorrt": "10.3"},
        "cache_key_fields": fields,
        "cache_key": E.cache_key(fields),
    }


def test_trtexec_command_and_config_validation(tmp_path):
    config = _config(tmp_path)
    cmd = E.trtexec_command(config, Path("model.onnx"), Path("model.engine"), Path("timing.cache"))
    assert "--fp16" in cmd and "--useDLACore=1" in cmd and "--allowGPUFallback" in cmd
    assert "--minShapes=x:1x3" in cmd and "--optShapes=x:1x128" in cmd and "--maxShapes=x:8x512" in cmd
    E.validate_config(config, "cfg")
    tampered = {**config, "cache_key_fields": {**config["cache_key_fields"], "sm": "8.6"}}
    with pytest.raises(BundleIntegrityError, match="cache_key does not match"):
        E.validate_config(tampered, "cfg")
    with pytest.raises(BundleIntegrityError, match="escapes the bundle"):
        E.validate_config({**config, "onnx": "../../etc/model.onnx"}, "cfg")
    with pytest.raises(BundleIntegrityError, match="unknown precision flags"):
        E.validate_config({**config, "precision_flags": ["fp16", "exportProfile=/tmp/x"]}, "cfg")


def test_corrupt_engine_cache_is_evicted_and_reported(tmp_path):
    config = _config(tmp_path)
    E.store_engine(config, b"engine bytes", {"built_with": "test"}, root=tmp_path)
    assert E.cached_engine(config, tmp_path)[0] is not None
    (tmp_path / config["cache_key"] / E.ENGINE_FILE).write_bytes(b"flipped bits")
    path, why = E.cached_engine(config, tmp_path)
    assert path is None and "corrupt engine cache" in why and "sha256" in why
    heard = []
    no_trt = {"tensorrt": None, "trtexec": None, "sm": "8.7"}
    with pytest.raises(ExternalToolError, match="neither the TensorRT Python API nor trtexec"):
        E.engine_for(config, tmp_path / "model.onnx", no_trt, record=heard.append, root=tmp_path)
    assert heard and "corrupt" in heard[0]
    assert not (tmp_path / config["cache_key"] / E.ENGINE_FILE).exists()  # evicted, not reused


@pytest.fixture(scope="module")
def deferred_bundle(capability_models, tmp_path_factory) -> Path:
    """A real tensorrt-format build of the CNN for Orin NX: everything up to the point TensorRT is needed."""
    from edgesdk.build import build

    out = tmp_path_factory.mktemp("trt") / "cnn-orin-nx"
    return build(
        str(capability_models["cnn"]),
        "orin-nx-16gb",
        out,
        BuildOptions(format="tensorrt", progress=False, parity_samples=8, calibration_samples=4),
    )


@pytest.mark.slow
def test_deferred_engine_bundle(deferred_bundle):
    manifest = json.loads((deferred_bundle / "manifest.json").read_text())
    assert manifest["format"] == "tensorrt"
    roles = {a["role"] for a in manifest["artifacts"]}
    assert {"model", "engine-config"} <= roles
    info = manifest["extras"]["tensorrt"]
    config = E.read_config(deferred_bundle / "tensorrt" / "engine_config.json")
    assert config["target"]["sm"] == "8.7" and config["precision_flags"] == ["fp16"]
    assert config["cache_key_fields"]["model_sha256"] == next(
        a["sha256"] for a in manifest["artifacts"] if a["role"] == "model"
    )
    assert config["trtexec"].startswith("trtexec --onnx=model.onnx")
    assert info["capability"]["placement"] == {"tensorrt": info["capability"]["nodes"]}
    if TRT_VERSION is None:
        assert "engine" not in roles and info["engine"]["deferred"] is True
        assert "TensorRT is not installed here" in info["engine"]["reason"]
    assert manifest["runtime"]["backend_chain"][0] == "tensorrt-engine"


@pytest.mark.slow
def test_engine_build_cli_refuses_off_target(deferred_bundle, run_cli):
    if TRT_VERSION is not None:
        pytest.skip("this host has TensorRT: the refusal path needs a host without it")
    res = run_cli("engine", "build", deferred_bundle)
    assert res.returncode == ExternalToolError.exit_code
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]  # one line, no traceback
    assert "cannot build this bundle's engine here" in res.stderr
    shown = json.loads(run_cli("engine", "show", deferred_bundle, "--json").stdout)
    assert shown["preflight_problems"] and shown["cache"]["engine"] is None


@pytest.mark.slow
def test_runtime_chain_falls_back_to_cpu_for_real(deferred_bundle):
    """TensorRT engine -> TRT EP -> CUDA EP -> CPU EP: each missing piece recorded, CPU really runs it."""
    import onnxruntime as ort

    import edgesdk

    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    with edgesdk.load(deferred_bundle) as session:
        out = session.run({"x": x})
        report = session.report()
    steps = [(f["from"], f["to"]) for f in report["fallbacks"]]
    if TRT_VERSION is None:
        assert steps[0] == ("tensorrt-engine", "TensorrtExecutionProvider")
        assert "pre-flight" in report["fallbacks"][0]["reason"]
    assert report["backend_report"]["providers_active"][-1] == "CPUExecutionProvider"
    placement = report["backend_report"]["placement"]
    assert placement["source"].startswith("onnxruntime profiler")
    assert sum(placement["by_provider"].values()) == len(placement["nodes"]) > 0
    pre = report["backend_report"]["tensorrt"]["preflight"]
    assert pre["target"]["profile"] == "orin-nx-16gb" and pre["ok"] is (not pre["problems"])
    ref = ort.InferenceSession(str(deferred_bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = ref.run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(out.values())), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_engine_for_another_gpu_is_refused_before_deserialising(deferred_bundle):
    """The host claims an A10 with TensorRT 10.3: pre-flight must stop at the SM before touching TensorRT."""
    import edgesdk
    from edgesdk.host import GpuInfo, HostFacts

    a10_host = HostFacts(tensorrt="10.3.0", gpus=(GpuInfo(index=0, name="NVIDIA A10", sm="8.6"),))
    with edgesdk.load(deferred_bundle, host=a10_host) as session:
        first = session.report()["fallbacks"][0]
    assert first["from"] == "tensorrt-engine"
    assert first["reason"] == "pre-flight: engine targets sm_8.7, this GPU is sm_8.6"


@needs_tensorrt
@pytest.mark.tensorrt
@pytest.mark.gpu
def test_real_engine_build_and_run(capability_models, tmp_path):
    """Only where TensorRT exists (JetPack, NVIDIA containers): build the CNN engine for this GPU and run it."""
    from edgesdk.runtime.backends.tensorrt import TensorRTEngineBackend

    env = host_env()
    config = _config(tmp_path)
    config.update({"dla": None, "optimization_profiles": [], "target": {"sm": env["sm"], "tensorrt": TRT_VERSION}})
    data, info = E.build_engine(config, capability_models["cnn"], tmp_path / "work", env)
    engine = tmp_path / "model.engine"
    engine.write_bytes(data)
    backend = TensorRTEngineBackend(engine, env, "test")
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    out = next(iter(backend.run({"x": x}).values()))
    import onnxruntime as ort

    ref = ort.InferenceSession(str(capability_models["cnn"]), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(out, ref[0], rtol=1e-2, atol=1e-2)


@pytest.mark.slow
def test_inspect_capability_reads_a_bundle(deferred_bundle, run_cli):
    res = run_cli("inspect", "capability", deferred_bundle, "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["profile"] == "orin-nx-16gb" and data["precision"] == "fp16"
    assert data["model"].endswith("model.onnx")


def test_plan_explains_what_int8_leaves_in_fp16(capability_models):
    plan = _plan(capability_models["bert"], "orin-agx-64gb", precision="int8")
    decision = plan["precision_report"]
    assert decision.value.startswith("17/") and "kept higher" in decision.value
    assert "Softmax run FP16" in decision.reason and "reformat" in decision.reason


@pytest.mark.slow
def test_fallbacks_are_telemetry_events(deferred_bundle):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import edgesdk
    from edgesdk import telemetry

    telemetry.shutdown()
    spans = InMemorySpanExporter()
    telemetry.configure(span_exporter=spans)
    try:
        with edgesdk.load(deferred_bundle) as session:
            recorded = session.report()["fallbacks"]
        assert telemetry.force_flush()
        events = [
            dict(e.attributes) for s in spans.get_finished_spans() for e in s.events if e.name == "edgesdk.fallback"
        ]
    finally:
        telemetry.shutdown()
    assert len(events) == len(recorded) >= 1
    assert [e["edgesdk.fallback.from"] for e in events] == [f["from"] for f in recorded]


@pytest.mark.slow
def test_dla_build_config_carries_core_and_gpu_fallback(capability_models, tmp_path):
    from edgesdk.build import build

    out = build(
        str(capability_models["dla_cnn"]),
        "orin-agx-64gb",
        tmp_path / "dla",
        BuildOptions(format="tensorrt", dla=True, progress=False, parity_samples=4, calibration_samples=2),
    )
    config = E.read_config(out / "tensorrt" / "engine_config.json")
    assert config["dla"] == {"core": 0, "gpu_fallback": True}
    assert config["cache_key_fields"]["dla"] == {"core": 0, "gpu_fallback": True}
    assert "--useDLACore=0 --allowGPUFallback" in config["trtexec"]
    summary = json.loads((out / "manifest.json").read_text())["extras"]["tensorrt"]["capability"]
    assert set(summary["placement"]) <= {"dla", "tensorrt"} and summary["placement"].get("dla", 0) >= 3
