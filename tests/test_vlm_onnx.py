# SPDX-License-Identifier: Apache-2.0
"""The VLM's second vision runtime: encoder + projector as an FP16 ONNX graph (issue 15). Plan per profile
(TensorRT/CUDA profiles get it, CPU profiles keep the mmproj only), the export (static, no control flow,
FP16 weights, float32 I/O, features vs PyTorch), and the runtime path forced onto the CPU provider:
features vs the mmproj's and greedy tokens equal to the mmproj path's. The model has RANDOM weights
(tests/vlm_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from vlm_fixtures import make_test_images, to_transformers5_layout  # noqa: E402  (tests/)

from edgesdk.build import make_plan  # noqa: E402
from edgesdk.errors import InputError  # noqa: E402
from edgesdk.formats.vlm.onnx_encoder import min_token_cosine  # noqa: E402
from edgesdk.plan import BuildOptions  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("profile", ["orin-nx-16gb", "orin-nano-8gb", "h200", "a10", "l4"])
def test_gpu_profiles_get_the_onnx_encoder_with_the_reason(tiny_llava, profile):
    plan = make_plan(tiny_llava, profile)
    vr = plan.decision("vlm.vision_runtime")
    assert vr["runtime"] == "onnx" and vr["precision"] == "FP16"
    assert vr["providers"][0] == "TensorrtExecutionProvider"
    assert plan.decision("vlm.encoder")["precision"] == "F16"  # the mmproj is built either way
    text = plan.explain()
    assert f"profile {profile} has TensorRT and CUDA" in text and "+ ONNX encoder FP16" in text


@pytest.mark.parametrize("profile", ["cpu-x86_64", "cpu-aarch64"])
def test_cpu_profiles_keep_the_mmproj_only(tiny_llava, profile):
    plan = make_plan(tiny_llava, profile)
    assert plan.decision("vlm.vision_runtime") == {"runtime": "gguf-mmproj", "onnx": False}
    text = plan.explain()
    assert "lists no TensorRT/CUDA execution provider" in text and "ONNX encoder FP16" not in text


def test_vision_runtime_option_overrides_the_profile(tiny_llava):
    on_cpu = make_plan(tiny_llava, "cpu-x86_64", BuildOptions(vision_runtime="onnx")).decision("vlm.vision_runtime")
    assert on_cpu["onnx"] is True and on_cpu["providers"] == ["CPUExecutionProvider"]
    off = make_plan(tiny_llava, "orin-nx-16gb", BuildOptions(vision_runtime="gguf")).decision("vlm.vision_runtime")
    assert off["onnx"] is False
    with pytest.raises(InputError, match="--vision-runtime"):
        make_plan(tiny_llava, "orin-nx-16gb", BuildOptions(vision_runtime="tensorrt"))


def test_cli_explain_and_bad_choice(tiny_llava, run_cli):
    ok = run_cli("build", str(tiny_llava), "--profile", "cpu-x86_64", "--vision-runtime", "onnx", "--plan-only")
    assert ok.returncode == 0, ok.stderr
    assert "vlm.vision_runtime" in ok.stdout and "--vision-runtime onnx" in ok.stdout
    bad = run_cli("build", str(tiny_llava), "--profile", "cpu-x86_64", "--vision-runtime", "trt", "--plan-only")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


@pytest.fixture(scope="module")
def exported(tiny_llava, tmp_path_factory):
    from edgesdk.formats.vlm.onnx_encoder import export_encoder

    d = tmp_path_factory.mktemp("onnx")
    info = export_encoder(tiny_llava, d / "enc32.onnx", d / "enc16.onnx")
    return d / "enc16.onnx", info


def test_export_is_static_fp16_without_control_flow(exported):
    import onnx

    path, info = exported
    m = onnx.load(str(path))
    assert info["opset"] == 17 and info["control_flow"] == []
    assert not {n.op_type for n in m.graph.node} & {"If", "Loop", "Scan"}
    (inp,), (out,) = m.graph.input, m.graph.output
    f32 = onnx.TensorProto.FLOAT
    assert inp.type.tensor_type.elem_type == f32 and out.type.tensor_type.elem_type == f32  # keep_io_types
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [1, 3, 64, 64]  # static, no symbolic dims
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [1, 16, 64]
    big = [t for t in m.graph.initializer if np.prod(t.dims) >= 64 * 64]
    assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)  # the weights are FP16
    onnx.checker.check_model(m)  # topologically sorted (TensorRT's parser needs that)


def test_onnx_features_match_pytorch_on_the_test_images(tiny_llava, exported, images):
    import torch
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from edgesdk.formats.vlm.onnx_encoder import onnx_features
    from edgesdk.runtime.backends.vlm import ImagePreprocessor, normalise

    path, _ = exported
    pre = json.loads((tiny_llava / "preprocessor_config.json").read_text())
    ip = ImagePreprocessor(pre, 64)
    proc = AutoProcessor.from_pretrained(tiny_llava)
    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava).eval()
    for p in images:
        img = Image.open(p)
        pixels = ip(img)
        pv = proc.image_processor(images=img.convert("RGB"), return_tensors="pt")["pixel_values"]
        assert np.abs(normalise(pixels, pre) - pv.numpy()).max() < 1e-5  # same input as the processor's
        with torch.no_grad():
            f = model.get_image_features(
                pixel_values=pv, vision_feature_layer=-2, vision_feature_select_strategy="full"
            )
        f = (f[0] if isinstance(f, (list, tuple)) else f).reshape(-1, 64).numpy()
        got = onnx_features(path, [pixels], pre)[0]
        assert min_token_cosine(got, f) >= 0.999, p.name


@pytest.mark.slow
def test_export_from_the_transformers5_layout_gives_the_same_encoder(tiny_llava, exported, images, tmp_path):
    """A LLaVA in the transformers 5 layout (vision tensors without ``vision_model.``; tests/vlm_fixtures.py) is
    exported through the transformers-4 view of it: the same features as the 4.57 save's export."""
    from PIL import Image

    from edgesdk.formats.vlm.onnx_encoder import export_encoder, onnx_features
    from edgesdk.runtime.backends.vlm import ImagePreprocessor

    src = to_transformers5_layout(tiny_llava, tmp_path / "tiny-llava-tf5")
    export_encoder(src, tmp_path / "enc32.onnx", tmp_path / "enc16.onnx")
    pre = json.loads((tiny_llava / "preprocessor_config.json").read_text())
    pixels = [ImagePreprocessor(pre, 64)(Image.open(p)) for p in images]
    for a, b in zip(
        onnx_features(exported[0], pixels, pre), onnx_features(tmp_path / "enc16.onnx", pixels, pre), strict=True
    ):
        assert np.array_equal(a, b)


