# SPDX-License-Identifier: Apache-2.0
"""The draft model counts in the plan's memory budget (issue 37): ``edgesdk build MODEL --draft SMALL`` plans the
model's type and context with the draft's weights, compute buffer and KV cache beside the model's, and sizes the
serving slots with the draft's KV per slot. The model is a published shape fed as facts (Llama-3-8B, as
tests/test_gguf_plan.py does); the draft is a real HF directory of Llama-3.2-1B's shape (config.json and a
safetensors file whose header declares its tensors; the data is a sparse file of zeros), read by the planner's own
``--draft`` reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_gguf_plan import hf_facts

from edgesdk.errors import ResourceError
from edgesdk.formats.gguf import plan as G
from edgesdk.plan import BuildOptions, plan_build
from edgesdk.profiles import resolve_profile

# Llama-3.2-1B (config.json): 16 layers, hidden 2048, 32 heads, 8 KV heads, ffn 8192, vocabulary 128256, tied
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 16, 2048, 32, 8, 8192, 128256


def _llama_1b(root: Path) -> Path:
    root.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "intermediate_size": FFN, "vocab_size": VOCAB, "max_position_embeddings": 131072, "tie_word_embeddings": True,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(cfg))
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": [VOCAB, HIDDEN], "model.norm.weight": [HIDDEN]}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [HIDDEN, HIDDEN], p + "self_attn.k_proj.weight": [kv, HIDDEN],
            p + "self_attn.v_proj.weight": [kv, HIDDEN], p + "self_attn.o_proj.weight": [HIDDEN, HIDDEN],
            p + "mlp.gate_proj.weight": [FFN, HIDDEN], p + "mlp.up_proj.weight": [FFN, HIDDEN],
            p + "mlp.down_proj.weight": [HIDDEN, FFN], p + "input_layernorm.weight": [HIDDEN],
            p + "post_attention_layernorm.weight": [HIDDEN],
        }  # fmt: skip
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 2 * math.prod(shape)  # BF16
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(root / "model.safetensors", "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        fh.truncate(8 + len(raw) + at)  # sparse: the planner reads the header only
    return root


@pytest.fixture(scope="module")
def draft_1b(tmp_path_factory) -> Path:
    return _llama_1b(tmp_path_factory.mktemp("draft") / "llama-3.2-1b")


def _decisions(facts, profile, draft: Path | None) -> dict:
    options = BuildOptions(extra={"draft": str(draft)}) if draft is not None else BuildOptions()
    return {d.key: d for d in plan_build(facts, profile, options).decisions}


def _draft_bytes(quant: str, n_ctx: int, n_ubatch: int) -> float:
    params = 1_235_814_400  # Llama-3.2-1B
    w = params * G.BPW[quant] / 8
    shape = {"layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HIDDEN // HEADS, "n_vocab": VOCAB, "hidden": HIDDEN,
             "ffn": FFN}  # fmt: skip
    return w + G.compute_bytes(shape, w, n_ubatch) + G.kv_bytes(shape, n_ctx)


def _model_bytes(facts, quant: str, n_ctx: int, n_ubatch: int) -> float:
    w = facts.params * G.BPW[quant] / 8
    return w + G.kv_bytes(facts.extra, n_ctx) + G.compute_bytes(facts.extra, w, n_ubatch)


def _fits(facts, d: dict, budget: float, draft: bool) -> bool:
    q, c, u = (d[k].value for k in ("gguf.quant_type", "gguf.context_length", "gguf.n_ubatch"))
    return _model_bytes(facts, q, c, u) + (_draft_bytes(q, c, u) if draft else 0) <= budget


def test_the_draft_model_moves_the_type_down(draft_1b):
    """Llama-3-8B on orin-nx-16gb: alone, its plan's type fits at the profile's context; with a 1B draft that plan
    would exceed the budget, so the plan takes a smaller type, whose total with the draft fits, and the reason shows
    the draft's share."""
    facts, profile = hf_facts("llama3-8b"), resolve_profile("orin-nx-16gb")
    budget = profile.memory_budget_gb() * G.GB
    alone, both = _decisions(facts, profile, None), _decisions(facts, profile, draft_1b)
    assert _fits(facts, alone, budget, False) and not _fits(facts, alone, budget, True)
    order = profile.llm.quant_order
    q0, q1 = alone["gguf.quant_type"].value, both["gguf.quant_type"].value
    assert order is not None and order.index(q1) > order.index(q0)  # a smaller type
    assert both["gguf.context_length"].value == alone["gguf.context_length"].value
    assert _fits(facts, both, budget, True)
    reason = both["gguf.quant_type"].reason
    assert "draft llama-3.2-1b (" in reason and f"{q0}: " in reason and "> budget" in reason, reason
    assert both["gguf.draft"].value["quant_type"] == q1  # the HF draft is quantized to the model's type


def test_the_draft_model_shortens_the_context(draft_1b):
    """Llama-2-7B (no GQA) on orin-nano-8gb fits only at a shortened context alone; with the draft's weights and
    KV cache beside it the context is shorter still, and the longest that fits."""
    facts, profile = hf_facts("llama2-7b"), resolve_profile("orin-nano-8gb")
    budget = profile.memory_budget_gb() * G.GB
    alone, both = _decisions(facts, profile, None), _decisions(facts, profile, draft_1b)
    c0, c1 = alone["gguf.context_length"].value, both["gguf.context_length"].value
    assert c1 < c0 and c1 % 256 == 0 and _fits(facts, both, budget, True)
    q, u = both["gguf.quant_type"].value, both["gguf.n_ubatch"].value
    assert _model_bytes(facts, q, c1 + 256, u) + _draft_bytes(q, c1 + 256, u) > budget
    assert "draft model's included" in both["gguf.quant_type"].reason


def test_the_draft_model_counts_in_the_serving_slots(draft_1b):
    """Llama-3-8B on orin-agx-32gb: the slots' share of the memory left holds fewer slots when each slot's draft KV
    cache and the draft's weights are counted."""
    facts, profile = hf_facts("llama3-8b"), resolve_profile("orin-agx-32gb")
    alone, both = _decisions(facts, profile, None), _decisions(facts, profile, draft_1b)
    assert both["gguf.quant_type"].value == alone["gguf.quant_type"].value
    assert both["serving.slots"].value < alone["serving.slots"].value
    assert "draft model" in both["serving.slots"].reason and "draft model" not in alone["serving.slots"].reason


def test_a_model_that_fits_only_without_its_draft_is_refused_with_the_draft_in_the_numbers(draft_1b):
    facts, profile = hf_facts("llama3-8b"), resolve_profile("orin-nano-8gb")
    _decisions(facts, profile, None)  # fits alone
    with pytest.raises(ResourceError) as err:
        _decisions(facts, profile, draft_1b)
    msg = err.value.one_line()
    assert "does not fit" in msg and "draft model" in msg and "\n" not in msg and err.value.exit_code == 8
