# SPDX-License-Identifier: Apache-2.0
"""GGUF planning and header facts: the memory arithmetic per profile, requantization rules, bad files.

Model shapes are real published configurations (Llama-2-7B, Llama-2-70B, TinyLlama-1.1B) fed to the
planner as facts; the GGUF file is the real Gemma-3-270M Q4_K_M from the registry.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from edgesdk.errors import InputError, ModelError, ResourceError
from edgesdk.formats.gguf import facts as F
from edgesdk.formats.gguf import plan as G
from edgesdk.plan import BuildOptions, ModelFacts, plan_build
from edgesdk.profiles import resolve_profile

# (layers, hidden, heads, kv heads, ffn, vocab, ctx_train, params) from the models' config.json files
SHAPES = {
    "llama2-7b": (32, 4096, 32, 32, 11008, 32000, 4096, 6_738_415_616),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 8192, 8_030_261_248),
    "llama2-70b": (80, 8192, 64, 8, 28672, 32000, 4096, 68_976_648_192),
    "tinyllama-1.1b": (22, 2048, 32, 4, 5632, 32000, 2048, 1_100_048_384),
}


def hf_facts(shape: str) -> ModelFacts:
    layers, hidden, heads, kv, ffn, vocab, ctx, params = SHAPES[shape]
    extra = {
        "architecture": "LlamaForCausalLM",
        "gguf_supported": True,
        "layers": layers,
        "heads": heads,
        "kv_heads": kv,
        "hidden": hidden,
        "head_dim": hidden // heads,
        "ffn": ffn,
        "ctx_train": ctx,
        "n_vocab": vocab,
        "tokenizer_files": ["tokenizer.json"],
        "chat_template": True,
    }
    return ModelFacts(
        source=f"/models/{shape}",
        kind="hf",
        task="text-generation",
        name=shape,
        architecture="LlamaForCausalLM",
        family="llama",
        params=params,
        extra=extra,
    )


def total_bytes(facts: ModelFacts, quant: str, n_ctx: int) -> float:
    w = facts.params * G.BPW[quant] / 8
    return w + G.kv_bytes(facts.extra, n_ctx) + G.compute_bytes(facts.extra, w)


def decisions(plan) -> dict:
    return {d.key: d for d in plan.decisions}


def test_orin_nano_picks_the_largest_type_that_fits_and_explains_the_arithmetic():
    facts, profile = hf_facts("llama3-8b"), resolve_profile("orin-nano-8gb")
    plan = plan_build(facts, profile, BuildOptions())
    d = decisions(plan)
    quant, n_ctx = d["gguf.quant_type"].value, d["gguf.context_length"].value
    budget = profile.memory_budget_gb() * 1e9
    assert total_bytes(facts, quant, n_ctx) <= budget
    assert n_ctx == profile.llm.context_length
    order = profile.llm.quant_order
    assert order is not None
    for bigger in order[: order.index(quant)]:  # every larger type was rejected for a real reason
        assert total_bytes(facts, bigger, profile.llm.context_length) > budget
    reason = d["gguf.quant_type"].reason
    assert "bpw" in reason and "KV" in reason and f"{profile.memory_budget_gb()} GB" in reason
    assert "explain" not in reason  # the arithmetic itself, not a pointer to it
    assert plan.format == "gguf" and d["gguf.flash_attn"].value is False  # sm_87 kernel table says no
    assert "gguf.quant_type" in plan.explain()


def test_short_context_when_no_type_fits_at_the_planned_length():
    facts, profile = hf_facts("llama2-7b"), resolve_profile("orin-nano-8gb")  # no GQA: 0.5 MB KV per token
    d = decisions(plan_build(facts, profile, BuildOptions()))
    quant, n_ctx = d["gguf.quant_type"].value, d["gguf.context_length"].value
    llm = profile.llm
    assert llm.quant_order is not None and llm.context_length is not None and quant == llm.quant_order[-1]
    assert (llm.min_context_length or 512) <= n_ctx < llm.context_length and n_ctx % 256 == 0
    assert total_bytes(facts, quant, n_ctx) <= profile.memory_budget_gb() * 1e9
    assert total_bytes(facts, quant, n_ctx + 256) > profile.memory_budget_gb() * 1e9
    assert "shortened" in d["gguf.context_length"].reason


def test_too_large_for_the_profile_at_any_type_is_a_resource_error_with_numbers():
    with pytest.raises(ResourceError) as err:
        plan_build(hf_facts("llama2-70b"), resolve_profile("orin-nano-8gb"), BuildOptions())
    msg = err.value.one_line()
    assert "does not fit" in msg and "GB" in msg and "budget is" in msg and "\n" not in msg
    assert err.value.exit_code == 8


def test_h200_keeps_f16_offloads_everything_and_uses_flash_attention():
    d = decisions(plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions()))
    assert d["gguf.quant_type"].value == "F16"
    assert d["gguf.n_gpu_layers"].value == "all"
    assert d["gguf.flash_attn"].value is True
    assert d["gguf.context_length"].value == 2048  # capped at the model's trained context
    assert "trained context" in d["gguf.context_length"].reason


def test_cpu_profile_no_offload_and_a_profile_without_memory_figure(tmp_path):
    profile = resolve_profile("cpu-x86_64")
    d = decisions(plan_build(hf_facts("tinyllama-1.1b"), profile, BuildOptions()))
    assert d["gguf.n_gpu_layers"].value == 0 and d["gguf.flash_attn"].value is False
    import yaml

    data = dict(profile.data, name="cpu-unknown-memory")
    data["device"] = dict(
        data["device"], memory={"total_gb": None, "usable_gb": None, "unified": True, "bandwidth_gbps": None}
    )
    data["policy"] = {k: v for k, v in data["policy"].items() if k != "memory_budget_gb"}
    path = tmp_path / "cpu-unknown-memory.yaml"
    path.write_text(yaml.safe_dump(data))
    d = decisions(plan_build(hf_facts("tinyllama-1.1b"), resolve_profile(str(path)), BuildOptions()))
    assert d["gguf.quant_type"].value == data["policy"]["llm"]["quant_order"][0]
    assert "no memory figure" in d["gguf.quant_type"].reason


def test_unknown_quant_type_is_an_input_error():
    with pytest.raises(InputError, match="unknown GGUF quantization type 'Q9_X'"):
        plan_build(hf_facts("tinyllama-1.1b"), resolve_profile("h200"), BuildOptions(quant_type="Q9_X"))


def test_unsupported_architecture_and_missing_tokenizer_fail_at_plan_time():
    facts = hf_facts("tinyllama-1.1b")
    facts.extra.update(architecture="GPT2LMHeadModel", gguf_supported=False)
    from edgesdk.formats.gguf.archs import ARCHS  # the registry: the message lists every family in it

    with pytest.raises(
        ModelError,
        match=r"architecture GPT2LMHeadModel not supported .*supported: " + re.escape(", ".join(sorted(ARCHS))),
    ):
        plan_build(facts, resolve_profile("h200"), BuildOptions())
    facts = hf_facts("tinyllama-1.1b")
    facts.extra["tokenizer_files"] = []
    with pytest.raises(ModelError, match="tokenizer missing"):
        plan_build(facts, resolve_profile("h200"), BuildOptions())


# ---------------------------------------------------------------------------------------------
# The real Gemma GGUF


def test_gguf_facts_of_gemma(gemma_gguf):
    f = F.gguf_facts(gemma_gguf)
    assert f["architecture"] == "gemma3" and f["file_type"] == "Q4_K_M" and f["license"] == "gemma"
    assert f["layers"] == 18 and f["n_vocab"] == 262144 and 2.5e8 < f["params"] < 2.9e8
    assert f["tensor_bytes"] <= os.path.getsize(gemma_gguf)


def test_quantized_gguf_is_repackaged_and_never_requantized_up(gemma_gguf):
    from edgesdk.plan import inspect_model

    facts = inspect_model(gemma_gguf)
    d = decisions(plan_build(facts, resolve_profile("orin-nano-8gb"), BuildOptions()))
    assert d["gguf.quant_type"].value == "Q4_K_M"  # Q8_0..Q5_K_M come first in the order but are higher
    assert d["gguf.source"].value.startswith("repackage")
    assert "cannot restore precision" in d["gguf.quant_type"].reason
    with pytest.raises(
        ModelError, match="cannot requantize an already-quantized Q4_K_M file to the higher-precision type Q8_0"
    ):
        plan_build(facts, resolve_profile("orin-nano-8gb"), BuildOptions(quant_type="Q8_0"))
    down = decisions(plan_build(facts, resolve_profile("orin-nano-8gb"), BuildOptions(quant_type="Q3_K_M")))
    assert down["gguf.source"].value == "requantize Q4_K_M -> Q3_K_M with llama.cpp quantize"


@pytest.fixture(scope="module")
def truncated_gguf(gemma_gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "truncated.gguf"
    with open(gemma_gguf, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(8 * 1024 * 1024))  # header intact, tensor data cut short
    return path


def test_truncated_and_random_files_are_one_line_model_errors(truncated_gguf, tmp_path):
    with pytest.raises(ModelError, match="truncated GGUF file"):
        F.gguf_facts(truncated_gguf)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(ModelError, match="not a valid GGUF file"):
        F.gguf_facts(junk)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**40).to_bytes(8, "little") * 2)
    with pytest.raises(ModelError, match="implausible header"):
        F.gguf_facts(header_only)


def test_cli_build_of_truncated_gguf_exits_3_with_one_line_and_no_bundle(truncated_gguf, tmp_path, run_cli):
    out = tmp_path / "bundle"
    proc = run_cli("build", truncated_gguf, "--profile", "orin-nano-8gb", "-o", out, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "truncated GGUF" in lines[0]
    assert not out.exists()


def test_llama_cpp_load_of_truncated_file_in_child_probe_leaves_host_alive(truncated_gguf):
    pytest.importorskip("llama_cpp")
    from edgesdk.runtime.backends.llamacpp import _probe_in_child

    why = _probe_in_child(str(truncated_gguf), 0, False, 256)
    assert why is not None and ("failed" in why or "crashed" in why)
    # and this process is still here to assert it; the same load in-process also only raises:
    code = (
        "import llama_cpp,sys\ntry:\n    llama_cpp.Llama(sys.argv[1], verbose=False)\n"
        "except ValueError:\n    sys.exit(7)"
    )
    assert subprocess.run([sys.executable, "-c", code, str(truncated_gguf)], timeout=120).returncode == 7


def test_the_chat_template_decision_is_a_typed_field_that_prints_as_before(gemma_gguf, tmp_path):
    import dataclasses
    from types import SimpleNamespace

    from edgesdk.formats.gguf.build import bundle_chat_template
    from edgesdk.inspect import inspect_model

    plan = plan_build(inspect_model(gemma_gguf), resolve_profile("cpu-x86_64"), BuildOptions(chat_template="chatml"))
    assert plan.section.chat_template == G.ChatTemplateChoice("chatml", "requested")
    value = {d["key"]: d["value"] for d in plan.to_dict()["decisions"]}["gguf.chat_template"]
    assert value == {"template": "chatml", "source": "requested"} == plan.decision("gguf.chat_template")
    retyped = G.GgufPlan.from_decisions(plan.section.decisions())  # a plan made elsewhere is typed the same way
    assert retyped.chat_template == plan.section.chat_template and retyped.decisions() == plan.section.decisions()
    added = []
    ctx = SimpleNamespace(plan=plan, staging=tmp_path, add_artifact=lambda rel, role: added.append((rel, role)))
    assert bundle_chat_template(ctx) == {"template": "chatml", "source": "requested", "file": "chat_template.jinja"}
    assert added == [("chat_template.jinja", "chat_template")] and (tmp_path / "chat_template.jinja").is_file()
    own = plan_build(inspect_model(gemma_gguf), resolve_profile("cpu-x86_64"))  # the architecture's template
    assert own.section.chat_template == G.ChatTemplateChoice("gemma", "architecture")
    undecided = dataclasses.replace(own, section=dataclasses.replace(own.section, chat_template=None))
    assert bundle_chat_template(SimpleNamespace(plan=undecided, staging=tmp_path)) is None
