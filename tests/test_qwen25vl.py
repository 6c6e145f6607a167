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

QWEN25VL_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
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
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
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
    from vlm_fixtures import byte_bpe

    from edgesdk.formats.gguf.build import PPL_TEXT

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = PPL_TEXT.read_text().split("\n")
    corpus = (
        lines
        + ["\n\n".join(lines[i : i + 3]) for i in range(0, len(lines), 3)]
        + ["user\n", "assistant\n", "system\n"] * 20
    )
    tok = byte_bpe(corpus, 480, QWEN25VL_SPECIALS)
    fast = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=QWEN25VL_SPECIALS[1:],
        chat_template=QWEN25VL_CHAT_TEMPLATE,
    )
    fast.save_pretrained(directory)
    image_processor = Qwen2VLImageProcessor(
        do_resize=True,
        resample=3,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
        do_convert_rgb=True,
        min_pixels=3136,
        max_pixels=12845056,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    image_processor.save_pretrained(directory)
    pre = json.loads((directory / "preprocessor_config.json").read_text())
    pre["processor_class"] = "Qwen2_5_VLProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    ids = {t: fast.convert_tokens_to_ids(t) for t in QWEN25VL_SPECIALS}
    text = dict(
        vocab_size=len(fast),
        hidden_size=256,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_act="silu",
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=70,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        initializer_range=init,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
    )
    vision = dict(
        depth=4,
        hidden_act="silu",
        hidden_size=160,
        intermediate_size=432,
        num_heads=2,
        in_chans=3,
        out_hidden_size=256,
        patch_size=14,
        spatial_merge_size=2,
        spatial_patch_size=14,
        window_size=112,
        fullatt_block_indexes=[1, 3],
        tokens_per_second=2,
        temporal_patch_size=2,
        initializer_range=0.02,
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        **text,
    )
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
        encoding="utf-8",
    )
    return directory