def test_choose_is_honest_about_providers(tmp_path, monkeypatch):
    from edgesdk.runtime.backends.onnxruntime import probe_provider
    from edgesdk.runtime.backends.vlm import onnx_session

    fallbacks = []
    rec = lambda a, b, why: fallbacks.append((a, b, why))  # noqa: E731
    onnx = tmp_path / "vision_encoder.onnx"
    monkeypatch.delenv(onnx_session.ENV, raising=False)
    fast = [ep for ep in onnx_session.FAST_PROVIDERS if probe_provider(ep)[0]]
    provider, why = onnx_session.choose(None, onnx, rec)
    if fast:
        assert provider == fast[0] and not fallbacks
    else:  # this machine: no TensorRT/CUDA -> the mmproj, recorded as a fallback with each provider's reason
        assert provider is None and fallbacks and "TensorrtExecutionProvider" in fallbacks[0][2]
    assert onnx_session.choose("onnx", onnx, rec)[0] == (fast[0] if fast else "CPUExecutionProvider")
    assert onnx_session.choose("mmproj", onnx, rec)[0] is None
    monkeypatch.setenv(onnx_session.ENV, "onnx")
    assert onnx_session.choose(None, onnx, rec)[0] is not None
    assert onnx_session.choose("auto", None, rec)[0] is None  # a bundle built without the ONNX encoder
    with pytest.raises(InputError, match="no ONNX vision encoder"):
        onnx_session.choose("onnx", None, rec)
    with pytest.raises(InputError, match="vision_encoder must be one of"):
        onnx_session.choose("tensorrt", onnx, rec)


