# SPDX-License-Identifier: Apache-2.0
"""VLM bundles end to end on a tiny LLaVA-style model with RANDOM weights (tests/vlm_fixtures.py): plan
as components, build (decoder GGUF + F16 mmproj), per-component and greedy parity vs PyTorch,
generate/chat/CLI with images through llama.cpp's libmtmd, image-prefix reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from vlm_fixtures import make_test_images, make_tiny_llava, to_transformers5_layout  # noqa: E402  (tests/ on sys.path)

from edgesdk.build import make_plan  # noqa: E402
from edgesdk.errors import ModelError  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("profile", ["orin-nx-16gb", "cpu-x86_64"])
def test_plan_treats_a_llava_as_components_with_memory_arithmetic(tiny_llava, profile):
    plan = make_plan(tiny_llava, profile)
    assert plan.format == "vlm" and plan.precision == "mixed"
    assert plan.model["task"] == "image-text-to-text"
    assert plan.decision("vlm.components") == ["vision encoder", "projector", "language decoder"]
    assert plan.decision("vlm.encoder")["precision"] == "F16"
    assert plan.decision("gguf.quant_type") in ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M")
    text = plan.explain()
    assert "mmproj F16" in text and "<= budget" in text and "16 image tokens" in text


def test_quant_type_override_applies_to_the_decoder_only(tiny_llava):
    from edgesdk.plan import BuildOptions

    plan = make_plan(tiny_llava, "orin-nx-16gb", BuildOptions(quant_type="Q4_K_M"))
    assert plan.decision("gguf.quant_type") == "Q4_K_M" and plan.decision("vlm.encoder")["precision"] == "F16"


@pytest.mark.slow
def test_clip_tower_gets_the_onnx_encoder_and_full_selection_is_refused(tmp_path):
    """A CLIP tower (class token) builds with the ONNX encoder as its encoder (tests/test_vlm_llava15.py has the
    parity); its ``full`` selection (class token kept) has no llama.cpp image-token layout and is refused."""
    from edgesdk.formats.vlm.convert import check_supported, read_config

    clip = make_tiny_llava(tmp_path / "clip-llava", vision="clip")
    vr = make_plan(clip, "cpu-x86_64").decision("vlm.vision_runtime")
    assert vr["required"] is True and vr["providers"] == ["CPUExecutionProvider"]
    cfg = read_config(clip)
    with pytest.raises(ModelError, match="'full' is not supported for a CLIP tower"):
        check_supported({**cfg, "vision_feature_select_strategy": "full"}, clip)


@pytest.fixture(scope="module")
def vlm_bundle(vlm_f16_bundle):
    """tests/conftest.py's tiny LLaVA F16 build, once per session (read-only: copy it before changing it)."""
    return vlm_f16_bundle