def make_tiny_qwen2vl(directory: Path, *, seed: int = 0, init: float = 0.06) -> Path:
    """A random-weight tiny ``Qwen2VLForConditionalGeneration`` from Qwen/Qwen2-VL-2B-Instruct's published config.json
    values (decoder: silu, rope_theta 1e6, mrope_section [16, 24, 24], heads 128 wide, grouped KV heads,
    rms_norm_eps 1e-6, tied output; tower: quick_gelu, LayerNorms, embed_dim with mlp_ratio 4, heads 80 wide as
    1280 / 16, patch 14, temporal patch 2, merge 2, full attention in every block, ``hidden_size`` = the decoder's
    width) shrunk as :func:`make_tiny_qwen25vl` (decoder 4 x 256, FFN 1493 = 5.83x as 8960 / 1536; tower 4 blocks
    of embed_dim 160), with the same tokenizer, chat template and image processor (Qwen2-VL-2B's
    preprocessor_config.json has the same values). RANDOM weights. Its tests: tests/test_vlm_qwen2vl.py (it stays
    here: tools/bench/bench_vlm_families.py imports it from this module)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    directory = make_tiny_qwen25vl(Path(directory), seed=seed, init=init)  # tokenizer, processor, card
    for f in directory.glob("*.safetensors"):
        f.unlink()
    cfg = json.loads((directory / "config.json").read_text())
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("architectures", "model_type", "layer_types")}
    text.update(intermediate_size=1493, max_position_embeddings=32768, max_window_layers=28)
    text["rope_scaling"] = {"type": "mrope", "mrope_section": [16, 24, 24]}
    vision = dict(
        depth=4,
        embed_dim=160,
        mlp_ratio=4,
        num_heads=2,
        in_chans=3,
        hidden_size=256,
        hidden_act="quick_gelu",
        patch_size=14,
        spatial_merge_size=2,
        spatial_patch_size=14,
        temporal_patch_size=2,
        initializer_range=0.02,
    )
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=cfg["image_token_id"],
        video_token_id=cfg["video_token_id"],
        vision_start_token_id=cfg["vision_start_token_id"],
        vision_end_token_id=cfg["vision_end_token_id"],
        **text,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [text["eos_token_id"], text["bos_token_id"]]
    model.generation_config.pad_token_id = text["bos_token_id"]
    model.save_pretrained(directory, safe_serialization=True)
    cfg = json.loads((directory / "config.json").read_text())
    cfg["architectures"] = ["Qwen2VLForConditionalGeneration"]  # as the hub's config.json (4.57: in text_config)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    pre = json.loads((directory / "preprocessor_config.json").read_text())
    pre["processor_class"] = "Qwen2VLProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    return directory


def make_qwen25vl_images(directory: Path) -> list[Path]:
    """The three test images (:data:`QWEN25VL_IMAGE_SIZES`): a gradient, a checkerboard, noise."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    rng = np.random.default_rng(1)
    for i, (w, h) in enumerate(QWEN25VL_IMAGE_SIZES):
        y, x = np.mgrid[0:h, 0:w]
        a = [
            np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (w + h - 2)], axis=-1),
            np.stack([((x // 12 + y // 12) % 2) * 255] * 3, axis=-1),
            rng.integers(0, 256, size=(h, w, 3)),
        ][i]
        out.append(directory / f"qwen{i}_{w}x{h}.png")
        Image.fromarray(a.astype(np.uint8)).save(out[-1])
    return out


def to_qwen_vl_transformers5(src: Path, dst: Path) -> Path:
    """A transformers 4.57 save of a Qwen-VL model (Qwen2.5-VL, Qwen2-VL) in a transformers 5 layout:
    :func:`vlm_fixtures.to_transformers5_layout` (rope_parameters, processor_config.json, the tokenizer files) +
    the names of transformers 5's module tree (``model.visual.*``, ``model.language_model.*``), which transformers
    4.57 maps back to the hub's names when it saves."""
    from safetensors.torch import load_file, save_file
    from vlm_fixtures import to_transformers5_layout

    out = to_transformers5_layout(src, Path(dst))
    tensors = load_file(str(out / "model.safetensors"))
    renamed = {
        (
            "model." + k
            if k.startswith("visual.")
            else "model.language_model." + k[len("model.") :]
            if k.startswith("model.")
            else k
        ): v
        for k, v in tensors.items()
    }
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def make_tiny_qwen25vl_tf5(directory: Path, *, seed: int = 0) -> Path:
    """The same model in a transformers 5 layout (:func:`to_qwen_vl_transformers5`). Derived here (no transformers
    5 on this host) and NOT checked against a real transformers 5 save of Qwen2.5-VL."""
    src = make_tiny_qwen25vl(Path(directory).with_name(Path(directory).name + "-tf4"), seed=seed)
    return to_qwen_vl_transformers5(src, Path(directory))


PROMPT = "Describe the image."


@pytest.fixture(scope="module")
def tiny_qwen25vl(tmp_path_factory) -> Path:
    return make_tiny_qwen25vl(tmp_path_factory.mktemp("vlm-qwen25vl") / "tiny-qwen25vl")


@pytest.fixture(scope="module")
def qwen_images(tmp_path_factory) -> list[Path]:
    return make_qwen25vl_images(tmp_path_factory.mktemp("images-qwen25vl"))


def test_the_record_is_one_module_and_one_registry_line():
    from edgesdk.formats.vlm.families import REGISTRY, by_config, by_name

    fam = by_name("qwen25vl")
    assert "qwen25vl" in REGISTRY and fam.architectures == ("Qwen2_5_VLForConditionalGeneration",)
    assert fam.vision_model_types == {"qwen2_5_vl", "qwen2_5_vl_vision"}  # Qwen2-VL: its own record (qwen2vl)
    assert fam.parity_image_sizes == QWEN25VL_IMAGE_SIZES and fam.frames == "dynamic"
    # transformers 4.57's Qwen2_5_VLConfig keeps ``architectures`` in text_config only
    assert by_config({"text_config": {"architectures": ["Qwen2_5_VLForConditionalGeneration"]}}) is fam


@pytest.mark.parametrize(
    "size", [(250, 190), (140, 300), (96, 60), (10, 10), (1000, 7), (4000, 3000), (28, 5600), (333, 333), (7000, 5000)]
)
def test_the_runtime_resizes_as_the_hf_processor(size):
    """The runtime's size for an image equals transformers' smart_resize with the processor's min/max pixels (the
    Qwen2.5-VL-3B values), except above llama.cpp's cap of 4096 image tokens, which it keeps."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_smart_resize

    from edgesdk.contracts.vlm_families.qwen_vl import MAX_IMAGE_TOKENS, max_image_tokens, smart_resize

    pre = {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "size": {"shortest_edge": 3136, "longest_edge": 12845056},
        "patch_size": 14,
        "merge_size": 2,
    }
    w, h = size
    ours = smart_resize(h, w, pre)
    hf = hf_smart_resize(h, w, factor=28, min_pixels=3136, max_pixels=12845056)
    assert ours[0] % 28 == 0 and ours[1] % 28 == 0
    if hf[0] * hf[1] <= MAX_IMAGE_TOKENS * 28 * 28:
        assert ours == hf
    else:
        assert ours == hf_smart_resize(h, w, factor=28, min_pixels=3136, max_pixels=MAX_IMAGE_TOKENS * 784)
        assert ours[0] * ours[1] // 784 <= MAX_IMAGE_TOKENS == max_image_tokens(pre)


def test_plan_treats_qwen25vl_as_components(tiny_qwen25vl):
    from edgesdk.build import make_plan

    plan = make_plan(tiny_qwen25vl, "orin")
    assert plan.format == "vlm" and plan.precision == "mixed"
    assert plan.decision("vlm.encoder")["precision"] == "F16"
    assert plan.decision("vlm.vision_runtime")["onnx"] is False  # no ONNX encoder export for this family
    text = plan.explain()
    assert "dynamic resolution" in text and "up to 4096 image tokens per image" in text
    assert "patch merger (2 x 2 patches -> one token" in text and "qwen2_5_vl_text decoder" in text


def test_decoder_gguf_is_qwen2vl_with_mrope_sections(tiny_qwen25vl, tmp_path):
    import gguf

    from edgesdk.formats.gguf.convert import convert_hf_to_gguf
    from edgesdk.formats.vlm.convert import write_text_model_dir

    text_dir = write_text_model_dir(tiny_qwen25vl, tmp_path / "text")
    cfg = json.loads((text_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2_5_VLTextModel"]
    info = convert_hf_to_gguf(text_dir, tmp_path / "dec.gguf")
    assert info["gguf_architecture"] == "qwen2vl"
    r = gguf.GGUFReader(str(tmp_path / "dec.gguf"))
    assert r.fields["general.architecture"].contents() == "qwen2vl"
    assert r.fields["qwen2vl.rope.dimension_sections"].contents() == [16, 24, 24, 0]
    assert r.fields["qwen2vl.rope.freq_base"].contents() == 1_000_000.0
    assert "output.weight" not in {t.name for t in r.tensors}  # tied to token_embd, as Qwen2.5-VL-3B


def test_mmproj_layout_is_llama_cpp_qwen25vl(tiny_qwen25vl, tmp_path):
    import gguf
    from safetensors.numpy import load_file

    from edgesdk.formats.vlm.convert import write_mmproj

    info = write_mmproj(tiny_qwen25vl, tmp_path / "mmproj.gguf")
    assert info["projector_type"] == "qwen2.5vl_merger" and info["n_wa_pattern"] == 2 and info["image_size"] is None
    r = gguf.GGUFReader(str(tmp_path / "mmproj.gguf"))
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("clip.")}
    assert f["clip.projector_type"] == "qwen2.5vl_merger" and f["clip.use_silu"] is True
    assert f["clip.vision.n_wa_pattern"] == 2 and f["clip.vision.spatial_merge_size"] == 2
    assert f["clip.vision.block_count"] == 4 and f["clip.vision.projection_dim"] == 256
    assert abs(f["clip.vision.attention.layer_norm_epsilon"] - 1e-6) < 1e-12
    t = {x.name: np.array(x.data) for x in r.tensors}
    hf = load_file(str(tiny_qwen25vl / "model.safetensors"))
    conv = hf["visual.patch_embed.proj.weight"]  # [160, 3, 2, 14, 14]: two frames of one Conv3d
    for name, frame in (("v.patch_embd.weight", 0), ("v.patch_embd.weight.1", 1)):
        np.testing.assert_allclose(
            t[name].astype(np.float32).reshape(conv[:, :, frame].shape), conv[:, :, frame], atol=1e-3
        )
    qkv_w, qkv_b = hf["visual.blocks.2.attn.qkv.weight"], hf["visual.blocks.2.attn.qkv.bias"]
    for i, part in enumerate("qkv"):
        np.testing.assert_allclose(
            t[f"v.blk.2.attn_{part}.weight"].astype(np.float32).reshape(160, 160),
            qkv_w[i * 160 : (i + 1) * 160],
            atol=1e-3,
        )
        np.testing.assert_allclose(t[f"v.blk.2.attn_{part}.bias"], qkv_b[i * 160 : (i + 1) * 160], atol=0)
    assert {
        "v.post_ln.weight",
        "mm.0.weight",
        "mm.0.bias",
        "mm.2.weight",
        "mm.2.bias",
        "v.blk.0.ffn_gate.weight",
        "v.blk.0.ffn_up.bias",
        "v.blk.3.ln2.weight",
    } <= set(t)


def _edited(src: Path, dst: Path, vision: dict | None = None, pre: dict | None = None) -> Path:
    import shutil

    shutil.copytree(src, dst)
    if vision:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["vision_config"].update(vision)
        (dst / "config.json").write_text(json.dumps(cfg))
    if pre:
        data = json.loads((dst / "preprocessor_config.json").read_text())
        data.update(pre)
        (dst / "preprocessor_config.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize(
    "vision, pre, match",
    [
        ({"fullatt_block_indexes": [0, 3]}, None, r"fullatt_block_indexes \[0, 3\] is not every 1-th"),
        ({"fullatt_block_indexes": [1]}, None, r"fullatt_block_indexes \[1\] is not every 2-th of the 4 blocks"),
        ({"window_size": 224}, None, "window_size 224 is not supported"),
        ({"temporal_patch_size": 3}, None, "temporal_patch_size 3 is not supported"),
        ({"hidden_act": "gelu"}, None, "hidden_act 'gelu' is not supported"),
        (None, {"merge_size": 4}, "merge_size 4 differs from the vision config's spatial_merge_size 2"),
    ],
)
def test_unsupported_qwen25vl_checkpoints_are_one_line_model_errors(tiny_qwen25vl, tmp_path, vision, pre, match):
    from edgesdk.errors import ModelError
    from edgesdk.formats.vlm.convert import write_mmproj

    bad = _edited(tiny_qwen25vl, tmp_path / "bad", vision, pre)
    with pytest.raises(ModelError, match=match) as err:
        write_mmproj(bad, tmp_path / "mm.gguf")
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def qwen_bundle(tiny_qwen25vl, tmp_path_factory) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles-qwen25vl") / "qwen25vl-f16"
    return build(tiny_qwen25vl, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.fixture(scope="module")
def qwen_bundle_5(tmp_path_factory) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    src = make_tiny_qwen25vl_tf5(tmp_path_factory.mktemp("vlm-qwen25vl-5") / "tiny-qwen25vl-tf5")
    out = tmp_path_factory.mktemp("bundles-qwen25vl") / "qwen25vl-5-f16"
    return build(src, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_f16_build_matches_pytorch(layout, request):
    """Decoder logits, image features per token and greedy tokens on three images of different sizes (so the image
    tokens differ: 63, 55 and 6), the prompt tokens equal to the HF processor's."""
    bundle = request.getfixturevalue("qwen_bundle" if layout == "transformers4" else "qwen_bundle_5")
    m = json.loads((bundle / "manifest.json").read_text())
    vlm = m["extras"]["vlm"]
    assert m["format"] == "vlm" and m["license"]["verdict"] == "pass"
    assert vlm["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert vlm["components"]["projector"]["type"] == "qwen2.5vl_merger" and vlm["image_tokens"] == 4096
    vision = m["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999 and vision["greedy_equal"] == "3/3"
    assert [p["image_tokens"] for p in vision["per_image"]] == [63, 55, 6]
    for p in vision["per_image"]:
        assert p["tokens_ours"] == p["tokens_pytorch"] and p["input_tokens_ours"] == p["input_tokens_pytorch"]
    assert len({tuple(p["tokens_ours"]) for p in vision["per_image"]}) == 3  # the answer depends on the image
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


@pytest.mark.slow
def test_the_parity_is_sensitive_to_positions_windows_and_tokens(tiny_qwen25vl, qwen_bundle, tmp_path):
    """What the build's equalities rule out: with plain sequential positions for the image tokens (no M-RoPE)
    PyTorch answers differently; without window attention in the tower the features differ (cosine < 0.999 on the
    image spanning 3 x 2 windows); and on the checkerboard each feature row differs from its neighbour's (a per-token
    cosine of 1.0 is not a constant output, nor rows shifted by one)."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    import edgesdk
    from edgesdk.formats.vlm.build import test_images
    from edgesdk.formats.vlm.families import by_name

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_qwen25vl).eval()
    image_proc, tok = AutoImageProcessor.from_pretrained(tiny_qwen25vl), AutoTokenizer.from_pretrained(tiny_qwen25vl)
    images = test_images(tmp_path, by_name("qwen25vl").parity_image_sizes)
    per_image = json.loads((qwen_bundle / "manifest.json").read_text())["parity"]["vision"]["per_image"]
    pad = "<|image_pad|>"
    differ = 0
    for path, p in zip(images, per_image, strict=True):
        px = image_proc(images=[Image.open(path).convert("RGB")], return_tensors="pt")
        n = int(px["image_grid_thw"][0].prod()) // 4
        text = by_name("qwen25vl").reference_prompt(PROMPT).replace(pad, pad * n)
        x = {**tok(text, return_tensors="pt"), **px}
        seq = torch.arange(x["input_ids"].shape[1])[None]
        with torch.no_grad():  # the text model's own 1-D positions, broadcast to the three M-RoPE sections
            out = model.generate(**x, position_ids=seq.expand(3, 1, -1), max_new_tokens=1, do_sample=False)
        differ += int(out[0, -1].item() != p["tokens_ours"][0])
    assert differ >= 1

    s = edgesdk.load(qwen_bundle)
    try:
        got = s.backend.image_features(images[0]).astype(np.float64)
        checker = s.backend.image_features(images[1]).astype(np.float64)
    finally:
        s.close()
    px = image_proc(images=[Image.open(images[0]).convert("RGB")], return_tensors="pt")
    visual = model.model.visual if hasattr(model, "model") else model.visual
    full = list(visual.fullatt_block_indexes)
    visual.fullatt_block_indexes = list(range(len(visual.blocks)))  # every block attends to the whole image
    try:
        with torch.no_grad():
            no_windows = visual(px["pixel_values"], grid_thw=px["image_grid_thw"]).double().numpy()
    finally:
        visual.fullatt_block_indexes = full

    def cos(a, b):
        return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    assert got.shape == no_windows.shape == (63, 256)
    assert cos(got, no_windows).min() < 0.999
    assert cos(checker[1:], checker[:-1]).max() < 0.9  # measured 0.50 (the gradient's neighbours: up to 0.998)


@pytest.mark.slow
def test_chat_generate_kv_reuse_and_cli(qwen_bundle, qwen_images, run_cli):
    """chat() and generate() agree; a second question about the same image reuses its features and the KV cache up
    to the end of the image (its M-RoPE positions included); ``edgesdk run --image`` answers with the image's own
    token count."""
    import edgesdk

    s = edgesdk.load(qwen_bundle)
    try:
        a = s.generate(PROMPT, images=[qwen_images[1]], max_tokens=6, temperature=0)
        first = dict(s.backend.last)
        assert first["image_tokens"] == 55 and first["encoder_runs"] == 1  # 140 x 300 -> 5 x 11 tokens
        chat = s.chat(
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "path": str(qwen_images[1])}, {"type": "text", "text": PROMPT}],
                }
            ],
            max_tokens=6,
            temperature=0,
        )
        assert chat == a and s.backend.last["images_cached"] == 1 and s.backend.last["encoder_runs"] == 1
        assert s.backend.last["kv_reused_tokens"] > 0 and s.backend.last["output_ids"] == first["output_ids"]
        fresh = edgesdk.load(qwen_bundle)
        try:
            other = fresh.generate("What is this?", images=[qwen_images[1]], max_tokens=6, temperature=0)
        finally:
            fresh.close()
        assert s.generate("What is this?", images=[qwen_images[1]], max_tokens=6, temperature=0) == other
    finally:
        s.close()
    proc = run_cli(
        "run", str(qwen_bundle), "--image", str(qwen_images[0]), "--prompt", PROMPT, "-n", "4", "--temp", "0", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["report"]["backend_report"]["last_request"]["image_tokens"] == 63  # 250 x 190 -> 252 x 196


@pytest.mark.slow
def test_cli_build_for_orin_and_run(tiny_qwen25vl, qwen_images, run_cli, tmp_path):
    """``edgesdk build DIR --profile orin -o OUT`` (the profile's own decoder quantization, every parity gate) and
    ``edgesdk run OUT --image --prompt``."""
    out = tmp_path / "qwen25vl-orin"
    proc = run_cli("build", str(tiny_qwen25vl), "--profile", "orin", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["extras"]["llm"]["quant_type"] != "F16" and m["parity"]["vision"]["greedy_equal"] == "3/3"
    assert m["parity"]["decoder_ppl_ratio"] <= 1.1
    run = run_cli("run", str(out), "--image", str(qwen_images[2]), "--prompt", "What is this?", "-n", "4", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["report"]["backend_report"]["last_request"]["image_tokens"] == 6  # 96 x 60


def _reference_inputs(src: Path, text: str, images: list[Path]):
    """The HF processor's inputs for ``text`` with ``images`` (Qwen2_5_VLProcessor also loads a video processor,
    which needs torchvision: the image processor + the tokenizer with each ``<|image_pad|>`` repeated once per
    merged patch, as the processor does)."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    image_proc, tok = AutoImageProcessor.from_pretrained(src), AutoTokenizer.from_pretrained(src)
    px = image_proc(images=[Image.open(p).convert("RGB") for p in images], return_tensors="pt")
    parts = text.split("<|image_pad|>")
    counts = [int(g.prod()) // image_proc.merge_size**2 for g in px["image_grid_thw"]]
    text = parts[0] + "".join("<|image_pad|>" * n + part for n, part in zip(counts, parts[1:], strict=True))
    return {**tok(text, return_tensors="pt"), **px}, tok


@pytest.mark.slow
def test_two_images_in_one_prompt_match_pytorch(tiny_qwen25vl, qwen_bundle, qwen_images):
    """Two images of different sizes in one user turn: the second image's M-RoPE positions start after the first
    one's max(rows, columns) positions and the text after it; prompt tokens and greedy tokens equal PyTorch's."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    import edgesdk
    from edgesdk.formats.vlm.families import by_name

    pair = [qwen_images[0], qwen_images[1]]
    s = edgesdk.load(qwen_bundle)
    try:
        s.generate("Compare them.", images=pair, max_tokens=8, temperature=0)
        ours, n_in, n_img = (s.backend.last[k] for k in ("output_ids", "input_tokens", "image_tokens"))
    finally:
        s.close()
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_qwen25vl).eval()
    marker = by_name("qwen25vl").reference_marker
    x, tok = _reference_inputs(tiny_qwen25vl, by_name("qwen25vl").user_prompt("Compare them.", 2, marker), pair)
    with torch.no_grad():
        want = model.generate(**x, max_new_tokens=8, do_sample=False)[0, x["input_ids"].shape[1] :].tolist()
    eos = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    want = want[: next((i for i, t in enumerate(want) if t in eos), len(want))]
    assert n_img == 63 + 55 and n_in == x["input_ids"].shape[1] and ours == want and len(want) >= 4


def test_decode_limit_reads_max_pixels_and_resize_keeps_the_aspect(tiny_qwen25vl):
    """The runtime's preprocessing for this record: the decode limit is 16x the processor's max_pixels (its size
    dict holds pixel counts, not edges), and an image is resized to the processor's size."""
    from PIL import Image

    from edgesdk.errors import InputError
    from edgesdk.runtime.backends.vlm import ImagePreprocessor

    pre = ImagePreprocessor(json.loads((tiny_qwen25vl / "preprocessor_config.json").read_text()), 0)
    assert pre.family == "qwen25vl" and pre.max_pixels() == 16 * 12845056
    pre.check_size(14000, 14000, "image")  # 196 Mpx: within
    with pytest.raises(InputError, match="16x its image processor's max_pixels"):
        pre.check_size(15000, 14000, "image")
    out = pre(Image.new("RGB", (250, 190), (10, 20, 30)))
    assert out.shape == (196, 252, 3) and out.dtype == np.uint8


@pytest.mark.slow
def test_served_chat_with_an_image_equals_edgesdk_run(qwen_bundle, qwen_images, tmp_path, run_cli):
    """``edgesdk serve`` on the Qwen2.5-VL bundle: an OpenAI chat request with an ``image_url`` data URL (the real
    ``openai`` client) answers what ``edgesdk run --chat --image`` answers, the image's 55 tokens counted in the
    prompt."""
    from vlm_serve_check import served_reply_equals_run

    n = served_reply_equals_run(qwen_bundle, qwen_images[1], PROMPT, tmp_path, run_cli, name="qwen")
    assert n == 55 + 44  # image + text tokens
