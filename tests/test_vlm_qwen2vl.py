# SPDX-License-Identifier: Apache-2.0
"""Qwen2-VL (``Qwen2VLForConditionalGeneration``), its own family record (``families/qwen2vl.py``): a random-weight
model from Qwen/Qwen2-VL-2B-Instruct's published configuration, shrunk (``make_tiny_qwen2vl`` in
tests/test_qwen25vl.py, where tools/bench imports it), saved by transformers 4.57 and in the transformers 5 layout
derived from that save as for Qwen2.5-VL (``to_qwen_vl_transformers5``, + the tower's ``qwen2_vl_vision`` model type
a real 5.17 save has), converted to a qwen2vl decoder GGUF + a ``qwen2vl_merger`` mmproj and checked against
PyTorch; ``edgesdk build`` / ``run --image`` and ``edgesdk serve`` with the ``openai`` client (issue 21).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from test_qwen25vl import make_qwen25vl_images, make_tiny_qwen2vl, to_qwen_vl_transformers5  # noqa: E402

PROMPT = "Describe the image."


def make_tiny_qwen2vl_tf5(directory: Path, *, seed: int = 0) -> Path:
    """The tiny Qwen2-VL in a transformers 5 layout: derived from the 4.57 save as Qwen2.5-VL's
    (:func:`test_qwen25vl.to_qwen_vl_transformers5`: rope_parameters, processor_config.json, the tokenizer files,
    ``model.visual.*`` / ``model.language_model.*``) with the tower's model type ``qwen2_vl_vision``, as a real
    transformers 5.17 save of Qwen2-VL on the GPU machine names it (docs/vlm.md). Not compared with a real 5.x save
    otherwise (no transformers 5 on this host)."""
    directory = Path(directory)
    src = make_tiny_qwen2vl(directory.with_name(directory.name + "-tf4"), seed=seed)
    out = to_qwen_vl_transformers5(src, directory)
    cfg = json.loads((out / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "qwen2_vl_vision"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


@pytest.fixture(scope="module")
def tiny_qwen2vl(tmp_path_factory) -> Path:
    return make_tiny_qwen2vl(tmp_path_factory.mktemp("vlm-qwen2vl") / "tiny-qwen2vl")


@pytest.fixture(scope="module")
def qwen2vl_images(tmp_path_factory) -> list[Path]:
    return make_qwen25vl_images(tmp_path_factory.mktemp("images-qwen2vl"))


def test_the_family_is_one_module_and_one_registry_line():
    """Qwen2-VL's record (families/qwen2vl.py, its name in REGISTRY); Qwen2.5-VL's no longer claims its class or
    towers. Both save the same image processor, which by_processor maps to the first (Qwen2.5-VL's), whose resize,
    prompt and chat functions are Qwen2-VL's too; the runtime takes a bundle's record from its manifest
    (test_the_runtime_takes_the_record_the_bundle_was_built_with)."""
    from edgesdk.contracts.vlm_families import by_processor
    from edgesdk.formats.vlm.families import REGISTRY, by_config, by_name

    fam, v25 = by_name("qwen2vl"), by_name("qwen25vl")
    assert REGISTRY[-2:] == ("qwen25vl", "qwen2vl") and fam.display == "Qwen2-VL"
    assert fam.architectures == ("Qwen2VLForConditionalGeneration",)
    assert (
        fam.vision_model_types == {"qwen2_vl", "qwen2_vl_vision"}
        and not fam.vision_model_types & v25.vision_model_types
    )
    assert by_config({"architectures": ["Qwen2VLForConditionalGeneration"]}) is fam
    # transformers 4.57 saves ``architectures`` inside text_config only
    assert by_config({"text_config": {"architectures": ["Qwen2VLForConditionalGeneration"]}}) is fam
    assert by_config({"architectures": ["Qwen2_5_VLForConditionalGeneration"]}) is v25
    assert by_processor({"image_processor_type": "Qwen2VLImageProcessor"}) is v25.runtime
    for hook in ("resize", "max_image_tokens", "user_prompt", "chat"):
        assert getattr(fam.runtime, hook) is getattr(v25.runtime, hook), hook
    for hook in ("text_config", "text_tensor_name"):
        assert getattr(fam, hook) is getattr(v25, hook), hook
    assert fam.frames == "dynamic" and fam.text_architecture == "Qwen2VLTextModel"


def test_facts_read_the_tower_from_the_record(tiny_qwen2vl):
    """The tower's width (embed_dim: its hidden_size is the merger's output) and no window attention come from the
    record's hooks; a record without them reads vision_config.hidden_size and counts no window mask."""
    from edgesdk.formats.vlm.facts import hf_vlm_facts
    from edgesdk.formats.vlm.families import by_name

    facts = hf_vlm_facts(tiny_qwen2vl)
    assert facts["family"] == "qwen2vl" and facts["vision_hidden"] == 160 and facts["window_attention"] is False
    cfg = {"vision_config": {"hidden_size": 64, "embed_dim": 999, "fullatt_block_indexes": [1]}}
    assert by_name("llava").tower_width(cfg) == 64 and by_name("llava").windowed(cfg) is False
    assert by_name("qwen25vl").tower_width(cfg) == 64 and by_name("qwen25vl").windowed(cfg) is True
    assert by_name("qwen2vl").tower_width(cfg) == 999 and by_name("qwen2vl").windowed(cfg) is False


