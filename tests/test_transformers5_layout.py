# SPDX-License-Identifier: Apache-2.0
"""Checkpoints saved by transformers 4.x and 5.x (docs/vlm.md, "transformers 4 and 5 checkpoints"): the GGUF and
mmproj converters read both layouts and write the same files, the PyTorch reference loads a 5.x directory on this
transformers 4.57, a wrong rope_theta would show in the logits, and bad layouts get one-line errors.

CI has transformers 4.57 only: the 5.x directories are derived from 4.57 saves by ``to_transformers5_layout``
(tests/vlm_fixtures.py), which writes what a real transformers 5.25.0 save of the same fixture holds. The full
builds with parity per family and layout are in test_vlm.py, test_vlm_smolvlm.py and test_gguf_build.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from vlm_fixtures import make_tiny_idefics3, make_tiny_llava, to_transformers5_layout  # noqa: E402

from edgesdk.errors import ModelError  # noqa: E402
from edgesdk.formats.gguf import convert as conv  # noqa: E402
from edgesdk.formats.vlm import convert as vconv  # noqa: E402

# ------------------------------------------------------------------ config, tokenizer and name rules (no model)


@pytest.mark.parametrize(
    "config, want",
    [
        ({}, (10000.0, "default")),
        ({"rope_theta": 500000.0}, (500000.0, "default")),  # transformers 4
        ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, (1e6, "default")),  # transformers 5
        ({"rope_theta": 1e6, "rope_parameters": {"rope_theta": 1e6}}, (1e6, "default")),  # both, agreeing
        ({"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, (1e4, "linear")),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}}, (1e4, "yarn")),
    ],
)
def test_rope_settings_read_either_layout(config, want):
    assert conv.rope_settings(config) == want


@pytest.mark.parametrize(
    "config, match",
    [
        ({"rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}}, "disagree"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}}}, "per layer type"),
        ({"rope_parameters": [1e6]}, "must be an object"),
        ({"rope_parameters": {"rope_theta": "big"}}, "not a positive number"),
    ],
)
def test_bad_rope_settings_are_one_line_errors(config, match):
    with pytest.raises(ModelError, match=match) as err:
        conv.rope_settings(config)
    assert "\n" not in str(err.value)


def test_config_and_tokenizer_config_back_to_transformers4():
    cfg = {
        "_pad_token_id": 1,
        "text_config": {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "tie_word_embeddings": False},
    }
    assert conv.config_for_transformers4(cfg) == {
        "pad_token_id": 1,
        "text_config": {"rope_theta": 1e6, "tie_word_embeddings": False},
    }
    scaled = conv.config_for_transformers4(
        {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}}
    )
    assert scaled == {"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    tc = {
        "backend": "tokenizers",
        "tokenizer_class": "TokenizersBackend",
        "bos_token": "<s>",
        "extra_special_tokens": ["<a>", "<b>"],
        "image_token": "<image>",
    }
    assert conv.tokenizer_config_for_transformers4(tc) == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "additional_special_tokens": ["<a>", "<b>"],
        "extra_special_tokens": {"image_token": "<image>"},
    }


def test_llava_vision_names_map_to_the_transformers4_layout():
    assert (
        vconv.canonical_name("vision_tower.encoder.layers.0.mlp.fc1.weight")
        == "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    )
    assert (
        vconv.canonical_name("model.vision_tower.embeddings.patch_embedding.bias")
        == "model.vision_tower.vision_model.embeddings.patch_embedding.bias"
    )
    assert (
        vconv.canonical_name("vision_tower.post_layernorm.weight") == "vision_tower.vision_model.post_layernorm.weight"
    )
    for same in (
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "language_model.model.norm.weight",
        "model.vision_model.encoder.layers.0.mlp.fc1.weight",
        "multi_modal_projector.linear_1.weight",
    ):
        assert vconv.canonical_name(same) == same


def _fake_llava(directory: Path, names: list[str], *, processor: dict | None = None) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlavaForConditionalGeneration"],
                "vision_feature_select_strategy": "full",
                "vision_config": {
                    "model_type": "siglip_vision_model",
                    "image_size": 32,
                    "patch_size": 16,
                    "hidden_size": 8,
                    "intermediate_size": 16,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                },
                "text_config": {"model_type": "llama", "hidden_size": 8},
            }
        )
    )
    if processor is not None:
        (directory / "processor_config.json").write_text(json.dumps(processor))
    save_file({n: np.zeros(2, dtype=np.float32) for n in names}, str(directory / "model.safetensors"))
    return directory


def test_mixed_and_unknown_layouts_are_one_line_model_errors(tmp_path):
    image = {"image_processor": {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"height": 32, "width": 32}}}
    mixed = _fake_llava(
        tmp_path / "mixed",
        ["vision_tower.vision_model.embeddings.patch_embedding.bias", "vision_tower.encoder.layers.0.layer_norm1.bias"],
        processor=image,
    )
    with pytest.raises(ModelError, match="mix the transformers 4 .* and 5 .* layouts") as err:
        vconv.write_mmproj(mixed, tmp_path / "mixed.gguf")
    assert "\n" not in str(err.value)
    odd = _fake_llava(tmp_path / "odd", ["vision_tower.trunk.blocks.0.norm.bias"], processor=image)
    with pytest.raises(ModelError, match="vision_tower.trunk.blocks.0.norm.bias has no mmproj GGUF name"):
        vconv.write_mmproj(odd, tmp_path / "odd.gguf")
    bare = _fake_llava(
        tmp_path / "bare",
        ["vision_tower.encoder.layers.0.layer_norm1.bias"],
        processor={"processor_class": "LlavaProcessor"},
    )
    with pytest.raises(ModelError, match="no image processor .*preprocessor_config.json.*processor_config.json"):
        vconv.write_mmproj(bare, tmp_path / "bare.gguf")


def test_image_processor_comes_from_either_file(tmp_path):
    from edgesdk.formats.vlm.facts import hf_vlm_facts

    d = _fake_llava(
        tmp_path / "m",
        ["vision_tower.encoder.layers.0.layer_norm1.bias"],
        processor={
            "processor_class": "LlavaProcessor",
            "image_processor": {"image_mean": [0.5] * 3, "image_std": [0.5] * 3},
        },
    )
    assert vconv.image_processor(d) == {
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
        "processor_class": "LlavaProcessor",
    }
    assert hf_vlm_facts(d)["preprocessor"] is True
    (d / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.1] * 3, "image_std": [0.2] * 3}))
    assert vconv.image_processor(d)["image_mean"] == [0.1] * 3  # transformers 4's file wins where both exist


# ------------------------------------------------------------------ real (random-weight) models, both layouts


@pytest.fixture(scope="module")
def vlms(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("layouts")
    out = {}
    for family, make in (("llava", make_tiny_llava), ("idefics3", make_tiny_idefics3)):
        v4 = make(root / f"{family}-tf4")
        out[family] = (v4, to_transformers5_layout(v4, root / f"{family}-tf5"))
    return out


def _gguf(path: Path):
    import gguf
    import numpy as np

    r = gguf.GGUFReader(str(path))
    return (
        {k: str(f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")},
        {t.name: np.array(t.data) for t in r.tensors},
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_both_layouts_convert_to_identical_ggufs(vlms, family, tmp_path):
    """Decoder and mmproj GGUFs of the 5.x layout equal the 4.x ones: metadata and every tensor byte."""
    import numpy as np

    v4, v5 = vlms[family]
    assert not (v5 / "preprocessor_config.json").exists() and not (v5 / "special_tokens_map.json").exists()
    files = {}
    for tag, src in (("4", v4), ("5", v5)):
        text = vconv.write_text_model_dir(src, tmp_path / f"text{tag}")
        conv.convert_hf_to_gguf(text, tmp_path / f"dec{tag}.gguf", name=family)
        info = vconv.write_mmproj(src, tmp_path / f"mm{tag}.gguf", name=family)
        assert info["checkpoint_layout"]["transformers"] == f"{tag}.x"
        files[tag] = (_gguf(tmp_path / f"dec{tag}.gguf"), _gguf(tmp_path / f"mm{tag}.gguf"))
    for (kv4, t4), (kv5, t5) in zip(files["4"], files["5"], strict=True):
        assert kv4 == kv5
        assert t4.keys() == t5.keys() and all(np.array_equal(t4[k], t5[k]) for k in t4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_reference_loads_the_5x_layout_on_transformers4(vlms, family, tmp_path):
    """On transformers 4 the reference child gets a view of a 5.x directory that loads every weight and
    processes image + prompt exactly as the 4.57 save does."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    v4, v5 = vlms[family]
    view = conv.reference_dir(v5, tmp_path / "view", rename=vconv.canonical_name)
    assert view != v5 and (view / "preprocessor_config.json").is_file()
    arch = json.loads((v4 / "config.json").read_text())["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(view, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    want = getattr(transformers, arch).from_pretrained(v4).state_dict()
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8))
    prompt = "USER: <image>\nHi ASSISTANT:" if family == "llava" else "<|im_start|>User:<image>Hi<end_of_utterance>"
    a = transformers.AutoProcessor.from_pretrained(v4)(images=image, text=prompt, return_tensors="pt")
    b = transformers.AutoProcessor.from_pretrained(view)(images=image, text=prompt, return_tensors="pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert conv.reference_dir(v4, tmp_path / "view4", rename=vconv.canonical_name) == v4  # 4.x: as it is


@pytest.mark.slow
def test_a_rope_theta_read_from_the_wrong_place_breaks_logits_parity(tmp_path):
    """Why rope_parameters matters: the same 5.x checkpoint converted with the 10000 default instead of its
    rope_theta (1e6) misses the logits gate (the correct conversion passes it: test_gguf_build.py's
    test_qwen2_converts_and_matches_hf_logits[transformers5], the same model)."""
    from test_gguf_build import make_tiny_causal_lm

    from edgesdk.formats.gguf.build import PPL_TEXT

    hf = make_tiny_causal_lm(tmp_path / "qwen2-tf5", "qwen2", rope_theta=1e6, layout="transformers5")
    text = PPL_TEXT.read_text()
    wrong = tmp_path / "wrong-theta"
    wrong.mkdir()
    for f in hf.iterdir():
        (wrong / f.name).symlink_to(f)
    cfg = json.loads((hf / "config.json").read_text())
    del cfg["rope_parameters"]
    (wrong / "config.json").unlink()
    (wrong / "config.json").write_text(json.dumps(cfg))
    conv.convert_hf_to_gguf(wrong, tmp_path / "wrong.gguf")
    assert conv.logits_parity(hf, tmp_path / "wrong.gguf", text)["min_cosine"] < 0.999
