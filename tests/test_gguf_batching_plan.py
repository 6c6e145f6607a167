# SPDX-License-Identifier: Apache-2.0
"""The GGUF plan's llama.cpp batch sizes and K/V cache type (gguf.n_batch, gguf.n_ubatch, gguf.kv_type):
GPU profiles with flash attention get 2048 (capped at the context), Orin (no flash attention) and CPU
profiles keep 512; the compute buffer at the planned n_ubatch is in the memory arithmetic, and a larger
micro-batch never costs a smaller quantization type. The decisions reach --explain, --json and the manifest."""

from __future__ import annotations

import copy
import json

import pytest

from edgesdk import bundle as B
from edgesdk.errors import InputError
from edgesdk.formats.gguf import plan as G
from edgesdk.formats.gguf.build import llm_config
from edgesdk.manifest import Manifest
from edgesdk.plan import BuildOptions, plan_build
from edgesdk.profiles import Profile, resolve_profile
from tests.test_gguf_plan import hf_facts


def _d(plan) -> dict:
    return {d.key: d for d in plan.decisions}


def _with_llm_policy(name: str, **llm) -> Profile:
    """``name``'s profile with extra ``policy.llm`` keys (in memory; the YAML schema does not list them yet)."""
    base = resolve_profile(name)
    data = copy.deepcopy(base.data)
    data["policy"]["llm"].update(llm)
    return Profile(name=f"{base.name}-test", path=base.path, data=data)


def test_h200_plans_2048_batches_with_the_measurement_and_llamacpp_words_as_reasons():
    facts, profile = hf_facts("tinyllama-1.1b"), resolve_profile("h200")
    d = _d(plan_build(facts, profile, BuildOptions()))
    assert d["gguf.flash_attn"].value is True and d["gguf.n_gpu_layers"].value == "all"
    assert d["gguf.n_ubatch"].value == 2048 and d["gguf.n_batch"].value == 2048
    assert d["gguf.kv_type"].value == "f16"
    why = d["gguf.n_ubatch"].reason
    assert "H200 sweep, 2026-12-03 device log" in why and "63.3k" in why
    assert "physical maximum batch size" in why and "logical maximum batch size" in why and "common/arg.cpp" in why
    # the compute buffer at 2048 is what the quant-type arithmetic counted
    w = facts.params * G.BPW["F16"] / 8
    assert f"{G._gb(G.compute_bytes(facts.extra, w, 2048))} compute" in d["gguf.quant_type"].reason
    assert "n_ubatch 2048" in d["gguf.quant_type"].reason


def test_batch_is_capped_at_the_context():
    d = _d(plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions(context_length=1024)))
    assert d["gguf.context_length"].value == 1024
    assert d["gguf.n_ubatch"].value == 1024 and d["gguf.n_batch"].value == 1024
    assert "capped at the context 1024" in d["gguf.n_ubatch"].reason


@pytest.mark.parametrize("profile", ["orin-nano-8gb", "orin-agx-64gb"])
def test_orin_keeps_512_because_flash_attention_is_off(profile):
    d = _d(plan_build(hf_facts("llama3-8b"), resolve_profile(profile), BuildOptions()))
    assert d["gguf.flash_attn"].value is False
    assert (d["gguf.n_batch"].value, d["gguf.n_ubatch"].value, d["gguf.kv_type"].value) == (512, 512, "f16")
    assert "without flash attention" in d["gguf.n_ubatch"].reason


@pytest.mark.parametrize("profile", ["cpu-x86_64", "cpu-aarch64"])
def test_cpu_profiles_keep_512(profile):
    d = _d(plan_build(hf_facts("tinyllama-1.1b"), resolve_profile(profile), BuildOptions()))
    assert (d["gguf.n_batch"].value, d["gguf.n_ubatch"].value, d["gguf.kv_type"].value) == (512, 512, "f16")
    assert d["gguf.n_ubatch"].reason.startswith("CPU profile")


def test_the_larger_micro_batch_never_costs_a_smaller_type():
    # Llama-3-8B on the L4 (24 GB): F16 fits with the 512 compute buffer but not with the 2048 one.
    facts, profile = hf_facts("llama3-8b"), resolve_profile("l4")
    d = _d(plan_build(facts, profile, BuildOptions()))
    budget, n_ctx = profile.memory_budget_gb() * G.GB, d["gguf.context_length"].value
    w = facts.params * G.BPW["F16"] / 8
    kv = G.kv_bytes(facts.extra, n_ctx)
    assert w + kv + G.compute_bytes(facts.extra, w, 2048) > budget >= w + kv + G.compute_bytes(facts.extra, w, 512)
    assert d["gguf.quant_type"].value == "F16" and d["gguf.n_ubatch"].value == 512
    assert "would push the plan to Q8_0" in d["gguf.n_ubatch"].reason


