# SPDX-License-Identifier: Apache-2.0
"""Profiler: roofline facts and prediction, measurement on a real ONNX bundle, reports, compare, budgets."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgesdk.profiler import roofline
from edgesdk.profiler.compare import compare_reports, parse_threshold
from edgesdk.profiler.report import SCHEMA, check_budgets, load_report
from edgesdk.profiles import resolve_profile

D, H, SEQ = 64, 256, 128


def make_mlp_bundle(out: Path) -> Path:
    """A real two-MatMul ONNX graph with dynamic batch/sequence, written as a bundle by the bundle writer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.bundle import artifact_entry, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((D, H)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((H, D)).astype(np.float32), "w2")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "mlp", [x], [y], [w1, w2]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, out / "model.onnx")
    write_manifest(
        out,
        {
            "bundle_id": "mlp-test",
            "model": {"name": "mlp", "task": "feature-extraction"},
            "profile": {"name": "cpu-x86_64"},
            "format": "onnx",
            "precision": "fp32",
            "artifacts": [artifact_entry(out, "model.onnx", "model")],
            "runtime": {"backend_chain": ["CPUExecutionProvider"]},
        },
    )
    return out


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory) -> Path:
    return make_mlp_bundle(tmp_path_factory.mktemp("mlp") / "bundle")