@pytest.fixture(scope="module")
def vlm_bundle_5(tiny_llava, tmp_path_factory) -> Path:
    """The same model in the transformers 5 layout (vision tensors without ``vision_model.``, rope_parameters, the
    image processor inside processor_config.json; tests/vlm_fixtures.py), built on this transformers 4.57."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    src = to_transformers5_layout(tiny_llava, tmp_path_factory.mktemp("vlm5") / "tiny-llava-tf5")
    out = tmp_path_factory.mktemp("bundles") / "vlm5-f16"
    return build(src, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_f16_build_matches_pytorch_per_component_and_end_to_end(layout, request):
    vlm_bundle = request.getfixturevalue("vlm_bundle" if layout == "transformers4" else "vlm_bundle_5")
    m = json.loads((vlm_bundle / "manifest.json").read_text())
    assert m["extras"]["vlm"]["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert json.loads((vlm_bundle / "preprocessor_config.json").read_text())["size"] == {"height": 64, "width": 64}
    assert m["format"] == "vlm" and m["license"]["verdict"] == "pass"
    roles = {a["role"] for a in m["artifacts"]}
    assert {"model", "mmproj", "config", "sbom"} <= roles
    vision = m["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999
    assert vision["greedy_equal"] == "3/3"
    assert all(p["tokens_ours"] == p["tokens_pytorch"] for p in vision["per_image"])
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


@pytest.mark.slow
def test_generate_chat_and_image_prefix_reuse(vlm_bundle, images):
    import edgesdk

    s = edgesdk.load(vlm_bundle)
    try:
        a = s.generate("What is on the table?", images=[images[2]], max_tokens=6, temperature=0)
        first = dict(s.backend.last)
        assert first["image_tokens"] == 16 and first["encoder_runs"] == 1 and first["images_cached"] == 0
        b = s.generate("And what colour is it?", images=[images[2]], max_tokens=6, temperature=0)
        second = dict(s.backend.last)
        assert second["encoder_runs"] == 1 and second["images_cached"] == 1  # the encoder did not run again
        assert second["kv_reused_tokens"] >= 16 + 2  # BOS/"USER: " + the image stayed in the KV cache
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
        assert chat == a and s.backend.last["encoder_runs"] == 1
    finally:
        s.close()
    fresh = edgesdk.load(vlm_bundle)
    try:  # a cold session answers question 2 with the same tokens: reuse does not change the output
        assert fresh.generate("And what colour is it?", images=[images[2]], max_tokens=6, temperature=0) == b
    finally:
        fresh.close()


@pytest.mark.slow
def test_a_vlm_bundle_runs_without_build_modules(vlm_bundle, images):
    """Issue 40, item 3: a device without the build extra (tests/runtime_only.py refuses torch, transformers, gguf-py
    ... and edgesdk's build-side modules) loads the bundle, answers about an image and chats, greedy, with the same
    text as this process (where everything is installed)."""
    from runtime_only import build_side_names, run_runtime_only

    import edgesdk

    with edgesdk.load(vlm_bundle) as s:
        want = s.generate("What is on the table?", images=[images[2]], max_tokens=6, temperature=0)
    code = f"""
import edgesdk
with edgesdk.load({str(vlm_bundle)!r}) as s:
    text = s.generate("What is on the table?", images=[{str(images[2])!r}], max_tokens=6, temperature=0)
    chat = s.chat([{{"role": "user", "content": [{{"type": "image", "path": {str(images[2])!r}}},
                  {{"type": "text", "text": "What is on the table?"}}]}}], max_tokens=6, temperature=0)
print(json.dumps([str(text), str(chat)]))
"""
    report, imported, proc = run_runtime_only(code)
    assert report["refused"] == [] and build_side_names(imported) == []
    assert json.loads(proc.stdout.strip().splitlines()[-2]) == [want, want]


@pytest.mark.slow
def test_an_image_given_again_is_not_preprocessed_again(vlm_bundle, images, tmp_path):
    """The same file (unchanged) or the same bytes reuse their preprocessed frames; a file rewritten in place is
    decoded again, and every answer equals a cold session's for that image."""
    import os

    import edgesdk

    mine = tmp_path / "photo.png"
    mine.write_bytes(images[2].read_bytes())
    s = edgesdk.load(vlm_bundle)
    pipe = s.backend.pipe
    try:
        a = s.generate("What is on the table?", images=[mine], max_tokens=4, temperature=0)
        assert pipe.frames_reused == 0
        assert s.generate("What is on the table?", images=[mine], max_tokens=4, temperature=0) == a
        assert pipe.frames_reused == 1
        raw = images[2].read_bytes()
        assert s.generate("What is on the table?", images=[raw], max_tokens=4, temperature=0) == a
        assert s.generate("What is on the table?", images=[raw], max_tokens=4, temperature=0) == a
        assert pipe.frames_reused == 2  # the bytes' first use decoded them, the second reused them
        st = mine.stat()
        mine.write_bytes(images[0].read_bytes())  # another image at the same path
        os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        c = s.generate("What is on the table?", images=[mine], max_tokens=4, temperature=0)
        assert pipe.frames_reused == 2
        pipe.forget()  # cold again: the bytes are decoded and encoded anew, the same answer
        assert s.generate("What is on the table?", images=[raw], max_tokens=4, temperature=0) == a
        assert pipe.frames_reused == 2 and s.backend.last["images_cached"] == 0
    finally:
        s.close()
    fresh = edgesdk.load(vlm_bundle)
    try:
        assert fresh.generate("What is on the table?", images=[images[0]], max_tokens=4, temperature=0) == c
    finally:
        fresh.close()


@pytest.mark.slow
def test_cli_run_with_images(vlm_bundle, images, run_cli):
    proc = run_cli(
        "run",
        str(vlm_bundle),
        "--image",
        str(images[0]),
        "--image",
        str(images[1]),
        "--prompt",
        "Compare them",
        "-n",
        "4",
        "--temp",
        "0",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["report"]["backend_report"]["last_request"]["image_tokens"] == 32
    bad = run_cli("run", str(vlm_bundle), "--image", str(images[0]))
    assert bad.returncode == 3 and "--image needs --prompt" in bad.stderr


@pytest.mark.slow
def test_bad_images_exit_3_naming_the_file(vlm_bundle, tmp_path, run_cli):
    """Issue 25 finding 8 through the CLI and the library: bombs, a 2 GB sparse .png, empty and NaN arrays."""
    import subprocess

    import numpy as np
    from test_image_inputs import bmp_header, png_bomb

    import edgesdk
    from edgesdk.errors import InputError

    huge = tmp_path / "huge.png"
    subprocess.run(["truncate", "-s", "2G", str(huge)], check=True)
    for path in (png_bomb(tmp_path / "bomb.png"), bmp_header(tmp_path / "header.bmp", 50000, 50000), huge):
        proc = run_cli("run", str(vlm_bundle), "--image", str(path), "--prompt", "What is it?", "-n", "2")
        assert proc.returncode == 3, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: image ") and path.name in lines[0], proc.stderr
    s = edgesdk.load(vlm_bundle)
    try:
        for arr in (np.zeros((0, 0, 3), np.uint8), np.full((8, 8, 3), np.nan, np.float32)):
            with pytest.raises(InputError, match="image array"):
                s.generate("What is it?", images=[arr], max_tokens=2)
    finally:
        s.close()