def test_mmproj_is_llama_cpp_qwen2vl_merger(tiny_qwen2vl, tmp_path):
    """LayerNorm tower with biases, QuickGELU fc1 / fc2, full attention everywhere."""
    import gguf
    from safetensors.numpy import load_file

    from edgesdk.build import make_plan
    from edgesdk.formats.vlm.convert import write_mmproj

    info = write_mmproj(tiny_qwen2vl, tmp_path / "mmproj.gguf")
    assert info["projector_type"] == "qwen2vl_merger" and info["n_wa_pattern"] is None
    assert info["family"] == "qwen2vl"
    r = gguf.GGUFReader(str(tmp_path / "mmproj.gguf"))
    f = {k: v.contents() for k, v in r.fields.items() if k.startswith("clip.")}
    assert f["clip.projector_type"] == "qwen2vl_merger" and "clip.use_silu" not in f  # QuickGELU: clip's default
    assert "clip.vision.n_wa_pattern" not in f and f["clip.vision.embedding_length"] == 160
    assert f["clip.vision.feed_forward_length"] == 640 and f["clip.vision.projection_dim"] == 256
    t = {x.name: np.array(x.data) for x in r.tensors}
    hf = load_file(str(tiny_qwen2vl / "model.safetensors"))
    np.testing.assert_allclose(t["v.post_ln.bias"], hf["visual.merger.ln_q.bias"], atol=0)
    np.testing.assert_allclose(
        t["v.blk.1.ffn_up.weight"].astype(np.float32).reshape(640, 160), hf["visual.blocks.1.mlp.fc1.weight"], atol=1e-3
    )
    assert {"v.blk.0.ln1.bias", "v.blk.3.ffn_down.bias", "v.patch_embd.weight.1"} <= set(t)
    text = make_plan(tiny_qwen2vl, "orin").explain()
    assert "LayerNorm + two-layer GELU MLP" in text and "up to 4096 image tokens per image" in text
    assert "Qwen2-VL: the encoder runs in llama.cpp's libmtmd" in text


