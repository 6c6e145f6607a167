# SPDX-License-Identifier: Apache-2.0
"""The second VLM family end to end: a tiny SmolVLM-style ``Idefics3ForConditionalGeneration`` with RANDOM
weights (tests/vlm_fixtures.py): plan as components, build (decoder GGUF + F16 ``idefics3`` mmproj),
parity vs PyTorch (image features, greedy tokens, the same prompt tokens), generate/chat/CLI with images
through llama.cpp's libmtmd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from vlm_fixtures import (  # noqa: E402
    IDEFICS3_IMAGE_TOKENS,
    make_test_images,
    make_tiny_idefics3,
    to_transformers5_layout,
)

from edgesdk.build import make_plan  # noqa: E402


@pytest.fixture(scope="module")
def tiny_smolvlm(tmp_path_factory) -> Path:
    return make_tiny_idefics3(tmp_path_factory.mktemp("vlm-smol") / "tiny-smolvlm")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("images-smol"))


@pytest.mark.parametrize("profile", ["orin-nx-16gb", "cpu-x86_64"])
def test_plan_treats_smolvlm_as_components(tiny_smolvlm, profile):
    plan = make_plan(tiny_smolvlm, profile)
    assert plan.format == "vlm" and plan.precision == "mixed"
    assert plan.model["task"] == "image-text-to-text"
    assert plan.decision("vlm.components") == ["vision encoder", "projector", "language decoder"]
    assert plan.decision("vlm.encoder")["precision"] == "F16"
    assert plan.decision("vlm.vision_runtime")["onnx"] is False  # no ONNX encoder export for this family
    text = plan.explain()
    assert "pixel-shuffle connector (scale factor 2" in text and f"{IDEFICS3_IMAGE_TOKENS} image tokens" in text
    assert "<= budget" in text


def test_mmproj_layout_is_llama_cpp_idefics3(tiny_smolvlm, tmp_path):
    import gguf

    from edgesdk.formats.vlm.convert import write_mmproj

    info = write_mmproj(tiny_smolvlm, tmp_path / "mmproj.gguf")
    assert info["projector_type"] == "idefics3" and info["image_tokens"] == IDEFICS3_IMAGE_TOKENS
    r = gguf.GGUFReader(str(tmp_path / "mmproj.gguf"))
    names = {t.name for t in r.tensors}
    assert {"mm.model.fc.weight", "v.post_ln.weight", "v.patch_embd.weight", "v.position_embd.weight"} <= names
    field = r.fields["clip.vision.projector.scale_factor"]
    assert int(field.parts[field.data[0]][0]) == 2


@pytest.mark.slow
def test_prompt_layout_matches_the_hf_processor(tiny_smolvlm, tmp_path, images):
    """The runtime's prompt tokens (text + image positions) for one image are the HF processor's input ids."""
    from PIL import Image
    from transformers import AutoProcessor

    from edgesdk.formats.gguf.convert import convert_hf_to_gguf
    from edgesdk.formats.vlm.convert import write_mmproj, write_text_model_dir
    from edgesdk.runtime.backends.vlm import VLMBackend, VLMPipeline

    dec, mm = tmp_path / "dec.gguf", tmp_path / "mmproj.gguf"
    convert_hf_to_gguf(write_text_model_dir(tiny_smolvlm, tmp_path / "text"), dec)
    write_mmproj(tiny_smolvlm, mm)
    pre = json.loads((tiny_smolvlm / "preprocessor_config.json").read_text())
    pre["_image_size"] = 64
    backend = VLMBackend(VLMPipeline(dec, mm, pre, n_ctx=256), report={}, model="t", attributes={})
    try:
        backend.generate("Describe the image.", images=[images[2]], max_tokens=1, temperature=0)
        proc = AutoProcessor.from_pretrained(tiny_smolvlm)
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
        text = proc.apply_chat_template(msgs, add_generation_prompt=True)
        ids = proc(text=text, images=[Image.open(images[2]).convert("RGB")], return_tensors="np")["input_ids"][0]
        assert backend.last["input_tokens"] == len(ids) and backend.last["image_tokens"] == IDEFICS3_IMAGE_TOKENS
        image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
        hf_text = [int(t) for t in ids if t != image_id]
        # the slot's KV cells hold the prompt: text token ids and one ("img", ...) entry per image position
        assert [t for t in backend.engine._slot_kv[0] if not isinstance(t, tuple)] == hf_text
        assert [i for i, t in enumerate(backend.engine._slot_kv[0]) if isinstance(t, tuple)] == [
            i for i, t in enumerate(ids) if t == image_id
        ]  # image positions where the HF processor puts them
    finally:
        backend.close()


@pytest.fixture(scope="module")
def smol_bundle(tiny_smolvlm, tmp_path_factory) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles-smol") / "smolvlm-f16"
    return build(tiny_smolvlm, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.fixture(scope="module")
def smol_bundle_5(tiny_smolvlm, tmp_path_factory) -> Path:
    """The same model in the transformers 5 layout (rope_parameters, the image processor inside
    processor_config.json, no special_tokens_map.json; tests/vlm_fixtures.py), built on this transformers 4.57."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    src = to_transformers5_layout(tiny_smolvlm, tmp_path_factory.mktemp("vlm-smol5") / "tiny-smolvlm-tf5")
    out = tmp_path_factory.mktemp("bundles-smol") / "smolvlm5-f16"
    return build(src, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_f16_build_matches_pytorch(layout, request):
    smol_bundle = request.getfixturevalue("smol_bundle" if layout == "transformers4" else "smol_bundle_5")
    m = json.loads((smol_bundle / "manifest.json").read_text())
    assert m["extras"]["vlm"]["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert json.loads((smol_bundle / "preprocessor_config.json").read_text())["max_image_size"] == {"longest_edge": 64}
    assert m["format"] == "vlm" and m["license"]["verdict"] == "pass"
    assert m["extras"]["vlm"]["components"]["projector"]["type"] == "idefics3"
    vision = m["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999
    assert vision["greedy_equal"] == "3/3"
    for p in vision["per_image"]:
        assert p["tokens_ours"] == p["tokens_pytorch"] and p["input_tokens_ours"] == p["input_tokens_pytorch"]
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


@pytest.mark.slow
def test_generate_chat_reuse_and_cli(smol_bundle, images, run_cli):
    import edgesdk

    s = edgesdk.load(smol_bundle)
    try:
        a = s.generate("What is on the table?", images=[images[2]], max_tokens=6, temperature=0)
        first = dict(s.backend.last)
        assert first["image_tokens"] == IDEFICS3_IMAGE_TOKENS and first["encoder_runs"] == 1
        chat = s.chat(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "path": str(images[2])},
                        {"type": "text", "text": "What is on the table?"},
                    ],
                }
            ],
            max_tokens=6,
            temperature=0,
        )
        assert chat == a and s.backend.last["encoder_runs"] == 1 and s.backend.last["images_cached"] == 1
    finally:
        s.close()
    proc = run_cli(
        "run",
        str(smol_bundle),
        "--image",
        str(images[0]),
        "--prompt",
        "Describe it",
        "-n",
        "4",
        "--temp",
        "0",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["report"]["backend_report"]["last_request"]["image_tokens"] == IDEFICS3_IMAGE_TOKENS


@pytest.mark.slow
def test_smolvlm2_class_builds_with_parity(tmp_path):
    """``SmolVLMForConditionalGeneration`` (SmolVLM2's class): same layout, same parity."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    src = make_tiny_idefics3(tmp_path / "tiny-smolvlm2", arch="smolvlm")
    assert json.loads((src / "config.json").read_text())["vision_config"]["model_type"] == "smolvlm_vision"
    bundle = build(src, "cpu-x86_64", tmp_path / "out", BuildOptions(progress=False, quant_type="F16"))
    vision = json.loads((bundle / "manifest.json").read_text())["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999 and vision["greedy_equal"] == "3/3"


def test_onnx_vision_runtime_is_refused_for_this_family(tiny_smolvlm):
    from edgesdk.errors import InputError
    from edgesdk.plan import BuildOptions

    with pytest.raises(InputError, match="not supported for Idefics3/SmolVLM"):
        make_plan(tiny_smolvlm, "orin-nx-16gb", BuildOptions(vision_runtime="onnx"))
