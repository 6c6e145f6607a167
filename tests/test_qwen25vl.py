# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): a random-weight model built from Qwen2.5-VL-3B-Instruct's
published configuration, shrunk, converted to a qwen2vl decoder GGUF (M-RoPE) + a ``qwen2.5vl_merger`` mmproj, and
checked against PyTorch (issue 21).

Qwen/Qwen2.5-VL-3B-Instruct's config.json values kept: decoder hidden_act silu, rope_theta 1e6,
``rope_scaling {type: mrope, mrope_section: [16, 24, 24]}`` (so the heads stay 128 wide: the sections cover
head_dim / 2), rms_norm_eps 1e-6, tied output, grouped KV heads, no sliding window; vision tower hidden_act silu,
patch_size 14, temporal_patch_size 2, spatial_merge_size 2, window_size 112, ``fullatt_block_indexes`` every 8th
block as [7, 15, 23, 31] of 32 (here every 2nd of 4: [1, 3]), tokens_per_second 2, heads 80 wide (1280 / 16), FFN
2.67x the width; its preprocessor_config.json: Qwen2VLImageProcessor, min_pixels 3136, max_pixels 12845056,
CLIP mean/std, merge_size 2. Shrunk: decoder 4 layers of width 256 (2 heads of 128, 1 KV head, FFN 1376 = 5.375x
as 11008 / 2048), tower 4 blocks of width 160 (2 heads of 80, FFN 432); a byte-level BPE tokenizer trained here
with Qwen's special tokens. RANDOM weights: it describes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

QWEN25VL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                     "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                     "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2.5-VL-3B-Instruct's chat_template.json (add_vision_id left out: it defaults to off)
QWEN25VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or "
    "'image_url' in content %}{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# test images: three sizes, so the image tokens differ (smart_resize to multiples of 28: 252 x 196 -> 9 x 7 = 63
# tokens over 3 x 2 attention windows; 140 x 308 -> 5 x 11 = 55; 84 x 56 -> 3 x 2 = 6, below llama.cpp's default
# minimum of 8 tokens)
QWEN25VL_IMAGE_SIZES = ((250, 190), (140, 300), (96, 60))


def make_tiny_qwen25vl(directory: Path, *, seed: int = 0, init: float = 0.06) -> Path:
    """Save the random-weight tiny Qwen2.5-VL (module docstring) in ``directory``."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2TokenizerFast,
        Qwen2VLImageProcessor,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT
    from tests.vlm_fixtures import byte_bpe

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = PPL_TEXT.read_text().split("\n")
    corpus = lines + ["\n\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)] + ["user\n", "assistant\n",
                                                                                       "system\n"] * 20
    tok = byte_bpe(corpus, 480, QWEN25VL_SPECIALS)
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
                              unk_token=None, additional_special_tokens=QWEN25VL_SPECIALS[1:],
                              chat_template=QWEN25VL_CHAT_TEMPLATE)
    fast.save_pretrained(directory)
    image_processor = Qwen2VLImageProcessor(
        do_resize=True, resample=3, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
        do_convert_rgb=True, min_pixels=3136, max_pixels=12845056, patch_size=14, temporal_patch_size=2,
        merge_size=2)
    image_processor.save_pretrained(directory)
    pre = json.loads((directory / "preprocessor_config.json").read_text())
    pre["processor_class"] = "Qwen2_5_VLProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    ids = {t: fast.convert_tokens_to_ids(t) for t in QWEN25VL_SPECIALS}
    text = dict(vocab_size=len(fast), hidden_size=256, intermediate_size=1376, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, hidden_act="silu", max_position_embeddings=128000,
                rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                sliding_window=32768, use_sliding_window=False, max_window_layers=70, tie_word_embeddings=True,
                attention_dropout=0.0, initializer_range=init, bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"])
    vision = dict(depth=4, hidden_act="silu", hidden_size=160, intermediate_size=432, num_heads=2, in_chans=3,
                  out_hidden_size=256, patch_size=14, spatial_merge_size=2, spatial_patch_size=14, window_size=112,
                  fullatt_block_indexes=[1, 3], tokens_per_second=2, temporal_patch_size=2, initializer_range=0.02)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"], **text)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(directory, safe_serialization=True)
    # transformers 4.57's Qwen2_5_VLConfig hands ``architectures`` to text_config, so its save has none at the top;
    # the hub's config.json (what users download) has it there
    cfg = json.loads((directory / "config.json").read_text())
    cfg["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
    (directory / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": QWEN25VL_CHAT_TEMPLATE}, indent=2))
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# tiny-qwen2.5-vl (random weights)\n\nQwen2.5-VL-3B-Instruct's architecture "
        "(shrunk) built from transformers configs with RANDOM weights for tests: it describes nothing.\n",
        encoding="utf-8")
    return directory


def make_qwen25vl_images(directory: Path) -> list[Path]:
    """The three test images (:data:`QWEN25VL_IMAGE_SIZES`): a gradient, a checkerboard, noise."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    rng = np.random.default_rng(1)
    for i, (w, h) in enumerate(QWEN25VL_IMAGE_SIZES):
        y, x = np.mgrid[0:h, 0:w]
        a = [np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (w + h - 2)], axis=-1),
             np.stack([((x // 12 + y // 12) % 2) * 255] * 3, axis=-1),
             rng.integers(0, 256, size=(h, w, 3))][i]
        out.append(directory / f"qwen{i}_{w}x{h}.png")
        Image.fromarray(a.astype(np.uint8)).save(out[-1])
    return out