def test_transformers5_tower_name_is_accepted(tiny_qwen2vl, tmp_path):
    """transformers 5 names Qwen2-VL's tower ``qwen2_vl_vision`` (4.57: ``qwen2_vl``); a 5.17 save on the GPU
    machine was refused for it once. Same plan either way."""
    from edgesdk.build import make_plan

    src = tmp_path / "qwen2vl-tf5-tower"
    shutil.copytree(tiny_qwen2vl, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["vision_config"]["model_type"] = "qwen2_vl_vision"
    (src / "config.json").write_text(json.dumps(cfg))
    text = make_plan(src, "orin").explain()
    base = make_plan(tiny_qwen2vl, "orin").explain().replace(tiny_qwen2vl.name, src.name)
    assert "LayerNorm + two-layer GELU MLP" in text  # Qwen2-VL's merger, not Qwen2.5-VL's RMS norm
    assert text == base.replace("qwen2_vl encoder", "qwen2_vl_vision encoder")


@pytest.mark.parametrize("family", ["qwen2vl", "qwen25vl"])
def test_inspect_reads_architectures_from_text_config(family, tiny_qwen2vl, tmp_path):
    """A directory as transformers 4.57 saves Qwen2-VL / Qwen2.5-VL (``architectures`` only inside text_config; the
    fixtures add the hub's top-level key) is image-text-to-text, as the family lookup reads it; same plan."""
    from test_qwen25vl import make_tiny_qwen25vl

    from edgesdk.build import make_plan
    from edgesdk.inspect import inspect_model

    src = tiny_qwen2vl if family == "qwen2vl" else make_tiny_qwen25vl(tmp_path / "tiny-qwen25vl")
    saved = tmp_path / "saved-by-4.57"
    shutil.copytree(src, saved)
    cfg = json.loads((saved / "config.json").read_text())
    arch = cfg.pop("architectures")[0]
    assert cfg["text_config"]["architectures"] == [arch]  # as 4.57 wrote it
    (saved / "config.json").write_text(json.dumps(cfg))
    facts = inspect_model(saved)
    assert facts.task == "image-text-to-text" and facts.architecture == arch and facts.extra["family"] == family
    base = make_plan(src, "orin").explain().replace(src.name, saved.name)
    assert make_plan(saved, "orin").explain() == base


@pytest.mark.parametrize(
    "vision, match",
    [
        ({"hidden_act": "silu"}, r"hidden_act 'silu' is not supported \(quick_gelu\)"),
        ({"mlp_ratio": 1}, "a vision FFN as wide as the embedding is not supported"),
        ({"model_type": "qwen2_5_vl"}, "vision tower 'qwen2_5_vl' is not Qwen2-VL's"),
    ],
)
def test_unsupported_qwen2vl_checkpoints_are_one_line_model_errors(tiny_qwen2vl, tmp_path, vision, match):
    from edgesdk.errors import ModelError
    from edgesdk.formats.vlm.convert import write_mmproj

    bad = tmp_path / "bad"
    shutil.copytree(tiny_qwen2vl, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["vision_config"].update(vision)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=match) as err:
        write_mmproj(bad, tmp_path / "mm.gguf")
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def qwen2vl_bundle(tiny_qwen2vl, tmp_path_factory) -> Path:
    """The transformers 4.57 save built through the Python API (F16 decoder)."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles-qwen2vl") / "qwen2vl-f16"
    return build(tiny_qwen2vl, "cpu-x86_64", out, BuildOptions(progress=False, quant_type="F16"))


@pytest.fixture(scope="module")
def qwen2vl_cli_build_5(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The transformers 5 layout built through the CLI, ``edgesdk build SRC --profile cpu-x86_64 -o OUT`` (the
    profile's own decoder quantization, every parity gate)."""
    src = make_tiny_qwen2vl_tf5(tmp_path_factory.mktemp("vlm-qwen2vl-5") / "tiny-qwen2vl-tf5")
    out = tmp_path_factory.mktemp("bundles-qwen2vl") / "qwen2vl-5-cpu"
    cmd = [sys.executable, "-m", "edgesdk", "build", str(src), "--profile", "cpu-x86_64", "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900), out


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_build_matches_pytorch(layout, request):
    """Decoder logits, image features per token and greedy tokens on three images of different sizes (63, 55 and
    6 image tokens), the prompt tokens equal to the HF processor's, from either transformers layout."""
    if layout == "transformers4":
        bundle = request.getfixturevalue("qwen2vl_bundle")
    else:
        proc, bundle = request.getfixturevalue("qwen2vl_cli_build_5")
        assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((bundle / "manifest.json").read_text())
    vlm = m["extras"]["vlm"]
    assert m["format"] == "vlm" and vlm["mmproj"]["checkpoint_layout"]["transformers"] == layout[-1] + ".x"
    assert vlm["components"]["projector"]["type"] == "qwen2vl_merger" and vlm["mmproj"]["family"] == "qwen2vl"
    vision = m["parity"]["vision"]
    assert vision["encoder_min_cosine"] >= 0.999 and vision["greedy_equal"] == "3/3"
    assert [p["image_tokens"] for p in vision["per_image"]] == [63, 55, 6]
    for p in vision["per_image"]:
        assert p["tokens_ours"] == p["tokens_pytorch"] and p["input_tokens_ours"] == p["input_tokens_pytorch"]
    assert len({tuple(p["tokens_ours"]) for p in vision["per_image"]}) == 3  # the answer depends on the image
    assert m["parity"]["decoder_logits_vs_hf"]["min_cosine"] >= 0.999


@pytest.mark.slow
def test_cli_build_and_run_with_an_image(qwen2vl_cli_build_5, qwen2vl_images, run_cli):
    """``edgesdk build`` (the transformers 5 layout, the profile's quantization) and ``edgesdk run BUNDLE --image
    IMG --prompt``: the image's own token count (250 x 190 -> 252 x 196 px -> 9 x 7 tokens)."""
    proc, out = qwen2vl_cli_build_5
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["extras"]["llm"]["quant_type"] != "F16" and m["parity"]["decoder_ppl_ratio"] <= 1.1
    run = run_cli(
        "run", str(out), "--image", str(qwen2vl_images[0]), "--prompt", PROMPT, "-n", "4", "--temp", "0", "--json"
    )
    assert run.returncode == 0, run.stderr
    last = json.loads(run.stdout)["report"]["backend_report"]["last_request"]
    assert last["image_tokens"] == 63


@pytest.mark.slow
def test_the_runtime_takes_the_record_the_bundle_was_built_with(qwen2vl_bundle, tmp_path):
    """A Qwen2-VL bundle runs with Qwen2-VL's record (the manifest's extras.vlm.mmproj.family), not the record its
    shared image processor maps to; a bundle that records no family (older builds) falls back to that mapping."""
    import shutil

    import edgesdk
    from edgesdk.manifest import content_hash

    s = edgesdk.load(qwen2vl_bundle)
    try:
        assert s.backend.pipe.pre.record.name == "qwen2vl"
    finally:
        s.close()
    old = tmp_path / "no-family"
    shutil.copytree(qwen2vl_bundle, old)
    m = json.loads((old / "manifest.json").read_text())
    del m["extras"]["vlm"]["mmproj"]["family"]
    m["manifest_sha256"] = content_hash(m)  # as a build before the field wrote it
    (old / "manifest.json").write_text(json.dumps(m))
    s = edgesdk.load(old)
    try:
        assert s.backend.pipe.pre.record.name == "qwen25vl"
    finally:
        s.close()


@pytest.mark.slow
def test_served_chat_with_an_image_equals_edgesdk_run(qwen2vl_bundle, qwen2vl_images, tmp_path, run_cli):
    """``edgesdk serve`` on the Qwen2-VL bundle: an OpenAI chat request with an ``image_url`` data URL (the real
    ``openai`` client) answers what ``edgesdk run --chat --image`` answers, the image's 55 tokens counted in the
    prompt."""
    from vlm_serve_check import served_reply_equals_run

    n = served_reply_equals_run(qwen2vl_bundle, qwen2vl_images[1], PROMPT, tmp_path, run_cli, name="qwen2vl")
    assert n == 55 + 44  # image + text tokens
