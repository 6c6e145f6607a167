# SPDX-License-Identifier: Apache-2.0
"""``--on-parity-fail fallback`` for GGUF builds: when the chosen quantization type misses its perplexity
limit, the next type of the profile's quant order with more bits that fits the memory budget is built and
verified, each attempt recorded with its figures; exit 5 only when none passes.

The planner part uses real published model shapes as facts (as tests/test_gguf_plan.py). The builds are
real: a random-weight 2-layer Llama from a transformers config (tests/test_gguf_build.py), converted,
quantized and measured by llama.cpp; a profile with a strict ``policy.parity.Q4_K_M.ppl_ratio_max`` makes
the first type miss (random weights: every ratio is ~1.0, so a limit of 0.5 cannot be met).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.plan import BuildOptions, ModelFacts, plan_build
from edgesdk.profiles import load_profile_file, resolve_profile
from tests.test_gguf_plan import hf_facts

REPO = Path(__file__).resolve().parent.parent


def _d(plan, key):
    return next(d for d in plan.decisions if d.key == key)


def _profile(tmp_path: Path, parity: dict, base: str = "cpu-x86_64.yaml") -> Path:
    data = yaml.safe_load((REPO / "profiles" / base).read_text())
    data["policy"]["parity"] = parity
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------------ the plan
def test_fallback_lists_the_next_better_types_that_fit():
    plan = plan_build(
        hf_facts("tinyllama-1.1b"),
        resolve_profile("h200"),
        BuildOptions(quant_type="Q4_K_M", on_parity_fail="fallback"),
    )
    d = _d(plan, "gguf.parity_fallback")
    assert [c["quant_type"] for c in d.value] == ["Q5_K_M", "Q6_K", "Q8_0", "F16"]
    assert [c["ppl_ratio_max"] for c in d.value] == [1.03, 1.02, 1.01, 1.005]
    assert "Q5_K_M (" in d.reason and "exit 5" in d.reason
    assert "gguf.parity_fallback" in plan.explain()


def test_types_that_do_not_fit_the_budget_are_not_tried():
    plan = plan_build(
        hf_facts("llama3-8b"),
        resolve_profile("orin-nano-8gb"),
        BuildOptions(quant_type="Q3_K_M", on_parity_fail="fallback"),
    )
    d = _d(plan, "gguf.parity_fallback")
    assert d.value == [] and "Q4_K_M needs" in d.reason and "> budget 5.4 GB" in d.reason
    tight = plan_build(
        hf_facts("llama3-8b"), resolve_profile("cpu"), BuildOptions(quant_type="Q4_K_M", on_parity_fail="fallback")
    )
    assert [c["quant_type"] for c in _d(tight, "gguf.parity_fallback").value] == ["Q5_K_M", "Q6_K"]
    assert "Q8_0 needs" in _d(tight, "gguf.parity_fallback").reason


def test_default_error_mode_tries_nothing_but_says_what_fallback_would_do():
    plan = plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions(quant_type="Q4_K_M"))
    d = _d(plan, "gguf.parity_fallback")
    assert d.value == [] and "--on-parity-fail error" in d.reason and "would try Q5_K_M" in d.reason


def test_quantized_gguf_source_falls_back_to_itself_never_above():
    extra = {
        "layers": 18,
        "kv_heads": 1,
        "head_dim": 256,
        "hidden": 640,
        "ffn": 2048,
        "n_vocab": 262144,
        "ctx_train": 32768,
        "file_type": "Q4_K_M",
        "tensor_bytes": 240_000_000,
        "architecture": "gemma3",
    }
    facts = ModelFacts(
        source="/models/gemma.gguf",
        kind="gguf",
        task="text-generation",
        name="gemma",
        family="gemma3",
        params=268_000_000,
        extra=extra,
    )
    plan = plan_build(
        facts, resolve_profile("orin-agx-64gb"), BuildOptions(quant_type="Q3_K_M", on_parity_fail="fallback")
    )
    d = _d(plan, "gguf.parity_fallback")
    assert d.value == [{"quant_type": "Q4_K_M", "ppl_ratio_max": None}]  # the source, repackaged unchanged
    assert "requantizing up cannot restore precision" in d.reason


def test_profile_sets_a_gguf_types_limit(tmp_path):
    prof = load_profile_file(_profile(tmp_path, {"Q4_K_M": {"ppl_ratio_max": 1.2}}))
    plan = plan_build(hf_facts("tinyllama-1.1b"), prof, BuildOptions(quant_type="Q4_K_M"))
    assert _d(plan, "parity").value["ppl_ratio_max"] == 1.2
    with pytest.raises(ProfileError, match="policy.parity.Q9_X"):
        load_profile_file(_profile(tmp_path, {"Q9_X": {"ppl_ratio_max": 1.2}}))


# ------------------------------------------------------------------------------ real builds
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("transformers")
    from tests.test_gguf_build import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("hf") / "tiny-llama", "llama")


@pytest.mark.slow
def test_a_missed_type_falls_back_to_the_next_and_records_every_attempt(tiny_llama, tmp_path):
    from edgesdk.build import build
    from edgesdk.formats.gguf.facts import gguf_facts

    profile = _profile(tmp_path, {"Q4_K_M": {"ppl_ratio_max": 0.5}})
    out = build(
        tiny_llama,
        str(profile),
        tmp_path / "out",
        BuildOptions(progress=False, quant_type="Q4_K_M", on_parity_fail="fallback"),
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["precision"] == "Q5_K_M" and m["extras"]["llm"]["quant_type"] == "Q5_K_M"
    assert gguf_facts(out / "model.gguf")["file_type"] == "Q5_K_M"  # the file really is the fallback type
    tried = [d for d in m["plan"]["decisions"] if d["key"] == "gguf.parity_attempt"]
    assert [(t["value"]["quant_type"], t["value"]["passed"]) for t in tried] == [("Q4_K_M", False), ("Q5_K_M", True)]
    first, second = tried[0]["value"], tried[1]["value"]
    assert first["ppl_ratio"] > first["ppl_ratio_max"] == 0.5 and second["ppl_ratio"] <= second["ppl_ratio_max"] == 1.03
    assert first["ppl_reference"] == second["ppl_reference"] > 0  # one reference, measured once
    assert "> limit 0.5x" in tried[0]["reason"]
    assert [a["quant_type"] for a in m["parity"]["attempts"]] == ["Q4_K_M", "Q5_K_M"]
    assert m["parity"]["thresholds"]["ppl_ratio_max"] == 1.03 and m["parity"]["ppl_ratio"] == second["ppl_ratio"]
    assert m["fallbacks"] == [{"from": "Q4_K_M", "to": "Q5_K_M", "reason": tried[0]["reason"], "stage": "verify"}]


@pytest.mark.slow
def test_exit_5_only_when_no_type_passes(tiny_llama, tmp_path, run_cli):
    strict = {q: {"ppl_ratio_max": 0.5} for q in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")}
    profile = _profile(tmp_path, strict)
    out = tmp_path / "out"
    res = run_cli(
        "build",
        tiny_llama,
        "--profile",
        profile,
        "-o",
        out,
        "--quant-type",
        "Q4_K_M",
        "--on-parity-fail",
        "fallback",
        "--no-progress",
    )
    assert res.returncode == 5, res.stdout + res.stderr
    err = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in res.stderr
    assert "failed for every type tried" in err[0]
    for q in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"):
        assert f"{q}: perplexity" in err[0]
    assert not out.exists()
    # Without --on-parity-fail fallback: the first miss fails, and the hint names the option.
    res = run_cli("build", tiny_llama, "--profile", profile, "-o", out, "--quant-type", "Q4_K_M", "--no-progress")
    assert res.returncode == 5 and "--on-parity-fail fallback" in res.stderr and "Q5_K_M: perplexity" not in res.stderr
