# SPDX-License-Identifier: Apache-2.0
"""The GGUF plan's serving decisions (issue 35 item 2): ``serving.slots`` (serve's default --parallel) and
``serving.prefill_chunk`` (prompt tokens per engine step), chosen per profile from its memory, GPU/CPU kind and
compute/bandwidth figures and the model's KV cache per slot, each with its reason; a real Gemma-3-270M bundle
carries them into the manifest, ``edgesdk serve`` without --parallel takes the planned slots (and says so),
--parallel overrides, the engine takes the planned chunk, and a bundle built before the decisions keeps the
runtime's defaults."""

from __future__ import annotations

import json
import shutil

import pytest

from edgesdk.formats.gguf import plan as G
from edgesdk.plan import BuildOptions, inspect_model, plan_build
from edgesdk.profiles import Profile, resolve_profile
from tests.test_gguf_plan import hf_facts


def _serving(facts, profile) -> tuple[int, int, dict]:
    d = {x.key: x for x in plan_build(facts, profile, BuildOptions()).decisions}
    return d["serving.slots"].value, d["serving.prefill_chunk"].value, d


def _one_core_cpu() -> Profile:
    base = resolve_profile("cpu-x86_64")
    data = base.as_written()
    data["name"], data["aliases"] = "cpu-one-core", []
    data["device"]["cpu"]["cores"] = 1
    return Profile(name="cpu-one-core", path=base.path, data=data)


# TinyLlama-1.1B (ctx_train 2048): profile -> (slots, prefill chunk); the arithmetic is in the reasons
@pytest.mark.parametrize(
    ("profile", "slots", "chunk"),
    [("orin-nano-8gb", 15, 64), ("orin", 16, 352), ("h200", 16, 512), ("cpu", 4, 32)],
)
def test_slots_and_chunk_per_profile(profile, slots, chunk):
    got_slots, got_chunk, d = _serving(hf_facts("tinyllama-1.1b"), resolve_profile(profile))
    assert (got_slots, got_chunk) == (slots, chunk)
    assert d["serving.slots"].reason.startswith(f"{slots}: ")
    assert d["serving.prefill_chunk"].reason.startswith(f"{chunk} prompt tokens per engine step")
    assert (
        "docs/benchmarks.md" in d["serving.slots"].reason and "docs/benchmarks.md" in d["serving.prefill_chunk"].reason
    )


def test_jetson_8gb_gets_fewer_slots_smaller_context_budget_and_smaller_chunks_than_the_h200(gemma_gguf):
    facts = inspect_model(gemma_gguf)
    nano_slots, nano_chunk, nano = _serving(facts, resolve_profile("orin-nano-8gb"))
    h200_slots, h200_chunk, h200 = _serving(facts, resolve_profile("h200"))
    assert (nano_slots, nano_chunk) == (14, 352) and (h200_slots, h200_chunk) == (16, 512)
    nano_ctx, h200_ctx = nano["gguf.context_length"].value, h200["gguf.context_length"].value
    assert nano_slots * nano_ctx < h200_slots * h200_ctx
    assert f"context budget 14 x {nano_ctx} = {14 * nano_ctx:,} tokens" in nano["serving.slots"].reason
    why = nano["serving.slots"].reason
    # the Jetson's limit is compute against bandwidth (profile figures), the H200's the measured 16
    assert "peak 10.2 TFLOPS" in why and "68 GB/s" in why and "2 x the ridge = 14" in why
    assert "unified memory" in why and "holds 15" in why
    assert "6.70x one client" in h200["serving.slots"].reason and "discrete GPU memory" in h200["serving.slots"].reason
    # the chunk from the profile's FP16 peak and the measured llama.cpp prefill efficiency
    assert "peak 10.2 TFLOPS (profile) x efficiency 0.099" in nano["serving.prefill_chunk"].reason
    assert "377 prompt tokens take 0.2 s" in nano["serving.prefill_chunk"].reason


def test_cpu_gets_the_measured_4_slots_and_128_token_chunks_for_gemma(gemma_gguf):
    slots, chunk, d = _serving(inspect_model(gemma_gguf), resolve_profile("cpu"))
    assert (slots, chunk) == (4, 128)
    assert "CPU profile without a core count: 4" in d["serving.slots"].reason
    assert "1.35-1.60x" in d["serving.slots"].reason
    assert "in 211 ms" in d["serving.prefill_chunk"].reason


def test_cpu_cores_scale_slots_and_chunk(gemma_gguf):
    slots, chunk, d = _serving(inspect_model(gemma_gguf), _one_core_cpu())
    assert (slots, chunk) == (2, 64)
    assert d["serving.slots"].reason.startswith("2: CPU profile with 1 cores: 2 per core = 2")


