# SPDX-License-Identifier: Apache-2.0
"""SmolVLM / Idefics3 with ``do_image_splitting=True`` (the real checkpoints' processor; issue 21): an image becomes
rows x cols encoder tiles + one global image, between the processor's ``<fake_token_around_image><row_R_col_C>`` /
``<global-img>`` markers. The runtime tiles in Pillow as Idefics3ImageProcessor does and hands libmtmd one tile per
frame, so the prompt tokens, image positions, features and greedy tokens are the HF processor's and PyTorch's.
Random-weight model (tests/vlm_fixtures.py ``make_tiny_idefics3(image_splitting=True)``: 64 px tiles, longest
edge 256 -> up to 4 x 4 tiles + global, 16 tokens each), both transformers layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from vlm_fixtures import (  # noqa: E402
    IDEFICS3_IMAGE_TOKENS,
    make_test_images,
    make_tiny_idefics3,
    to_transformers5_layout,
)


@pytest.fixture(scope="module")
def tiny_smolvlm_split(tmp_path_factory) -> Path:
    return make_tiny_idefics3(tmp_path_factory.mktemp("smol-split") / "tiny-smolvlm-split", image_splitting=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("images-split"))


def test_tiles_match_the_hf_processor(tiny_smolvlm_split):
    """rows, cols and every frame's pixels (normalised) equal Idefics3ImageProcessor's, for wide, tall, square,
    small and odd-sized images (the longest edge is first resized to 256, so every image here is split)."""
    from PIL import Image
    from transformers import AutoProcessor

    from edgesdk.runtime.backends.vlm import ImagePreprocessor, normalise

    pre = json.loads((tiny_smolvlm_split / "preprocessor_config.json").read_text())
    assert pre["do_image_splitting"] is True and pre["size"] == {"longest_edge": 256}
    hf = AutoProcessor.from_pretrained(tiny_smolvlm_split).image_processor
    ip = ImagePreprocessor(pre, 64)
    rng = np.random.default_rng(3)
    grids = set()
    for w, h in ((100, 80), (80, 100), (96, 60), (300, 37), (37, 300), (64, 64), (40, 30), (257, 129)):
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        rows, cols, frames = ip.tiles(img)
        out = hf(images=[img], return_tensors="np", return_row_col_info=True)
        assert (rows, cols) == (int(out["rows"][0][0]), int(out["cols"][0][0])), (w, h)
        pv = out["pixel_values"][0]
        assert len(frames) == pv.shape[0] == (rows * cols + 1 if rows else 1)
        for f, want in zip(frames, pv, strict=True):
            assert np.abs(normalise(f, pre)[0] - want).max() < 1e-5, (w, h)
        grids.add((rows, cols))
    assert {(4, 4), (3, 4), (1, 4), (4, 1)} <= grids


def test_prompt_layout_matches_the_hf_processor(tiny_smolvlm_split, tmp_path, images):
    """Prompt tokens for a 4 x 3-tile image and a square one: the runtime's text ids and image positions are the
    HF processor's input ids, ``<row_R_col_C>`` markers and newlines included."""
    from PIL import Image
    from transformers import AutoProcessor

    from edgesdk.formats.gguf.convert import convert_hf_to_gguf
    from edgesdk.formats.vlm.convert import write_mmproj, write_text_model_dir
    from edgesdk.runtime.backends.vlm import VLMBackend, VLMPipeline

    dec, mm = tmp_path / "dec.gguf", tmp_path / "mmproj.gguf"
    convert_hf_to_gguf(write_text_model_dir(tiny_smolvlm_split, tmp_path / "text"), dec)
    write_mmproj(tiny_smolvlm_split, mm)
    pre = json.loads((tiny_smolvlm_split / "preprocessor_config.json").read_text())
    pre["_image_size"] = 64
    backend = VLMBackend(VLMPipeline(dec, mm, pre, n_ctx=1024), report={}, model="t", attributes={})
    proc = AutoProcessor.from_pretrained(tiny_smolvlm_split)
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    try:
        for paths in ([images[2]], [images[0]], [images[2], images[3]]):  # 120x80 -> 3 rows x 4 cols; 96x96 -> 4x4
            backend.generate("Describe the image.", images=paths, max_tokens=1, temperature=0)
            msgs = [
                {
                    "role": "user",
                    "content": [{"type": "image"}] * len(paths) + [{"type": "text", "text": "Describe the image."}],
                }
            ]
            text = proc.apply_chat_template(msgs, add_generation_prompt=True)
            ids = proc(text=text, images=[[Image.open(p).convert("RGB") for p in paths]], return_tensors="np")[
                "input_ids"
            ][0]
            n_img = int((ids == image_id).sum())
            assert backend.last["input_tokens"] == len(ids) and backend.last["image_tokens"] == n_img
            assert [t for t in backend.engine._slot_kv[0] if not isinstance(t, tuple)] == [
                int(t) for t in ids if t != image_id
            ]
            assert [i for i, t in enumerate(backend.engine._slot_kv[0]) if isinstance(t, tuple)] == [
                i for i, t in enumerate(ids) if t == image_id
            ]
    finally:
        backend.close()


