# SPDX-License-Identifier: Apache-2.0
"""VLM build stages: convert (decoder HF -> F16 GGUF with the GGUF converter; vision encoder +
projector -> F16 mmproj GGUF), quantize the decoder with llama.cpp, verify per component and end
to end against PyTorch:

* decoder: HF logits vs the F16 GGUF (as the GGUF path), sanity logits, perplexity ratio when quantized;
* encoder + projector: image features from llama.cpp (mtmd, F16 mmproj) vs PyTorch's
  ``get_image_features`` on generated test images, min cosine per image token;
* end to end: the first greedy tokens of the F16 decoder + mmproj pipeline equal PyTorch's
  ``generate`` (greedy) for the same image and prompt.
The PyTorch reference runs in a child process (as in the GGUF path):
``python -m edgesdk.formats.vlm._children.hf_reference`` (edgesdk/formats/vlm/_children/hf_reference.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, ParityError
from edgesdk.formats.gguf import convert as gconv
from edgesdk.formats.gguf.build import PPL_TEXT, llm_config, sanity_check
from edgesdk.formats.gguf.facts import gguf_facts
from edgesdk.formats.gguf.plan import LOGITS_MIN_COSINE, LOGITS_MIN_TOP1, PPL_RATIO_MAX
from edgesdk.formats.vlm import convert as vconv
from edgesdk.formats.vlm.families import config_architecture
from edgesdk.formats.vlm.plan import ENCODER_MIN_COSINE, GREEDY_TOKENS, VlmPlan, vlm_section

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext

PARITY_PROMPT = "Describe the image."


def test_images(directory: Path, sizes: tuple[tuple[int, int], ...] | None = None) -> list[Path]:
    """Three deterministic synthetic images (gradient and checkerboard 100x80, noise 96x60) for parity: a split
    SmolVLM processor makes 4 x 4 tiles of the first two and 4 x 3 of the third. ``sizes``: three (width, height)
    for the gradient, the checkerboard and the noise instead (a dynamic-resolution family's record sets them, so
    the image tokens differ per image)."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    (w0, h0), (w1, h1), (w2, h2) = sizes or ((100, 80), (100, 80), (96, 60))
    y, x = np.mgrid[0:h0, 0:w0]
    grad = np.stack([x * 255 // (w0 - 1), y * 255 // (h0 - 1), (x + y) * 255 // (w0 + h0 - 2)], axis=-1)
    y, x = np.mgrid[0:h1, 0:w1]
    imgs = [
        grad,
        np.stack([((x // 10 + y // 10) % 2) * 255] * 3, axis=-1),
        np.random.default_rng(0).integers(0, 256, size=(h2, w2, 3)),
    ]
    out = []
    for i, a in enumerate(imgs):
        out.append(directory / f"parity{i}.png")
        Image.fromarray(a.astype(np.uint8)).save(out[-1])
    return out


def hf_vlm_reference(hf_dir: Path, images: list[Path], prompt: str, n_tokens: int) -> list[dict[str, Any]]:
    """Per image: PyTorch image features, greedy tokens and input ids (child process)."""
    with tempfile.TemporaryDirectory(prefix="edgesdk-vlm-ref-") as tmp:
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "ref.npz"
        arch = config_architecture(vconv.read_config(hf_dir))
        spec.write_text(
            json.dumps({"images": [str(p) for p in images], "prompt": prompt, "n": n_tokens, "architecture": arch})
        )
        # a transformers 5 checkpoint as this host's transformers 4 loads it (unchanged otherwise)
        ref_dir = gconv.reference_dir(Path(hf_dir), Path(tmp) / "ref", rename=vconv.canonical_name)
        gconv.run_child(
            "edgesdk.formats.vlm._children.hf_reference", [ref_dir, spec, out], out, "PyTorch VLM reference"
        )
        with np.load(out) as d:
            return [
                {
                    "features": d[f"features{i}"],
                    "tokens": d[f"tokens{i}"].tolist(),
                    "scores": d[f"scores{i}"] if f"scores{i}" in d.files else None,
                    "input_ids": d[f"input_ids{i}"].tolist(),
                    **(
                        {
                            "features_unfixed": d[f"features_unfixed{i}"],
                            "tokens_unfixed": d[f"tokens_unfixed{i}"].tolist(),
                        }
                        if f"features_unfixed{i}" in d.files
                        else {}
                    ),
                }
                for i in range(len(images))
            ]


def component_parity(
    hf_dir: Path,
    decoder: Path,
    mmproj: Path,
    *,
    n_tokens: int = GREEDY_TOKENS,
    prompt: str = PARITY_PROMPT,
    work: Path | None = None,
    onnx_encoder: Path | None = None,
    mmproj_encodes: bool = True,
    tie_tolerance: float | None = None,
    open_backend: Callable[..., Any],
) -> dict[str, Any]:
    """Encoder + projector features (llama.cpp F16 mmproj vs PyTorch) and greedy tokens end to end; with
    ``onnx_encoder``, the same for the FP16 ONNX encoder (``onnx_encoder.onnx_parity``). With
    ``mmproj_encodes=False`` (a class-token CLIP tower with a tokenize-only mmproj, convert.CLASS_TOKEN_NOTE) the
    pipeline runs the ONNX encoder (CPU provider) and every figure is its own (``encoder: onnx``).
    ``open_backend``: the runtime's :func:`edgesdk.runtime.backends.vlm.parity_backend` (the build hands it over
    as ``ctx.parity_backend``: formats sit below the runtime and do not import it). ``tie_tolerance``: greedy
    tokens that first differ where PyTorch's scores of the two tokens are at most this far apart count as a
    near-tie (:mod:`edgesdk.formats.vlm.greedy`), reported in ``greedy_near_tie``; None: exact equality only."""
    from edgesdk.formats.vlm.greedy import greedy_agreement

    work = Path(work or tempfile.mkdtemp(prefix="edgesdk-vlm-"))
    # the family's own prompt with one image, as the runtime formats a plain prompt (backends/vlm/backend.py)
    from edgesdk.formats.vlm.families import by_config

    fam = by_config(vconv.read_config(hf_dir))
    images = test_images(work / "images", fam.parity_image_sizes)
    ref_prompt = fam.reference_prompt(prompt)
    refs = hf_vlm_reference(hf_dir, images, ref_prompt, n_tokens)
    pre = dict(vconv.image_processor(hf_dir))
    cfg = vconv.read_config(hf_dir)
    pre["_image_size"] = cfg["vision_config"].get("image_size")  # None: dynamic resolution
    # the context holds the longest reference prompt (image tokens included) and the greedy tokens
    n_ctx = max(256, max(len(r["input_ids"]) for r in refs) + n_tokens + 16)
    # a tokenize-only mmproj: the ONNX encoder is the encoder, measured as the runtime runs it
    if not mmproj_encodes and onnx_encoder is None:
        raise ParityError("a class-token vision tower needs the ONNX encoder (the mmproj does not encode)")
    backend = open_backend(decoder, mmproj, pre, n_ctx=n_ctx, onnx=None if mmproj_encodes else onnx_encoder)
    pipe = backend.pipe
    cos_min, equal, ties, per_image, mm_results = 1.0, 0, 0, [], []
    # Idefics3/SmolVLM on transformers 4.55-4.57: figures vs the unmodified vision embeddings
    unfixed: dict[str, Any] = {}
    try:
        for path, ref in zip(images, refs, strict=True):
            got = backend.image_features(path).astype(np.float64)
            want = ref["features"]
            if got.shape != want.shape:
                raise ParityError(
                    f"image features shape {list(got.shape)} from llama.cpp vs {list(want.shape)} from PyTorch"
                )
            cos = (got * want).sum(1) / np.clip(np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-30, None)
            backend.generate(prompt, images=[path], max_tokens=n_tokens, temperature=0.0, seed=0)
            ours = backend.last["output_ids"]
            mm_results.append({"features": got, "tokens": ours})
            # both stop at an end-of-generation token or after n_tokens
            agreement = greedy_agreement(
                ours, ref["tokens"], ref["scores"] if tie_tolerance is not None else None, tie_tolerance or 0.0
            )
            equal += int(agreement.equal)
            ties += int(agreement.near_tie)
            cos_min = min(cos_min, float(cos.min()))
            per_image.append(
                {
                    "image": path.name,
                    "image_tokens": int(got.shape[0]),
                    "min_cosine": round(float(cos.min()), 6),
                    "max_abs": round(float(np.abs(got - want).max()), 6),
                    "tokens_ours": ours,
                    "tokens_pytorch": ref["tokens"],
                    "input_tokens_ours": backend.last["input_tokens"],
                    "input_tokens_pytorch": len(ref["input_ids"]),
                    **({"near_tie": agreement.to_dict()} if agreement.near_tie else {}),
                }
            )
            if "features_unfixed" in ref:
                u = ref["features_unfixed"]
                cu = (got * u).sum(1) / np.clip(np.linalg.norm(got, axis=1) * np.linalg.norm(u, axis=1), 1e-30, None)
                unfixed["min_cosine"] = min(unfixed.get("min_cosine", 1.0), round(float(cu.min()), 6))
                unfixed["greedy_equal"] = unfixed.get("greedy_equal", 0) + int(ours == ref["tokens_unfixed"])
    finally:
        backend.close()
    out: dict[str, Any] = {
        "images": len(images),
        "encoder_min_cosine": round(cos_min, 6),
        "greedy_equal": f"{equal}/{len(images)}",
        "greedy_near_tie": f"{ties}/{len(images)}",
        "greedy_tie_tolerance": None if tie_tolerance is None else round(tie_tolerance, 6),
        "greedy_tokens": n_tokens,
        "per_image": per_image,
    }
    if unfixed:
        import transformers

        out["reference"] = (
            f"transformers {transformers.__version__} with the vision position ids the model "
            "was trained with (0..n-1 per axis, as llama.cpp and transformers before 4.55 / "
            "after PR #41374); "
            "its own 4.55-4.57 embeddings shift them (transformers issue #41190)"
        )
        out["vs_unmodified_transformers"] = {
            "encoder_min_cosine": unfixed["min_cosine"],
            "greedy_equal": f"{unfixed['greedy_equal']}/{len(images)}",
        }
    if not mmproj_encodes:
        times = pipe.encode_s["onnx"]
        out.update(
            encoder="onnx",
            why=vconv.CLASS_TOKEN_NOTE,
            onnx_encoder={
                "provider": "CPUExecutionProvider (build host; the runtime prefers TensorRT > CUDA)",
                "encode_ms_median": round(float(np.median(times[1:] or times)) * 1e3, 3) if times else None,
            },
        )
    elif onnx_encoder is not None:
        from edgesdk.formats.vlm.onnx_encoder import onnx_parity

        out["onnx_encoder"] = onnx_parity(
            decoder,
            mmproj,
            onnx_encoder,
            pre,
            images,
            refs,
            mm_results,
            n_ctx=n_ctx,
            n_tokens=n_tokens,
            prompt=prompt,
            mmproj_encode_s=pipe.encode_s["mmproj"],
            open_backend=open_backend,
        )
    return out


def _check_vision_parity(comp: dict[str, Any], mm_info: dict[str, Any], thresholds: dict[str, Any]) -> None:
    """ParityError unless the image features (mmproj, or the ONNX encoder of a class-token tower) reach the
    plan's min cosine, the greedy tokens equal PyTorch's (near-ties allowed) on every test image, and an ONNX
    encoder beside an encoding mmproj matches both."""
    if comp["encoder_min_cosine"] < thresholds.get("encoder_min_cosine", ENCODER_MIN_COSINE):
        raise ParityError(
            f"image features from the {comp.get('encoder', 'F16 mmproj')} encoder differ from "
            f"PyTorch: min cosine "
            f"{comp['encoder_min_cosine']:.5f} per image token"
        )
    n_eq, n_img = (int(x) for x in comp["greedy_equal"].split("/"))
    n_eq += int(comp["greedy_near_tie"].split("/")[0])
    if n_eq != n_img:
        raise ParityError(
            f"greedy tokens of the F16 build differ from PyTorch's on {n_img - n_eq} of {n_img} test images "
            f"(beyond near-ties within {comp['greedy_tie_tolerance']} of PyTorch's top score)"
        )
    ox = comp.get("onnx_encoder")
    if ox is not None and mm_info.get("encodes", True):  # else the figures above are the ONNX encoder's
        if ox["encoder_min_cosine"] < thresholds.get("encoder_min_cosine", ENCODER_MIN_COSINE):
            raise ParityError(
                f"image features from the FP16 ONNX encoder differ from PyTorch: min cosine "
                f"{ox['encoder_min_cosine']:.5f} per image token"
            )
        if mm_info.get("encodes", True) and ox["greedy_equal_mmproj"] != f"{n_img}/{n_img}":
            raise ParityError(
                f"greedy tokens with the FP16 ONNX encoder differ from the mmproj path's on "
                f"{ox['greedy_equal_mmproj']} equal test images"
            )


def _vlm_extras(
    section: VlmPlan, quant: str, mm_info: dict[str, Any], mmproj_bytes: int, onnx_info: dict[str, Any] | None
) -> dict[str, Any]:
    """The manifest's ``extras.vlm``: each component's artifact and precision (a class-token tower's encoder is
    the ONNX graph, its mmproj only tokenizes image chunks), the image size and tokens, the mmproj's facts, and
    with an ONNX encoder its record and the vision encoder's own backend chain."""
    vlm: dict[str, Any] = {
        "components": {
            "vision_encoder": {"artifact": "mmproj.gguf", "precision": "F16"},
            "projector": {"artifact": "mmproj.gguf", "precision": "F16", "type": mm_info["projector_type"]},
            "decoder": {"artifact": "model.gguf", "precision": quant},
            # the model's own image preprocessing (size, mean/std, resampling) the runtime applies
            "image_preprocessor": {"artifact": "preprocessor_config.json"},
        },
        "image_size": mm_info["image_size"],
        "image_tokens": mm_info["image_tokens"],
        "mmproj": mm_info,
        "mmproj_bytes": mmproj_bytes,
    }
    comps = vlm["components"]
    if not mm_info.get("encodes", True):  # class-token tower: the ONNX graph encodes, the mmproj tokenizes
        comps["vision_encoder"] = {
            "artifact": "vision_encoder.onnx",
            "precision": "FP16",
            "why": vconv.CLASS_TOKEN_NOTE,
        }
        comps["projector"].update(artifact="vision_encoder.onnx", precision="FP16")
        comps["image_chunk_tokenizer"] = {
            "artifact": "mmproj.gguf",
            "precision": "F16",
            "use": "libmtmd tokenizes image chunks with it; it never encodes",
        }
    if onnx_info:
        comps["vision_encoder_onnx"] = {
            "artifact": "vision_encoder.onnx",
            "precision": "FP16",
            "includes": "vision encoder + projector",
            "providers": section.vision_runtime.providers if section.vision_runtime is not None else None,
            **onnx_info,
        }
        # the vision encoder's own chain; the decoder's stays llama.cpp
        vlm["vision_encoder_chain"] = [
            "onnxruntime TensorrtExecutionProvider (FP16 ONNX)",
            "onnxruntime CUDAExecutionProvider (FP16 ONNX)",
            "llama.cpp libmtmd (F16 mmproj)"
            if mm_info.get("encodes", True)
            else "onnxruntime CPUExecutionProvider (FP16 ONNX)",
        ]
    return vlm


def _decoder_parity(text_dir: Path, f16: Path, final: Path, quant: str, n_ctx: int, name: str) -> dict[str, Any]:
    """The decoder's parity entries, as the GGUF path measures them: the F16 decoder's logits vs PyTorch's, a
    sanity generation of the ``quant`` decoder and, when quantized, its perplexity vs the F16 one; ParityError
    past a limit."""
    out: dict[str, Any] = {}
    text = PPL_TEXT.read_text(encoding="utf-8")
    logits = gconv.logits_parity(text_dir, f16, text)
    out["decoder_logits_vs_hf"] = logits
    if logits["min_cosine"] < LOGITS_MIN_COSINE or logits["top1_agreement"] < LOGITS_MIN_TOP1:
        raise ParityError(
            f"F16 decoder logits differ from PyTorch: min cosine {logits['min_cosine']:.5f}, "
            f"top-1 {logits['top1_agreement']:.3f}"
        )
    out["decoder_sanity"] = sanity_check(final, f"{quant} decoder of {name}")
    if quant != "F16":
        ppl_out, ppl_ref = (
            gconv.perplexity(final, text, min(256, n_ctx)),
            gconv.perplexity(f16, text, min(256, n_ctx)),
        )
        ratio = ppl_out["ppl"] / ppl_ref["ppl"]
        out.update(decoder_ppl=ppl_out, decoder_ppl_reference=ppl_ref, decoder_ppl_ratio=round(ratio, 5))
        if ratio > PPL_RATIO_MAX.get(quant, 1.1):
            raise ParityError(
                f"{quant} decoder perplexity is {ratio:.4f}x the F16 one (limit {PPL_RATIO_MAX.get(quant, 1.1)}x)"
            )
    return out


def _write_preprocessor(src: Path, out: Path) -> None:
    """The bundle's own preprocessor_config.json: the model's, or with transformers 5 (the image processor nested
    in processor_config.json) the image processor alone."""
    if (src / "preprocessor_config.json").is_file():
        shutil.copyfile(src / "preprocessor_config.json", out)
    else:
        out.write_text(json.dumps(vconv.image_processor(src), indent=2) + "\n", encoding="utf-8")


def build_vlm(ctx: BuildContext) -> None:
    facts, plan = ctx.facts, ctx.plan
    src = Path(facts.source)
    section = vlm_section(plan.section)
    quant, n_ctx = section.quant_type, section.context_length
    thresholds: dict[str, Any] = dict(section.parity)
    work = ctx.staging / "_work"
    work.mkdir(parents=True, exist_ok=True)
    final, mmproj, f16 = ctx.staging / "model.gguf", ctx.staging / "mmproj.gguf", work / "decoder-f16.gguf"
    parity: dict[str, Any] = {"thresholds": thresholds}
    try:
        with ctx.stage("convert", {"edgesdk.gguf.quant_type": quant}):
            ctx.progress("decoder: language_model -> F16 GGUF (gguf-py); encoder + projector -> F16 mmproj")
            text_dir = vconv.write_text_model_dir(src, work / "text")
            dec_info = gconv.convert_hf_to_gguf(text_dir, f16, name=facts.name)
            mm_info = vconv.write_mmproj(src, mmproj, name=facts.name)
            onnx_info = None
            if section.onnx_encoder:
                from edgesdk.formats.vlm.onnx_encoder import export_encoder

                ctx.progress("encoder + projector -> ONNX (torch.onnx.export, static shape) -> FP16")
                onnx_info = export_encoder(src, work / "vision_encoder-fp32.onnx", ctx.staging / "vision_encoder.onnx")
        with ctx.stage("quantize"):
            if quant == "F16":
                shutil.copyfile(f16, final)
            else:
                ctx.progress(f"llama.cpp quantize decoder F16 -> {quant}")
                gconv.quantize(f16, final, quant)
        with ctx.stage("verify"):
            parity.update(_decoder_parity(text_dir, f16, final, quant, n_ctx, facts.name))
            logits = parity["decoder_logits_vs_hf"]
            ctx.progress("parity: image features (llama.cpp mmproj vs PyTorch) and greedy tokens end to end (F16)")
            if ctx.parity_backend is None:
                raise BackendUnavailableError(
                    "the VLM parity stage needs the runtime's parity_backend "
                    "(edgesdk.build hands it over as ctx.parity_backend)"
                )
            comp = component_parity(
                src,
                f16,
                mmproj,
                n_tokens=int(thresholds.get("greedy_tokens", GREEDY_TOKENS)),
                work=work,
                onnx_encoder=ctx.staging / "vision_encoder.onnx" if onnx_info else None,
                mmproj_encodes=mm_info.get("encodes", True),
                # each of PyTorch's two logits may be off by the F16 decoder's measured max abs logit error
                tie_tolerance=2 * float(logits["max_abs"]),
                open_backend=ctx.parity_backend,
            )
            parity["vision"] = comp
            _check_vision_parity(comp, mm_info, thresholds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _write_preprocessor(src, ctx.staging / "preprocessor_config.json")
    for rel, role in (("model.gguf", "model"), ("mmproj.gguf", "mmproj"), ("preprocessor_config.json", "config")):
        ctx.add_artifact(rel, role)
    if onnx_info:
        ctx.add_artifact("vision_encoder.onnx", "vision_encoder")
    out_facts = gguf_facts(final)
    ctx.manifest.parity = parity
    ctx.manifest.io = {
        "inputs": [
            {"name": "prompt", "type": "text"},
            {"name": "images", "type": "image"},
            {"name": "messages", "type": "chat"},
        ],
        "outputs": [{"name": "text", "type": "text"}],
        "n_vocab": out_facts.get("n_vocab"),
    }
    ctx.manifest.llm = llm_config(plan, out_facts, final, n_ctx=n_ctx, quant=quant, converted=dec_info)
    ctx.manifest.extras["vlm"] = _vlm_extras(section, quant, mm_info, mmproj.stat().st_size, onnx_info)
    ctx.manifest.runtime.backend_chain = ["llama.cpp + libmtmd (GPU offload)", "llama.cpp + libmtmd (CPU)"]
    ctx.runtime_requires.extend(["llama-cpp-python", "pillow"])
    from edgesdk.host import dist_of, tool_versions

    ctx.tools.update(
        tool_versions(("llama-cpp-python", "gguf", "transformers", "torch", "pillow", "onnx", dist_of("onnxruntime")))
    )
    ctx.set_precision(f"mixed (encoder F16, decoder {quant})")