def test_kv_cache_bounds_the_slots_when_memory_is_short():
    # Llama-3-8B on the 8 GB Orin Nano: Q3_K_M at 4096, and the KV share left holds one slot of 4096 tokens
    slots, _, d = _serving(hf_facts("llama3-8b"), resolve_profile("orin-nano-8gb"))
    assert slots == 1 and "holds 1;" in d["serving.slots"].reason
    kv = G.kv_bytes(hf_facts("llama3-8b").extra, 4096, "f16")
    assert f"KV cache per slot {G._gb(kv)} (4096 ctx, f16)" in d["serving.slots"].reason


def test_serving_decisions_reach_explain_and_the_section():
    plan = plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions())
    assert plan.section.slots == 16 and plan.section.prefill_chunk == 512
    assert "serving.slots" in plan.explain() and "serving.prefill_chunk" in plan.explain()
    again = type(plan.section).from_decisions(plan.section.decisions())
    assert (again.slots, again.prefill_chunk) == (16, 512)


# ------------------------------------------------------------------ a real bundle, loaded and served


@pytest.fixture(scope="module")
def one_core_bundle(gemma_gguf, tmp_path_factory):
    import yaml

    from edgesdk.build import build

    work = tmp_path_factory.mktemp("serving-plan")
    prof = work / "cpu-one-core.yaml"
    prof.write_text(yaml.safe_dump(_one_core_cpu().as_written(), sort_keys=False))
    return build(
        gemma_gguf, str(prof), work / "gemma", BuildOptions(progress=False, accept_licenses=("LicenseRef-gemma",))
    )


def test_the_manifest_and_the_loaded_engine_carry_the_plan(one_core_bundle, tmp_path):
    pytest.importorskip("llama_cpp")
    import edgesdk
    from edgesdk.manifest import content_hash
    from edgesdk.serve.batch_worker import CPU_SLOTS, decide_parallel

    llm = json.loads((one_core_bundle / "manifest.json").read_text())["extras"]["llm"]
    assert (llm["slots"], llm["prefill_chunk"]) == (2, 64)
    with edgesdk.load(one_core_bundle, threads=1) as s:
        assert s.backend.prefill_budget()[0] == 64
        n, why = decide_parallel(s, None)
        assert n == 2 and why.startswith("2 (the plan's serving.slots 2 for profile cpu-one-core; KV cache 2 x")
        assert decide_parallel(s, 3)[0] == 3
        engine = s.backend.batch_engine(slots=2, max_queue=4)
        assert (engine.slots, engine.prefill_chunk) == (2, 64)
        assert s.backend.batch_engine(slots=2, max_queue=4, prefill_chunk=96).prefill_chunk == 96  # the caller's
        assert s.backend.batch_engine(slots=2, max_queue=4).prefill_chunk == 64  # back to the plan's
    # a bundle built before the decisions: no serving keys -> the runtime's defaults
    old = tmp_path / "old"
    shutil.copytree(one_core_bundle, old)
    data = json.loads((old / "manifest.json").read_text())
    del data["extras"]["llm"]["slots"], data["extras"]["llm"]["prefill_chunk"]
    data["manifest_sha256"] = content_hash(data)
    (old / "manifest.json").write_text(json.dumps(data, indent=2))
    with edgesdk.load(old, threads=1) as s:
        assert s.backend.prefill_budget()[0] == 128
        n, why = decide_parallel(s, None)
        assert n == CPU_SLOTS and why.startswith(f"{CPU_SLOTS} (CPU default {CPU_SLOTS}; plan: none planned")
        assert s.generate("Hello", max_tokens=2)


def test_serve_uses_the_planned_slots_and_parallel_overrides(one_core_bundle, tmp_path):
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from tests.test_serve import ServerProcess

    srv = ServerProcess([one_core_bundle, "--name", "gemma"], tmp_path)
    try:
        log = srv.log.read_text()
        assert "continuous batching, slots: 2 (the plan's serving.slots 2 for profile cpu-one-core;" in log, log[-2000:]
        assert "prompt budget: 64 prompt tokens per step (the plan's serving.prefill_chunk 64)" in log
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        assert 'edgesdk_serve_slots{model="gemma"} 2.0' in metrics, [m for m in metrics.splitlines() if "slots" in m]
        r = httpx.post(
            srv.url + "/v1/completions", timeout=60, json={"model": "gemma", "prompt": "Hi", "max_tokens": 2}
        )
        assert r.status_code == 200
    finally:
        assert srv.stop() == 0
    srv = ServerProcess([one_core_bundle, "--name", "gemma", "--parallel", "3"], tmp_path)
    try:
        assert "continuous batching, slots: 3 (--parallel; KV cache 3 x" in srv.log.read_text()
    finally:
        assert srv.stop() == 0