def _build(src: Path, out: Path) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    return build(src, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.fixture(scope="module")
def split_bundle(tiny_smolvlm_split, tmp_path_factory) -> Path:
    return _build(tiny_smolvlm_split, tmp_path_factory.mktemp("bundles-split") / "smol-split-f16")


@pytest.fixture(scope="module")
def split_bundle_5(tiny_smolvlm_split, tmp_path_factory) -> Path:
    src = to_transformers5_layout(tiny_smolvlm_split, tmp_path_factory.mktemp("smol-split5") / "tiny-smolvlm-split5")
    return _build(src, tmp_path_factory.mktemp("bundles-split") / "smol-split5-f16")


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_f16_build_matches_pytorch_with_tiles(layout, request):
    bundle = request.getfixturevalue("split_bundle" if layout == "transformers4" else "split_bundle_5")
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["extras"]["vlm"]["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert json.loads((bundle / "preprocessor_config.json").read_text())["do_image_splitting"] is True
    vision = m["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999 and vision["greedy_equal"] == "3/3"
    tokens = [p["input_tokens_pytorch"] for p in vision["per_image"]]
    for p in vision["per_image"]:
        assert p["tokens_ours"] == p["tokens_pytorch"] and p["input_tokens_ours"] == p["input_tokens_pytorch"]
    # 4 x 4 tiles + global, 4 x 4 + global, 4 x 3 + global (16 tokens each) around the same text
    # one row fewer: 4 x (<fake_token_around_image><row_4_col_C> + 16 image tokens) and its "\n"
    assert tokens[0] - tokens[2] == 4 * (2 + IDEFICS3_IMAGE_TOKENS) + 1
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


def test_generate_reuses_the_tiles_and_runs_from_the_cli(split_bundle, images, run_cli):
    import edgesdk

    s = edgesdk.load(split_bundle)
    try:
        s.generate("What is on the table?", images=[images[2]], max_tokens=4, temperature=0)
        first = dict(s.backend.last)
        assert first["image_tokens"] == (3 * 4 + 1) * IDEFICS3_IMAGE_TOKENS and first["encoder_runs"] == 13
        s.generate("And the colour?", images=[images[2]], max_tokens=4, temperature=0)
        assert s.backend.last["encoder_runs"] == 13 and s.backend.last["images_cached"] == 13
    finally:
        s.close()
    proc = run_cli(
        "run",
        str(split_bundle),
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
    last = json.loads(proc.stdout)["report"]["backend_report"]["last_request"]
    assert last["image_tokens"] == 17 * IDEFICS3_IMAGE_TOKENS


def test_plan_counts_the_frames(tiny_smolvlm_split):
    from edgesdk.build import make_plan

    text = make_plan(tiny_smolvlm_split, "cpu-x86_64").explain()
    assert (
        "16 image tokens per frame; image splitting: up to 16 tiles + 1 global frame per image, 272 image "
        "tokens" in text
    )


@pytest.mark.slow
def test_served_chat_with_a_split_image_equals_edgesdk_run(split_bundle, images, tmp_path, run_cli):
    """``edgesdk serve`` on the split SmolVLM bundle: an OpenAI chat request with an image answers what ``edgesdk run
    --chat --image`` answers, every tile's and the global frame's tokens counted (images[2]: 3 x 4 tiles + 1)."""
    from vlm_serve_check import served_reply_equals_run

    n = served_reply_equals_run(split_bundle, images[2], "Describe it", tmp_path, run_cli, name="smolvlm")
    assert n > (3 * 4 + 1) * IDEFICS3_IMAGE_TOKENS
