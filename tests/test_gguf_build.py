# SPDX-License-Identifier: Apache-2.0
"""HF causal LM -> GGUF for real: small random-weight Llama and Qwen2 models built from transformers
configs (real architectures, random numbers), with a real byte-level BPE tokenizer trained here on
the built-in text (no hub). Converted files load in llama.cpp and match the HF logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

from cli_fixtures import THREADS  # noqa: E402

from edgesdk.errors import InputError, ModelError, ShapeError  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tiny_causal_lm(
    directory: Path,
    family: str,
    *,
    tokenizer: bool = True,
    license_card: bool = True,
    rope_theta: float | None = None,
    layout: str = "transformers4",
) -> Path:
    """A 2-layer, hidden-256 model of ``family`` (llama|qwen2) with random weights and a BPE tokenizer.

    ``layout="transformers5"``: saved by this transformers 4.57, then rewritten as transformers 5 saves it
    (``rope_parameters`` in config.json, its tokenizer_config.json, no special_tokens_map.json:
    ``vlm_fixtures.to_transformers5_layout``, checked against real transformers 5 saves)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT

    final = directory
    if layout == "transformers5":
        directory = directory.with_name(directory.name + "-tf4")
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        PPL_TEXT.read_text().split("\n"),
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|bos|>", "<|end|>", "<|user|>", "<|assistant|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    if tokenizer:
        fast.save_pretrained(directory)
    kw = dict(
        vocab_size=len(tok.get_vocab()),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        **({"rope_theta": rope_theta} if rope_theta is not None else {}),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**kw)) if family == "llama" else Qwen2ForCausalLM(Qwen2Config(**kw))
    model.save_pretrained(directory, safe_serialization=True)
    if license_card:
        (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\nRandom weights for tests.\n")
    if layout == "transformers5":
        from vlm_fixtures import to_transformers5_layout

        return to_transformers5_layout(directory, final)
    return directory


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_causal_lm(tmp_path_factory.mktemp("hf") / "tiny-llama", "llama")


@pytest.fixture(scope="module")
def tiny_llama_bundle(tiny_llama, tmp_path_factory) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles") / "tiny-llama-nano"
    return build(tiny_llama, "orin-nano-8gb", out, BuildOptions(progress=False))


@pytest.mark.slow
def test_llama_hf_to_gguf_bundle_matches_hf_logits_and_records_parity(tiny_llama_bundle):
    m = json.loads((tiny_llama_bundle / "manifest.json").read_text())
    assert m["format"] == "gguf" and m["precision"] == "Q8_0"  # first type of orin-nano-8gb's order fits
    parity = m["parity"]
    assert parity["logits_vs_hf"]["min_cosine"] >= 0.999 and parity["logits_vs_hf"]["top1_agreement"] >= 0.95
    assert parity["logits_vs_hf"]["tokenizer_agreement"].startswith("4/4")
    assert parity["reference"] == "F16 conversion" and parity["ppl_ratio"] <= parity["thresholds"]["ppl_ratio_max"]
    llm = m["extras"]["llm"]
    assert llm["chat_template"] and llm["n_gpu_layers"] == "all" and llm["flash_attn"] is False
    assert "llama-cpp-python" in m["runtime"]["requires"]
    assert [a["role"] for a in m["artifacts"]].count("model") == 1
    assert m["license"]["verdict"] == "pass"


@pytest.mark.slow
def test_llama_transformers5_checkpoint_builds_with_parity(tmp_path):
    """A checkpoint in the transformers 5 layout (rope_parameters with a non-default rope_theta, its
    tokenizer_config.json) builds on this transformers 4.57 with the same parity checks."""
    import gguf

    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    hf = make_tiny_causal_lm(tmp_path / "tiny-llama-tf5", "llama", rope_theta=5e5, layout="transformers5")
    assert not (hf / "special_tokens_map.json").exists()
    bundle = build(hf, "orin-nano-8gb", tmp_path / "out", BuildOptions(progress=False))
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["format"] == "gguf" and m["precision"] == "Q8_0"
    parity = m["parity"]
    assert parity["logits_vs_hf"]["min_cosine"] >= 0.999 and parity["logits_vs_hf"]["top1_agreement"] >= 0.95
    assert parity["logits_vs_hf"]["tokenizer_agreement"].startswith("4/4")
    assert gguf.GGUFReader(str(bundle / "model.gguf")).fields["llama.rope.freq_base"].contents() == 5e5


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_qwen2_converts_and_matches_hf_logits(tmp_path, layout):
    """Both checkpoint layouts, with Qwen2's own rope_theta (1e6, not the 10000 default): a rope_theta read from
    the wrong place would show in the logits."""
    import gguf

    from edgesdk.formats.gguf import convert as conv
    from edgesdk.formats.gguf.build import PPL_TEXT
    from edgesdk.formats.gguf.facts import gguf_facts

    hf = make_tiny_causal_lm(tmp_path / "tiny-qwen2", "qwen2", rope_theta=1e6, layout=layout)
    assert ("rope_parameters" in json.loads((hf / "config.json").read_text())) == (layout == "transformers5")
    out = tmp_path / "qwen2-f16.gguf"
    info = conv.convert_hf_to_gguf(hf, out)
    assert info["gguf_architecture"] == "qwen2" and info["tokenizer_pre"] == "gpt-2"
    facts = gguf_facts(out)
    assert facts["architecture"] == "qwen2" and facts["file_type"] == "F16" and facts["license"] == "apache-2.0"
    assert gguf.GGUFReader(str(out)).fields["qwen2.rope.freq_base"].contents() == 1e6
    parity = conv.logits_parity(hf, out, PPL_TEXT.read_text())
    assert parity["min_cosine"] >= 0.999 and parity["top1_agreement"] >= 0.95, parity
    q4 = tmp_path / "qwen2-q4_k_m.gguf"
    conv.quantize(out, q4, "Q4_K_M", threads=THREADS)
    assert gguf_facts(q4)["file_type"] == "Q4_K_M" and q4.stat().st_size < out.stat().st_size


@pytest.mark.slow
def test_chat_uses_the_models_own_template_and_stops_at_end_token(tiny_llama_bundle):
    import edgesdk

    with edgesdk.load(tiny_llama_bundle) as s:
        msgs = [{"role": "user", "content": "hello"}]
        s.chat(msgs, max_tokens=4, temperature=0)
        last = s.backend.last
        rendered = "<|user|>hello<|end|><|assistant|>"
        assert last["input_tokens"] == len(s.backend.engine.tokenize(rendered, add_bos=True, special=True))
        assert last["output_tokens"] <= 4
        pieces = list(s.chat(msgs, max_tokens=4, temperature=0, stream=True))
        assert "".join(pieces) == s.chat(msgs, max_tokens=4, temperature=0)
        with pytest.raises(InputError, match="unknown generation option"):
            s.chat(msgs, max_token=4)


@pytest.mark.slow
def test_gpu_profile_on_a_cpu_build_falls_back_and_says_why(tiny_llama_bundle):
    import llama_cpp

    import edgesdk

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build offloads to a GPU")
    with edgesdk.load(tiny_llama_bundle, profile="h200") as s:
        rep = s.report()
        assert rep["device"] == "cpu" and rep["backend_report"]["n_gpu_layers"] == 0
        (fb,) = rep["fallbacks"]
        assert "GPU" in fb["from"] and "flash attention on" in fb["from"] and "CPU" in fb["to"]
        assert "no GPU offload" in fb["reason"]
        assert rep["backend_report"]["probe"] == "in-process"  # sm_90 is not marked risky
    with edgesdk.load(tiny_llama_bundle) as s:  # built for orin-nano-8gb: sm_87 probes in a child first
        assert s.report()["backend_report"]["probe"].startswith("child process")
        with pytest.raises(ShapeError, match=r"prompt is \d+ tokens; the context holds 512"):
            s.generate("word " * 600, max_tokens=1)


def test_unsupported_architecture_and_missing_tokenizer_via_cli(tmp_path, run_cli):
    import numpy as np
    from safetensors.numpy import save_file

    gpt2 = tmp_path / "gpt2-like"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "vocab_size": 10})
    )
    save_file({"wte.weight": np.zeros((10, 4), dtype=np.float32)}, str(gpt2 / "model.safetensors"))
    proc = run_cli("build", gpt2, "--profile", "orin-nano-8gb", "-o", tmp_path / "o1", timeout=120)
    assert proc.returncode == 3
    from edgesdk.formats.gguf.archs import ARCHS  # the registry: one line per text architecture

    assert proc.stderr.strip() == (
        f"error: architecture GPT2LMHeadModel not supported for GGUF conversion (supported: {', '.join(sorted(ARCHS))})"
    )
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"} <= set(
        ARCHS
    )
    notok = tmp_path / "no-tokenizer"
    notok.mkdir()
    (notok / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "hidden_size": 8,
                "vocab_size": 10,
                "max_position_embeddings": 64,
            }
        )
    )
    save_file({"model.embed_tokens.weight": np.zeros((10, 8), dtype=np.float32)}, str(notok / "model.safetensors"))
    proc = run_cli("build", notok, "--profile", "orin-nano-8gb", "-o", tmp_path / "o2", timeout=120)
    assert proc.returncode == 3 and "tokenizer missing" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_rope_scaling_variant_is_rejected_by_the_converter(tmp_path):
    from edgesdk.formats.gguf import convert as conv

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    )
    with pytest.raises(ModelError, match="rope_scaling 'llama3' is not supported"):
        conv.convert_hf_to_gguf(d, tmp_path / "x.gguf")
    # transformers 5 writes the same as rope_parameters
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0},
            }
        )
    )
    with pytest.raises(ModelError, match="rope_scaling 'llama3' is not supported"):
        conv.convert_hf_to_gguf(d, tmp_path / "x.gguf")


