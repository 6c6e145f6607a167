# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight models of the text families beyond llama / qwen2 (Gemma-3, Qwen3, Phi-3 / Phi-4-mini),
each built from its family's published config.json values (rope type and scaling, norms, head layout, tied
output, vocabulary handling) with fewer layers and a smaller width, and a tokenizer trained here on the built-in
text. Shared by tests/test_families_text*.py and tools/bench (no hub, no real weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
FAMILIES = ("gemma3", "qwen3", "phi3", "phi4mini", "mistral")

# The published values each tiny config keeps, and what it shrinks (docs/benchmarks.md, "Text families").
# Gemma-3-270M / 1B: head_dim 256 and query_pre_attn_scalar = head_dim, 1 KV head, rope_theta 1e6 (global) and
# rope_local_base_freq 1e4 (sliding), no rope scaling, 5 sliding layers : 1 global (sliding_window 512),
# gelu_pytorch_tanh, rms_norm_eps 1e-6, tied embeddings, SentencePiece-style tokenizer without a space prefix.
# Qwen3-0.6B: head_dim 128 on a 1024-wide model (not hidden / heads), q/k norms, GQA 16:8, rope_theta 1e6,
# rms_norm_eps 1e-6, no attention bias, tied embeddings, byte-level BPE.
# Phi-4-mini: GQA 24:8, partial_rotary_factor 0.75, rope_theta 1e4, longrope (original 4096, max 131072),
# rms_norm_eps 1e-5, tied embeddings, fused qkv / gate_up, byte-level BPE. Phi-3-mini-4k: MHA, full rotary, no
# rope scaling, sliding_window 2047, untied output.


def _factors(n: int, top: float) -> list[float]:
    """n rope divisors rising from 1.0 to ``top`` (the shape of Phi's published short/long factors: 1.0 for the
    fastest dims, growing toward the slow ones)."""
    return [round(1.0 + (top - 1.0) * (i / (n - 1)) ** 2, 6) for i in range(n)]


def _tokenizer(directory: Path, style: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from edgesdk.formats.gguf.build import PPL_TEXT

    lines = PPL_TEXT.read_text().split("\n")
    if style == "phi3":  # Phi-3-mini / Mistral: Llama-2's SentencePiece vocabulary ("▁" prepended) + chat tokens
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        special = (
            ["<unk>", "<s>", "</s>"]
            + [f"<0x{i:02X}>" for i in range(256)]
            + ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"]
        )
        tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=700, special_tokens=special))
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="<|endoftext|>", unk_token="<unk>"
        )
    elif style == "gemma3":  # Gemma's tokenizer.json: BPE with byte fallback, spaces as "▁", no "▁" prepended
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"] + [
            f"<0x{i:02X}>" for i in range(256)
        ]
        tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=700, special_tokens=special))
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>"
        )
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            lines,
            trainers.BpeTrainer(
                vocab_size=400,
                special_tokens=["<|bos|>", "<|end|>", "<|user|>", "<|assistant|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def make_family_model(
    directory: Path, family: str, *, layout: str = "transformers4", seed: int = 0, **overrides: Any
) -> Path:
    """A random-weight ``family`` model (one of :data:`FAMILIES`) in ``directory``; ``overrides`` change config
    values. ``layout="transformers5"``: saved by this transformers 4.57, then rewritten as transformers 5 saves it
    (``vlm_fixtures.to_transformers5_layout``)."""
    import torch

    final = directory
    if layout == "transformers5":
        directory = directory.with_name(directory.name + "-tf4")
    directory.mkdir(parents=True, exist_ok=True)
    fast = _tokenizer(directory, {"gemma3": "gemma3", "phi3": "phi3", "mistral": "phi3"}.get(family, "bytelevel"))
    common: dict[str, Any] = dict(
        vocab_size=len(fast),
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        max_position_embeddings=512,
    )
    if family == "gemma3":
        from transformers import Gemma3ForCausalLM as Model
        from transformers import Gemma3TextConfig as Config

        kw: dict[str, Any] = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=64,
            query_pre_attn_scalar=64,
            rope_theta=1_000_000.0,
            rope_local_base_freq=10_000.0,
            rope_scaling=None,
            sliding_window=24,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            tie_word_embeddings=True,
            pad_token_id=fast.pad_token_id,
        )
    elif family == "qwen3":
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model

        kw = dict(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            attention_bias=False,
            use_sliding_window=False,
            tie_word_embeddings=True,
        )
    elif family == "phi4mini":
        from transformers import Phi3Config as Config
        from transformers import Phi3ForCausalLM as Model

        # head_dim 32, 0.75 of it rotary = 24 dims -> 12 factors (Phi-4-mini: 96 dims, 48 factors)
        kw = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            partial_rotary_factor=0.75,
            rope_theta=10_000.0,
            rms_norm_eps=1e-5,
            original_max_position_embeddings=4096,
            max_position_embeddings=131072,
            rope_scaling={"type": "longrope", "short_factor": _factors(12, 1.6), "long_factor": _factors(12, 24.0)},
            sliding_window=262144,
            tie_word_embeddings=True,
            hidden_act="silu",
            pad_token_id=None,
        )
        common.pop("max_position_embeddings")
    elif family == "phi3":
        from transformers import Phi3Config as Config
        from transformers import Phi3ForCausalLM as Model

        kw = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            rope_theta=10_000.0,
            rms_norm_eps=1e-5,
            rope_scaling=None,
            original_max_position_embeddings=4096,
            max_position_embeddings=4096,
            sliding_window=2047,
            tie_word_embeddings=False,
            hidden_act="silu",
            pad_token_id=None,
        )
        common.pop("max_position_embeddings")
    elif family == "mistral":
        from transformers import MistralConfig as Config
        from transformers import MistralForCausalLM as Model

        # Mistral-7B v0.3: GQA 32:8, rope_theta 1e6, no sliding window, untied, Llama SentencePiece vocabulary;
        # head_dim 64 on a 128-wide, 4-head model as Mistral-Nemo's 128 on 5120 / 32 (not hidden / heads)
        kw = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-5,
            sliding_window=None,
            tie_word_embeddings=False,
            hidden_act="silu",
        )
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = Model(Config(**{**common, **kw, **overrides}))
    with torch.no_grad():  # random norms: HF initialises them to 1 (Gemma: 0), which would hide a missed +1
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(p + 0.1 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\nRandom weights for tests.\n")
    if layout == "transformers5":
        from vlm_fixtures import to_transformers5_layout

        out = to_transformers5_layout(directory, final)
        if family == "gemma3":  # transformers 5's Gemma3TextConfig: rope per layer type, no rope_local_base_freq
            import json

            cfg = json.loads((out / "config.json").read_text())
            full = cfg.pop("rope_parameters")
            cfg["rope_parameters"] = {
                "full_attention": full,
                "sliding_attention": {"rope_theta": cfg.pop("rope_local_base_freq"), "rope_type": "default"},
            }
            (out / "config.json").write_text(json.dumps(cfg, indent=2))
        return out
    return directory