def test_profile_kv_type_applies_with_flash_attention_only():
    facts = hf_facts("tinyllama-1.1b")
    d = _d(plan_build(facts, _with_llm_policy("h200", kv_type="q8_0"), BuildOptions()))
    assert d["gguf.kv_type"].value == "q8_0"
    kv = G.kv_bytes(facts.extra, 2048, "q8_0")
    assert kv == 2 * 22 * 4 * 64 * 2048 * 34 // 32 and f"{G._gb(kv)} KV" in d["gguf.quant_type"].reason
    d = _d(plan_build(facts, _with_llm_policy("orin-nano-8gb", kv_type="q8_0"), BuildOptions()))
    assert d["gguf.kv_type"].value == "f16" and "requires flash_attn" in d["gguf.kv_type"].reason
    with pytest.raises(InputError, match="not a llama.cpp KV cache type"):
        plan_build(facts, _with_llm_policy("h200", kv_type="q3_k"), BuildOptions())


def test_profile_n_ubatch_overrides_the_rule():
    d = _d(plan_build(hf_facts("tinyllama-1.1b"), _with_llm_policy("h200", n_ubatch=1024), BuildOptions()))
    assert d["gguf.n_ubatch"].value == 1024 and "policy.llm.n_ubatch 1024" in d["gguf.n_ubatch"].reason


def test_parity_fallback_sizes_with_the_planned_batch():
    facts, profile = hf_facts("llama3-8b"), resolve_profile("l4")
    plan = plan_build(facts, profile, BuildOptions(quant_type="Q4_K_M", on_parity_fail="fallback"))
    d = _d(plan)
    assert d["gguf.n_ubatch"].value == 2048  # Q4_K_M leaves room for the 2048 buffer
    listed = [f["quant_type"] for f in d["gguf.parity_fallback"].value]
    n_ctx, budget = d["gguf.context_length"].value, profile.memory_budget_gb() * G.GB
    for q in ("Q5_K_M", "Q6_K", "Q8_0", "F16"):
        w = facts.params * G.BPW[q] / 8
        fits = w + G.kv_bytes(facts.extra, n_ctx) + G.compute_bytes(facts.extra, w, 2048) <= budget
        assert (q in listed) == fits, q


def test_explain_json_and_manifest_carry_the_decisions(tmp_path):
    plan = plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions())
    text = plan.explain()
    for key in ("gguf.n_batch", "gguf.n_ubatch", "gguf.kv_type"):
        assert key in text
    as_json = {d["key"]: d for d in json.loads(json.dumps(plan.to_dict()))["decisions"]}
    assert as_json["gguf.n_ubatch"]["value"] == 2048 and "H200 sweep" in as_json["gguf.n_ubatch"]["reason"]
    final = tmp_path / "model.gguf"
    final.write_bytes(b"GGUF")
    out_facts = {"architecture": "llama", "layers": 22, "kv_heads": 4, "head_dim": 64, "params": 1_100_048_384}
    llm = llm_config(plan, out_facts, final, n_ctx=2048, quant="F16", converted=None)
    B.write_manifest(
        tmp_path,
        Manifest(
            format="gguf",
            precision="F16",
            bundle_id="b",
            artifacts=[B.artifact_entry(tmp_path, "model.gguf", "model")],
            llm=llm,
        ),
    )
    again = B.open_bundle(tmp_path).manifest.llm
    assert again is not None
    info = again.to_dict()
    assert (info["n_batch"], info["n_ubatch"], info["type_k"], info["type_v"]) == (2048, 2048, "f16", "f16")
    assert info["flash_attn"] is True and info["n_ctx"] == 2048


def test_a_plan_without_the_decisions_writes_no_batch_keys(tmp_path):
    """Plans made before these decisions (or other formats' decoder plans) leave the keys out: the runtime
    then keeps llama-cpp-python's defaults."""
    plan = plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("cpu-x86_64"), BuildOptions())
    for key in ("gguf.n_batch", "gguf.n_ubatch", "gguf.kv_type"):  # a section without them (typed: None)
        del plan.section.why[key]
        setattr(plan.section, plan.section.FIELDS[key], None)
    final = tmp_path / "model.gguf"
    final.write_bytes(b"GGUF")
    out_facts = {"architecture": "llama", "layers": 22, "kv_heads": 4, "head_dim": 64, "params": 1}
    info = llm_config(plan, out_facts, final, n_ctx=2048, quant="Q8_0", converted=None).to_dict()
    assert not {"n_batch", "n_ubatch", "type_k", "type_v"} & set(info)