@pytest.fixture(scope="module")
def nx_bundle(tiny_llava, tmp_path_factory) -> Path:
    from edgesdk.build import build

    out = tmp_path_factory.mktemp("bundles") / "vlm-nx"
    return build(tiny_llava, "orin-nx-16gb", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.mark.slow
def test_bundle_carries_the_verified_onnx_encoder(nx_bundle):
    m = json.loads((nx_bundle / "manifest.json").read_text())
    roles = {a["role"]: a["path"] for a in m["artifacts"]}
    assert roles["vision_encoder"] == "vision_encoder.onnx" and roles["mmproj"] == "mmproj.gguf"
    ox = m["parity"]["vision"]["onnx_encoder"]
    assert ox["encoder_min_cosine"] >= 0.999 and ox["min_cosine_vs_mmproj"] >= 0.999
    assert ox["greedy_equal_mmproj"] == "3/3" and ox["greedy_equal_pytorch"] == "3/3"
    comp = m["extras"]["vlm"]["components"]["vision_encoder_onnx"]
    assert comp["precision"] == "FP16" and comp["opset"] == 17 and comp["control_flow"] == []


@pytest.mark.slow
def test_onnx_encoder_on_cpu_matches_the_mmproj_path(nx_bundle, images):
    import edgesdk

    onnx_s = edgesdk.load(nx_bundle, vision_encoder="onnx")
    mm_s = edgesdk.load(nx_bundle, vision_encoder="mmproj")
    try:
        for p in images:
            a, b = onnx_s.backend.image_features(p), mm_s.backend.image_features(p)
            assert a.shape == b.shape == (16, 64)
            assert min_token_cosine(a, b) >= 0.999, p.name
        for p in images:
            ta = onnx_s.generate("Describe the image.", images=[p], max_tokens=8, temperature=0)
            ids_a = onnx_s.backend.last["output_ids"]
            tb = mm_s.generate("Describe the image.", images=[p], max_tokens=8, temperature=0)
            assert ids_a == mm_s.backend.last["output_ids"] and ta == tb, p.name
        ra, rb = onnx_s.report()["backend_report"]["vision_encoder"], mm_s.report()["backend_report"]["vision_encoder"]
        assert ra["path"] == "onnx" and ra["provider"] == "CPUExecutionProvider" and "as asked" in ra["reason"]
        assert ra["encode_ms"]["onnx"]["runs"] == len(images) and "mmproj" not in ra["encode_ms"]
        assert rb["path"] == "mmproj" and rb["encode_ms"]["mmproj"]["runs"] == len(images)
        # a second question about the same image does not run the ONNX encoder again
        onnx_s.generate("And the colour?", images=[images[0]], max_tokens=2, temperature=0)
        assert onnx_s.report()["backend_report"]["vision_encoder"]["encode_ms"]["onnx"]["runs"] == len(images)
    finally:
        onnx_s.close()
        mm_s.close()


@pytest.mark.slow
def test_auto_falls_back_to_the_mmproj_and_says_so(nx_bundle, images, monkeypatch):
    import edgesdk
    from edgesdk.runtime.backends.onnxruntime import probe_provider

    if any(probe_provider(ep)[0] for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider")):
        pytest.skip("a fast ONNX Runtime provider initialises here: auto picks the ONNX encoder")
    monkeypatch.delenv("EDGESDK_VLM_ENCODER", raising=False)
    s = edgesdk.load(nx_bundle)
    try:
        s.generate("Describe the image.", images=[images[0]], max_tokens=2, temperature=0)
        rep = s.report()
        enc = rep["backend_report"]["vision_encoder"]
        assert enc["path"] == "mmproj" and "no fast ONNX Runtime provider" in enc["reason"]
        assert any(f["to"] == "llama.cpp mmproj vision encoder" for f in rep["fallbacks"])
    finally:
        s.close()
    monkeypatch.setenv("EDGESDK_VLM_ENCODER", "onnx")  # the environment variable forces it too
    s = edgesdk.load(nx_bundle)
    try:
        assert s.report()["backend_report"]["vision_encoder"]["path"] == "onnx"
    finally:
        s.close()