@pytest.mark.slow
def test_corrupted_model_in_bundle_is_refused_or_fails_every_attempt_cleanly(tiny_llama_bundle, tmp_path):
    import shutil

    import edgesdk
    from edgesdk.errors import BackendUnavailableError, BundleIntegrityError

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_llama_bundle, copy)
    model = copy / "model.gguf"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    with pytest.raises(BundleIntegrityError, match="size mismatch for model.gguf"):
        edgesdk.load(copy)
    # Skipping verification reaches llama.cpp itself: the child probe (orin profile: sm_87 is risky)
    # and the in-process attempt fail with one line each, and this process survives to see it.
    with pytest.raises(BackendUnavailableError, match=r"llama.cpp could not load .*failed in a child probe"):
        edgesdk.load(copy, verify=False)


def make_sentencepiece_style_llama(directory: Path) -> Path:
    """Llama-2-style tokenizer.json (BPE with byte fallback, '▁' for spaces) + a tiny random llama."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from edgesdk.formats.gguf.build import PPL_TEXT

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(
        PPL_TEXT.read_text().split("\n"), trainers.BpeTrainer(vocab_size=600, special_tokens=special)
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        directory
    )
    torch.manual_seed(1)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok.get_vocab()),
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            bos_token_id=1,
            eos_token_id=2,
        )
    ).save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_sentencepiece_style_tokenizer_gets_merge_rank_scores_and_tokenizes_like_hf(tmp_path):
    from edgesdk.formats.gguf import convert as conv
    from edgesdk.formats.gguf.build import PPL_TEXT

    hf = make_sentencepiece_style_llama(tmp_path / "sp-llama")
    out = tmp_path / "f16.gguf"
    assert conv.convert_hf_to_gguf(hf, out)["tokenizer_model"] == "llama"
    parity = conv.logits_parity(hf, out, PPL_TEXT.read_text())
    # without merge-rank scores (gguf-py gives every token -1000) llama.cpp tokenized 0 of 4 alike
    assert parity["tokenizer_agreement"].startswith("4/4"), parity
    assert parity["min_cosine"] >= 0.999
