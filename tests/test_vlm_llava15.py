# SPDX-License-Identifier: Apache-2.0
"""LLaVA-1.5 (CLIP tower with a class token; issue 21) on a random-weight model built from the published
llava-1.5 configuration, shrunk (tests/vlm_fixtures.py ``make_tiny_llava15``: 336 px, 14 px patches -> 576 image
tokens, ``vision_feature_select_strategy: default``, ``vision_feature_layer: -2``), saved with transformers 4.57
naming and rewritten to transformers 5 naming. llama.cpp's LLaVA graph cannot reproduce a class-token tower
(docs/vlm.md), so the bundle's encoder is the FP16 ONNX graph on ONNX Runtime (here the CPU provider) feeding
the llama.cpp decoder; the mmproj is tokenize-only (no tower layers). Parity against PyTorch is measured by the build
itself (image features per token, greedy tokens on 3 images) and re-checked here through ``edgesdk.load``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from vlm_fixtures import (  # noqa: E402  (tests/ on sys.path)
    LLAVA15_IMAGE_TOKENS,
    make_test_images,
    make_tiny_llava15,
    to_transformers5_layout,
)

from edgesdk.build import make_plan  # noqa: E402
from edgesdk.errors import InputError  # noqa: E402
from edgesdk.plan import BuildOptions  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llava15(tmp_path_factory) -> Path:
    return make_tiny_llava15(tmp_path_factory.mktemp("llava15") / "tiny-llava-1.5")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("images"))


def _build(src: Path, out: Path) -> Path:
    from edgesdk.build import build

    return build(src, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.fixture(scope="module")
def llava15_bundle(tiny_llava15, tmp_path_factory) -> Path:
    return _build(tiny_llava15, tmp_path_factory.mktemp("bundles") / "llava15-f16")


@pytest.fixture(scope="module")
def llava15_bundle_5(tiny_llava15, tmp_path_factory) -> Path:
    src = to_transformers5_layout(tiny_llava15, tmp_path_factory.mktemp("llava15-tf5") / "tiny-llava-1.5-tf5")
    return _build(src, tmp_path_factory.mktemp("bundles") / "llava15-5-f16")


def test_published_config_values(tiny_llava15):
    cfg = json.loads((tiny_llava15 / "config.json").read_text())
    v = cfg["vision_config"]
    assert (v["model_type"], v["image_size"], v["patch_size"], v["hidden_act"]) == (
        "clip_vision_model",
        336,
        14,
        "quick_gelu",
    )
    assert cfg["vision_feature_select_strategy"] == "default" and cfg["vision_feature_layer"] == -2
    assert cfg["projector_hidden_act"] == "gelu" and cfg["image_seq_length"] == 576
    pre = json.loads((tiny_llava15 / "preprocessor_config.json").read_text())
    assert pre["size"] == {"shortest_edge": 336} and pre["do_center_crop"] and pre["resample"] == 3


def test_plan_makes_the_onnx_encoder_required_on_every_profile(tiny_llava15):
    for profile, first in (("cpu-x86_64", "CPUExecutionProvider"), ("orin-nx-16gb", "TensorrtExecutionProvider")):
        plan = make_plan(tiny_llava15, profile)
        vr = plan.decision("vlm.vision_runtime")
        assert vr["onnx"] is True and vr["required"] is True and vr["providers"][0] == first
        assert vr["providers"][-1] == "CPUExecutionProvider"
        assert plan.decision("parity")["encoder"] == "onnx"
        assert f"{LLAVA15_IMAGE_TOKENS} image tokens" in plan.explain()
    with pytest.raises(InputError, match="--vision-runtime gguf cannot build"):
        make_plan(tiny_llava15, "cpu-x86_64", BuildOptions(vision_runtime="gguf"))


def test_preprocessing_matches_the_clip_processor(tiny_llava15, tmp_path):
    """Shortest-edge bicubic resize + center crop, pixel for pixel as CLIPImageProcessor, also where the crop
    margin is odd (transformers crops at (size - crop) // 2)."""
    from PIL import Image
    from transformers import CLIPImageProcessor

    from edgesdk.runtime.backends.vlm import ImagePreprocessor, normalise

    pre = json.loads((tiny_llava15 / "preprocessor_config.json").read_text())
    hf = CLIPImageProcessor.from_pretrained(tiny_llava15)
    ip = ImagePreprocessor(pre, 336)
    rng = np.random.default_rng(1)
    for w, h in ((101, 77), (77, 101), (500, 337), (336, 336)):
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        ours = normalise(ip(img), pre)
        theirs = hf(images=img, return_tensors="np")["pixel_values"]
        assert ours.shape == theirs.shape == (1, 3, 336, 336)
        assert np.abs(ours - theirs).max() < 1e-5, (w, h)


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_f16_build_matches_pytorch_through_the_onnx_encoder(layout, request):
    bundle = request.getfixturevalue("llava15_bundle" if layout == "transformers4" else "llava15_bundle_5")
    m = json.loads((bundle / "manifest.json").read_text())
    vlm = m["extras"]["vlm"]
    assert vlm["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert vlm["mmproj"]["encodes"] is False and vlm["image_tokens"] == LLAVA15_IMAGE_TOKENS
    assert vlm["components"]["vision_encoder"]["artifact"] == "vision_encoder.onnx"
    assert vlm["vision_encoder_chain"][-1] == "onnxruntime CPUExecutionProvider (FP16 ONNX)"
    vision = m["parity"]["vision"]
    assert vision["encoder"] == "onnx" and vision["encoder_min_cosine"] >= 0.999
    assert vision["greedy_equal"] == "3/3"
    for p in vision["per_image"]:
        assert p["tokens_ours"] == p["tokens_pytorch"] and len(p["tokens_pytorch"]) > 0
        assert p["input_tokens_ours"] == p["input_tokens_pytorch"]  # 576 image tokens + the prompt, both sides
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


def test_mmproj_is_tokenize_only(llava15_bundle):
    """No tower layers in the mmproj (block_count 0, the projector alone): the tower is in the ONNX graph only."""
    import gguf

    r = gguf.GGUFReader(str(llava15_bundle / "mmproj.gguf"))
    assert {t.name.split(".")[0] for t in r.tensors} == {"mm"}
    field = r.fields["clip.vision.block_count"]
    assert int(field.parts[field.data[0]][0]) == 0
    sizes = {f: (llava15_bundle / f).stat().st_size for f in ("mmproj.gguf", "vision_encoder.onnx")}
    assert sizes["mmproj.gguf"] * 10 < sizes["vision_encoder.onnx"]


def test_runtime_encodes_with_onnx_on_the_cpu_and_refuses_the_mmproj(llava15_bundle, tiny_llava15, images):
    import torch
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    import edgesdk
    from edgesdk.formats.vlm.onnx_encoder import min_token_cosine

    with pytest.raises(InputError, match="does not encode images"):
        edgesdk.load(llava15_bundle, vision_encoder="mmproj")
    proc = AutoProcessor.from_pretrained(tiny_llava15)
    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava15).eval()
    s = edgesdk.load(llava15_bundle)
    try:
        enc = s.report()["backend_report"]["vision_encoder"]
        assert enc["path"] == "onnx" and enc["provider"] == "CPUExecutionProvider"
        assert any("ONNX FP16 vision encoder (CPU)" in str(f) for f in s.report()["fallbacks"])
        for path in images[:3]:  # the test images, not the build's: 96x96, 96x96, 120x80 (a center crop)
            img = Image.open(path).convert("RGB")
            inputs = proc(images=img, text="USER: <image>\nWhat is it? ASSISTANT:", return_tensors="pt")
            inputs.pop("token_type_ids", None)
            with torch.no_grad():
                f = model.get_image_features(
                    pixel_values=inputs["pixel_values"],
                    vision_feature_layer=-2,
                    vision_feature_select_strategy="default",
                )
                f = f[0] if isinstance(f, (list, tuple)) else f
                f = f.reshape(-1, f.shape[-1]).numpy()
                want = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1] :]
            got = s.backend.image_features(path)
            assert got.shape == (LLAVA15_IMAGE_TOKENS, 128) and min_token_cosine(got, f) >= 0.999
            s.generate("What is it?", images=[path], max_tokens=6, temperature=0)
            eos = model.config.text_config.eos_token_id
            want = [int(t) for t in want.tolist()]
            want = want[: want.index(eos)] if eos in want else want
            assert s.backend.last["output_ids"] == want
            assert s.backend.last["input_tokens"] == inputs["input_ids"].shape[1]
    finally:
        s.close()


def test_cli_run_with_an_image(llava15_bundle, images, run_cli):
    proc = run_cli(
        "run",
        str(llava15_bundle),
        "--image",
        str(images[2]),
        "--prompt",
        "What is it?",
        "-n",
        "4",
        "--temp",
        "0",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout)["report"]["backend_report"]["last_request"]
    assert last["image_tokens"] == LLAVA15_IMAGE_TOKENS


@pytest.mark.slow
def test_served_chat_with_an_image_equals_edgesdk_run(llava15_bundle, images, tmp_path, run_cli):
    """``edgesdk serve`` on the LLaVA-1.5 bundle (the ONNX encoder encodes): an OpenAI chat request with an image
    answers what ``edgesdk run --chat --image`` answers, the 576 image tokens counted in the prompt."""
    from vlm_serve_check import served_reply_equals_run

    n = served_reply_equals_run(llava15_bundle, images[2], "What is it?", tmp_path, run_cli, name="llava15")
    assert n > LLAVA15_IMAGE_TOKENS