@pytest.fixture(scope="module")
def mlp_report(mlp_bundle, tmp_path_factory):
    """One real `edgesdk profiler run` through the CLI entry point (shared by the report tests)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("reports")
    report, plot = out / "r.json", out / "r.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "profiler",
            "run",
            str(mlp_bundle),
            "--iterations",
            "60",
            "--warmup",
            "5",
            "--concurrency",
            "2",
            "--threads",
            "1",
            "--op-profile-runs",
            "5",
            "--no-progress",
            "-o",
            str(report),
            "--plot",
            str(plot),
            "--latency-budget-ms",
            "0.000001",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, report, plot


# ---------------------------------------------------------------- roofline


def test_onnx_flops_and_weight_bytes_counted_from_the_graph(mlp_bundle):
    facts = roofline.onnx_work(mlp_bundle / "model.onnx", batch=2, seq=SEQ)
    assert facts.flops == 2 * (2 * 2 * SEQ * D * H)  # two MatMuls, batch 2
    assert facts.weight_bytes == 2 * D * H * 4
    assert facts.params == 2 * D * H and facts.tokens == 2 * SEQ and not facts.notes


def test_gguf_facts_from_header(gemma_gguf):
    facts = roofline.gguf_work(gemma_gguf)
    assert facts.kind == "llm" and facts.precision == "Q4_K_M"
    assert facts.layers == 18 and facts.d_model == 640
    # 18 layers x 1 KV head x (256 + 256) x 2 bytes (F16 cache)
    assert facts.kv_bytes_per_position == 18 * 1 * 512 * 2
    # Tied output embedding: the whole file's tensors are read each step (the output projection reads the table).
    assert 0.9 * gemma_gguf.stat().st_size < facts.weight_bytes <= gemma_gguf.stat().st_size


def test_broken_gguf_is_a_model_error(tmp_path, gemma_gguf):
    from edgesdk.errors import ModelError

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(gemma_gguf.read_bytes()[:4096])
    for path in (truncated, tmp_path / "missing.gguf"):
        with pytest.raises(ModelError):
            roofline.gguf_work(path)
    absurd = tmp_path / "absurd.gguf"
    absurd.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**40).to_bytes(8, "little") + bytes(8))
    with pytest.raises(ModelError, match="implausible"):
        roofline.gguf_work(absurd)


def test_decode_prediction_scales_with_profile_bandwidth(gemma_gguf):
    facts = roofline.gguf_work(gemma_gguf)
    nano = roofline.predict(facts, resolve_profile("orin-nano-8gb"), backend="llama.cpp")
    agx = roofline.predict(facts, resolve_profile("orin-agx-64gb"), backend="llama.cpp")
    ratio = agx["decode"]["bound_tok_s"] / nano["decode"]["bound_tok_s"]
    assert ratio == pytest.approx(204.8 / 68, rel=1e-6)
    assert nano["decode"]["efficiency_source"].startswith(("published", "measured", "derived"))
    longer = roofline.predict(facts, resolve_profile("orin-nano-8gb"), backend="llama.cpp", context=4096)
    assert longer["decode"]["bound_tok_s"] < nano["decode"]["bound_tok_s"]  # KV reads grow with context


def test_efficiency_is_per_device_class_not_global():
    table = roofline.load_efficiency_table()
    jetson = roofline.pick_efficiency(table, "jetson", "decode", "llama.cpp", 7_000_000_000, "int4")
    gpu = roofline.pick_efficiency(table, "gpu", "decode", "llama.cpp", 7_000_000_000, "int4")
    assert jetson["device_class"] == "jetson" and gpu["device_class"] == "gpu"
    assert jetson["efficiency"] != gpu["efficiency"]
    assert all(e["source"].split(":")[0] in ("published", "measured", "derived") for e in table)
    assert roofline.pick_efficiency(table, "nonexistent", "decode", None, None) is None


def test_prediction_unavailable_without_bandwidth(mlp_bundle):
    facts = roofline.onnx_work(mlp_bundle / "model.onnx")
    pred = roofline.predict(facts, resolve_profile("cpu-x86_64"))
    assert "detect --write" in pred["unavailable"]
    pred = roofline.predict(
        facts,
        resolve_profile("cpu-x86_64"),
        measured_host={"bandwidth_gbps": 10.0, "peak_flops": 1e11, "method": "t", "peak_method": "t"},
    )
    assert pred["encoder"]["compute_ms"] == pytest.approx(facts.flops / 1e11 * 1e3)
    assert pred["encoder"]["limited_by"] == "compute"


def test_prediction_error_sign():
    assert roofline.prediction_error(110.0, 100.0) == pytest.approx(10.0)
    assert roofline.prediction_error(None, 100.0) is None
    assert roofline.efficiency_from_measurement(2.0, 4.0, higher_is_better=False) == 0.5


# ---------------------------------------------------------------- measurement through the CLI


def test_profiler_run_report(mlp_report):
    done, report_path, plot = mlp_report
    assert done.returncode == 0, done.stderr
    report = load_report(report_path)
    lat = report["latency_ms"]
    assert lat["n"] == 60 and len(lat["samples"]) == 60
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["stdev"] >= 0 and lat["iqr"] >= 0
    assert [t["concurrency"] for t in report["throughput"]] == [1, 2]
    assert report["ort_profile"]["placement"] == {"CPUExecutionProvider": 3}
    assert {r["op_type"] for r in report["ort_profile"]["by_op_type"]} == {"MatMul", "Relu"}
    assert report["memory"]["host_peak_rss_mb"] > 10
    assert report["memory"]["device"]["peak_mb"] is None  # no GPU here: unavailable, not 0
    assert report["runtime"]["backend"] == "onnxruntime"
    assert report["versions"].get("onnxruntime") or report["versions"].get("onnxruntime-gpu")
    assert report["load"]["time_ms"] > 0
    assert report["prediction"]["encoder"]["bound_ms"] > 0  # host bandwidth/peak measured
    # a 1 ns budget is missed: a warning, exit 0 without --fail-on-budget
    assert "budget miss: p99 latency" in done.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_fail_on_budget_exits_2(mlp_bundle, run_cli):
    done = run_cli(
        "profiler",
        "run",
        mlp_bundle,
        "--iterations",
        "5",
        "--warmup",
        "1",
        "--op-profile-runs",
        "0",
        "--no-progress",
        "--latency-budget-ms",
        "0.000001",
        "--fail-on-budget",
        "--json",
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: budget miss: p99 latency")


def test_bundle_for_unavailable_runtime_is_a_clear_error(tmp_path, run_cli):
    from edgesdk.bundle import artifact_entry, write_manifest

    (tmp_path / "model.engine").write_bytes(b"\0" * 64)
    write_manifest(
        tmp_path,
        {
            "bundle_id": "x",
            "format": "tensorrt",
            "model": {"name": "x"},
            "artifacts": [artifact_entry(tmp_path, "model.engine", "engine")],
        },
    )
    done = run_cli("profiler", "run", tmp_path, "--no-progress")
    assert done.returncode == 6
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "TensorRT" in errors[0] and "Traceback" not in done.stderr


# ---------------------------------------------------------------- reports, compare, budgets


def test_other_schema_version_is_refused(tmp_path, run_cli, mlp_report):
    other = json.loads(mlp_report[1].read_text())
    other["schema"] = "edgesdk.profiler.report/2"
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(other))
    done = run_cli("profiler", "compare", mlp_report[1], path)
    assert done.returncode == 3
    assert "edgesdk.profiler.report/2" in done.stderr and SCHEMA in done.stderr


def _with_latency(report: dict, scale: float, iqr_scale: float = 1.0) -> dict:
    new = json.loads(json.dumps(report))
    for k in ("p50", "p90", "p99", "min", "max", "mean"):
        new["latency_ms"][k] *= scale
    new["latency_ms"]["iqr"] = report["latency_ms"]["iqr"] * scale * iqr_scale
    new["throughput"][0]["per_s"] /= scale
    return new


def test_compare_flags_regression_beyond_threshold_and_noise(mlp_report, tmp_path, run_cli):
    base = load_report(mlp_report[1])
    base["latency_ms"]["iqr"] = 0.01 * base["latency_ms"]["p50"]  # a quiet run: 1 % IQR
    slow = _with_latency(base, 1.10)
    result = compare_reports(base, slow, 0.05)
    assert "latency p50 (ms)" in result["regressions"]
    row = next(r for r in result["rows"] if r["metric"] == "latency p50 (ms)")
    assert row["ratio"] == pytest.approx(1.10) and row["worse_pct"] == pytest.approx(10.0)
    assert compare_reports(base, _with_latency(base, 1.02), 0.05)["regressions"] == []
    # Same 10 % slowdown inside a 40 % spread is noise, not a regression.
    noisy_base = json.loads(json.dumps(base))
    noisy_base["latency_ms"]["iqr"] = 0.4 * base["latency_ms"]["p50"]
    noisy = _with_latency(noisy_base, 1.10)
    assert "latency p50 (ms)" not in compare_reports(noisy_base, noisy, 0.05)["regressions"]
    # CLI: exit 2 with the metric named
    (tmp_path / "b.json").write_text(json.dumps(base))
    (tmp_path / "n.json").write_text(json.dumps(slow))
    done = run_cli("profiler", "compare", tmp_path / "b.json", tmp_path / "n.json", "--max-regression", "5%")
    assert done.returncode == 2 and "latency p50" in done.stderr
    assert "±" in done.stdout  # the noise column is shown
    assert (
        run_cli("profiler", "compare", tmp_path / "b.json", tmp_path / "b.json", "--max-regression", "5%").returncode
        == 0
    )


def test_threshold_parsing():
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("5") == pytest.approx(0.05)
    assert parse_threshold("0.05") == pytest.approx(0.05)
    from edgesdk.errors import InputError

    with pytest.raises(InputError):
        parse_threshold("fast")


def test_budgets_from_profile_and_unmeasured_is_not_a_pass(mlp_report):
    report = load_report(mlp_report[1])
    nano = resolve_profile("orin-nano-8gb")
    budgets = check_budgets(report, nano)
    mem = next(c for c in budgets["checks"] if c["what"].startswith("peak memory"))
    assert mem["target"] == nano.memory_budget_gb() and mem["target_from"] == "profile orin-nano-8gb"
    report["memory"]["host_peak_rss_mb"] = None
    budgets = check_budgets(report, nano, latency_ms=1.0)
    assert {c["status"] for c in budgets["checks"]} >= {"unmeasured"}
    assert not math.isnan(budgets["checks"][0]["target"])


# ---------------------------------------------------------------- LLM measurement


def test_llm_metrics_from_chunk_times():
    from edgesdk.profiler.llm_bench import llm_metrics

    runs = [
        {"chunk_times_ms": [100.0 + 10.0 * i for i in range(11)], "output_tokens": 11},
        {"chunk_times_ms": [120.0 + 12.0 * i for i in range(11)], "output_tokens": 11},
    ]
    m = llm_metrics(50, runs)
    assert m["ttft_ms"]["p50"] == pytest.approx(110.0)
    assert m["tpot_ms"]["p50"] == pytest.approx(11.0)
    assert m["decode_tok_s"] == pytest.approx(1000 / 11.0)
    assert m["prefill_tok_s"] == pytest.approx(50 / 0.110) and m["prefill_source"] == "TTFT"
    assert m["prefill_eval_tokens"] is None
    assert m["generated_tokens"] == [11, 11]
    # With the backend's own timers on every run, prefill is the prompt-eval rate, TTFT kept apart.
    for r, ms in zip(runs, (40.0, 60.0)):
        r["backend_timings"] = {"prompt_eval_tokens": 50, "prompt_eval_ms": ms, "eval_tokens": 10, "eval_ms": 80.0}
    m = llm_metrics(50, runs)
    assert m["prefill_tok_s"] == pytest.approx((1250.0 + 50 / 0.060) / 2)  # median of the two runs
    assert m["prefill_source"] == "backend prompt-eval timer"
    assert m["prefill_tok_s_from_ttft"] == pytest.approx(50 / 0.110) and m["prefill_eval_tokens"] == [50, 50]
    assert m["decode_tok_s_backend"] == pytest.approx(125.0)
    assert m["timing_source"] == "text chunks"
    # Token instants from the backend win over text chunks (a token may yield no text).
    for r in runs:
        r["first_token_ms"], r["last_token_ms"] = 20.0, 20.0 + 5.0 * 10
    m = llm_metrics(50, runs)
    assert m["timing_source"] == "tokens (backend loop)"
    assert m["ttft_ms"]["p50"] == pytest.approx(20.0) and m["tpot_ms"]["p50"] == pytest.approx(5.0)
    assert m["decode_tok_s"] == pytest.approx(200.0)


@pytest.mark.slow
def test_profiler_run_on_real_gguf_bundle(gemma_gguf, tmp_path):
    pytest.importorskip("llama_cpp")
    from edgesdk.bundle import artifact_entry, write_manifest
    from edgesdk.profiler.api import run_profiler
    from edgesdk.profiler.bench import BenchOptions

    bundle = tmp_path / "gemma"
    bundle.mkdir()
    shutil.copyfile(gemma_gguf, bundle / "model.gguf")  # bundles hold regular files only (no symlinks)
    write_manifest(
        bundle,
        {
            "bundle_id": "gemma-test",
            "format": "gguf",
            "precision": "Q4_K_M",
            "model": {"name": "gemma-3-270m", "task": "text-generation"},
            "profile": {"name": "cpu-x86_64"},
            "artifacts": [artifact_entry(bundle, "model.gguf", "model")],
        },
    )
    report = run_profiler(bundle, BenchOptions(prompt_tokens=24, gen_tokens=8, llm_repeats=2, progress=False))
    llm = report["llm"]
    assert 20 <= llm["prompt_tokens"] <= 28
    assert llm["repeats"] == 2 and all(0 < n <= 8 for n in llm["generated_tokens"])
    assert llm["ttft_ms"]["p50"] > 0 and llm["decode_tok_s"] > 0 and llm["prefill_tok_s"] > 0
    # llama.cpp's own prompt-eval timer runs inside each TTFT, over the tokens it evaluated (the BOS
    # shared with the last request is reused, so one fewer than the prompt): per run, evaluated/timer
    # >= evaluated/TTFT, and the median of two is their mean >= evaluated / median TTFT.
    assert llm["prefill_source"] == "backend prompt-eval timer" and llm["timing_source"] == "tokens (backend loop)"
    evaluated = llm["prefill_eval_tokens"]
    assert len(evaluated) == 2 and all(llm["prompt_tokens"] - 2 <= n <= llm["prompt_tokens"] for n in evaluated)
    floor = llm["prefill_tok_s_from_ttft"] * min(evaluated) / llm["prompt_tokens"]
    assert llm["prefill_tok_s"] >= floor * 0.999 and llm["decode_tok_s_backend"] > 0
    # TTFT covers the whole prompt: with a reused KV cache it would be about one TPOT.
    assert llm["ttft_ms"]["p50"] > llm["tpot_ms"]["p50"]
    assert report["runtime"]["backend"] == "llama.cpp"
    pred = report["prediction"]
    assert pred["decode"]["bound_tok_s"] > 0 and "decode" in pred["error_pct"]


@pytest.mark.slow
def test_predict_cli_for_several_profiles(mlp_bundle, run_cli):
    done = run_cli("profiler", "predict", mlp_bundle, "-p", "orin-nano-8gb", "-p", "orin-agx-64gb", "--json")
    assert done.returncode == 0, done.stderr
    nano, agx = json.loads(done.stdout)
    assert (nano["profile"], agx["profile"]) == ("orin-nano-8gb", "orin-agx-64gb")
    # Same work, faster device: the bound can only shrink.
    assert agx["encoder"]["bound_ms"] < nano["encoder"]["bound_ms"]
    assert nano["work"]["flops"] == 2 * (2 * SEQ * D * H)
    done = run_cli("profiler", "predict", mlp_bundle, "-p", "no-such-device")
    assert done.returncode == 3 and "unknown device profile" in done.stderr


@pytest.mark.slow
def test_real_minilm_bundle_flops_fallbacks_and_placement(minilm_orin_bundle):
    from edgesdk.profiler.api import run_profiler
    from edgesdk.profiler.bench import BenchOptions

    facts = roofline.onnx_work(minilm_orin_bundle / "model.onnx", batch=1, seq=128)
    # MiniLM-L6: per layer QKV + output (4 x 384^2) + FFN (2 x 384 x 1536) weights, x 2 FLOP x 128 tokens,
    # plus attention scores and weighted sum (2 x 2 x 128^2 x 384) - whether fused into Attention or not.
    analytic = 6 * (2 * 128 * (4 * 384 * 384 + 2 * 384 * 1536) + 4 * 128 * 128 * 384)
    assert facts.flops == pytest.approx(analytic, rel=0.01)
    report = run_profiler(minilm_orin_bundle, BenchOptions(warmup=2, iterations=10, ort_profile_runs=2, progress=False))
    # Built for Orin (TensorRT/CUDA EPs first): here they cannot start, and the report says so.
    assert report["fallbacks"] and all(f["to"] for f in report["fallbacks"])
    assert set(report["ort_profile"]["placement"]) == {"CPUExecutionProvider"}
    assert report["ort_profile"]["node_count"] == sum(report["ort_profile"]["placement"].values())
    assert report["latency_ms"]["n"] == 10
