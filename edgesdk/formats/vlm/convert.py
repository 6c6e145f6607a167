# SPDX-License-Identifier: Apache-2.0
"""HF vision-language directory -> two GGUF files: the language decoder and the multimodal projector (``mmproj``).

Families (:mod:`edgesdk.formats.vlm.families`, :func:`family`): ``llava`` (``LlavaForConditionalGeneration``:
SigLIP or CLIP vision tower + the LLaVA-1.5 MLP projector + llama) and ``idefics3``
(``Idefics3ForConditionalGeneration`` /
``SmolVLMForConditionalGeneration``, the SmolVLM architecture: SigLIP-style vision tower with its final
``post_layernorm`` + pixel-shuffle connector with one bias-free linear ``modality_projection.proj`` + llama).

* **Decoder.** The checkpoint's ``text_config`` and its ``language_model.*`` tensors are written out as
  a plain Hugging Face causal-LM directory (config, tokenizer, safetensors) and converted by the GGUF
  format's own converter (:func:`edgesdk.formats.gguf.convert.convert_hf_to_gguf`), then quantized
  by llama.cpp like any other GGUF.
* **mmproj.** The CLIP vision tower + the LLaVA MLP projector as one F16 GGUF (``general.architecture``
  ``clip``) in the layout llama.cpp's multimodal library (``tools/mtmd/clip.cpp``) loads: keys
  ``clip.projector_type = mlp``, ``clip.vision.*`` (image size, patch size, widths, block count,
  heads, layer-norm epsilon, image mean/std from the model's ``preprocessor_config.json``, feature
  layer); tensors ``v.*`` named by gguf-py's ``MODEL_ARCH.MMPROJ`` tensor map, projector ``mm.0``
  (linear_1) and ``mm.2`` (linear_2), which is how clip.cpp's LLaVA-1.5 graph reads a two-layer MLP.
  The vision tower's ``post_layernorm`` is left out: LLaVA takes the features of an inner layer
  (``vision_feature_layer``, -2 for LLaVA-1.5) before any final norm.

Matrices are F16, 1-D tensors (norms, biases, the class embedding) F32, as llama.cpp expects.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.errors import ModelError

# HF prefixes of the three parts, in the layouts transformers has saved (<= 4.51 and >= 4.52).
_TEXT_PREFIXES = ("language_model.model.", "model.language_model.", "model.text_model.")
_LM_HEAD = ("language_model.lm_head.", "lm_head.")
_VISION_PREFIXES = ("vision_tower.", "model.vision_tower.")
_PROJ_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
_PROJ_NAMES = {"linear_1": "mm.0", "linear_2": "mm.2"}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "generation_config.json",
    "README.md",
    "LICENSE",
)
SUPPORTED_VISION = {"siglip_vision_model", "clip_vision_model"}
CLASS_TOKEN_VISION = {"clip_vision_model"}
# Why a CLIP tower's mmproj only tokenizes (LLaVA-1.5, issue 21): llama.cpp's LLaVA graph (tools/mtmd/models/llava.cpp
# in the llama.cpp that llama-cpp-python 0.3.36 vendors) appends the class token AFTER the patches, gives positions
# 0..N in that order and keeps rows 1..N (clip.cpp's ``patches`` input, ``patch_offset = 1``), while CLIP puts the
# class token first (position 0) and LLaVA keeps the N patch rows. Permuting the position table makes the encoder
# compute the right tokens, but the kept row set still drops patch 0 and keeps the class token, which no tensor
# layout can change. Measured on a random CLIP-LLaVA: per-token cosine vs PyTorch 0.45-0.99, rows shifted by one.
# So the bundle's vision encoder is the FP16 ONNX graph (PyTorch's get_image_features), on any ONNX Runtime provider
# (the CPU included); the mmproj stays for libmtmd's tokenization of image chunks (576 positions) and never encodes.
CLASS_TOKEN_NOTE = (
    "llama.cpp's LLaVA graph orders the class token after the patches and keeps a shifted row set, "
    "so its mmproj encoder cannot reproduce a CLIP tower (docs/vlm.md); the bundle encodes images "
    "with the FP16 ONNX encoder on any ONNX Runtime provider, the CPU included"
)
SUPPORTED_TEXT = {"llama"}
ACT_GELU = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"}
SKIPPED_VISION = ("post_layernorm", "position_ids", ".head.")
IDEFICS3_VISION = {"idefics3_vision", "smolvlm_vision"}
_IDEFICS3_VISION_PREFIX = "model.vision_model."
_IDEFICS3_PROJ = "model.connector.modality_projection.proj."
# transformers 5 (5.17.0 and 5.25.0 saves; not 5.0.0) saves LLaVA's SigLIP tower without its ``vision_model`` level
# (``SiglipVisionModel`` now holds the embeddings / encoder itself; its conversion_mapping.py entry is CLIPVisionModel's
# ``PrefixChange(prefix_to_remove="vision_model")``): ``vision_tower.encoder.*`` for 4.x's
# ``vision_tower.vision_model.encoder.*``. The decoder (``language_model.model.*``, ``language_model.lm_head.*``),
# the projector and every Idefics3 / SmolVLM tensor keep their names.
_V5_VISION = re.compile(r"^((?:model\.)?vision_tower\.)(embeddings|encoder|pre_layrnorm|post_layernorm|head)\.")


def canonical_name(name: str) -> str:
    """A tensor name in the transformers 4 layout (transformers 5's LLaVA vision names get ``vision_model.`` back)."""
    return _V5_VISION.sub(r"\1vision_model.\2.", name)


def checkpoint_layout(directory: Path) -> dict[str, Any]:
    """Which transformers layout the directory is in, from its tensor names and files: ``{"transformers": "4.x" or
    "5.x", "evidence": [...]}``. ModelError when the vision tensors mix both layouts."""
    from edgesdk.formats.gguf.convert import _safetensors_keys

    directory = Path(directory)
    names = [k for f in sorted(directory.glob("*.safetensors")) for k in _safetensors_keys(f)]
    v5 = [n for n in names if canonical_name(n) != n]
    evidence = []
    if v5:
        v4 = [n for n in names if n.startswith(("vision_tower.vision_model.", "model.vision_tower.vision_model."))]
        if v4:
            raise ModelError(f"{directory}: vision tensors mix the transformers 4 ({v4[0]}) and 5 ({v5[0]}) layouts")
        evidence.append(f"vision tensors without vision_model. ({v5[0]})")
    config = read_config(directory)
    if "rope_parameters" in config or "rope_parameters" in (config.get("text_config") or {}):
        evidence.append("config.json rope_parameters")
    if not (directory / "preprocessor_config.json").is_file() and (directory / "processor_config.json").is_file():
        evidence.append("image processor in processor_config.json")
    return {"transformers": "5.x" if evidence else "4.x", "evidence": evidence}


def family(config: dict[str, Any]) -> str:
    """The family name (``llava``, ``idefics3``, ...) from ``architectures`` (the first registered family, LLaVA,
    when the config names none): :mod:`edgesdk.formats.vlm.families`."""
    from edgesdk.formats.vlm.families import by_config

    return by_config(config).name


def read_config(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    return data


def check_supported(config: dict[str, Any], directory: Path) -> None:
    """ModelError unless the family's converter can write this checkpoint (the family record's ``check``)."""
    from edgesdk.formats.vlm.families import by_config

    by_config(config).check(config, directory)


def check_llava(config: dict[str, Any], directory: Path) -> None:
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    vt, tt = vision.get("model_type"), text.get("model_type", "llama")
    if vt not in SUPPORTED_VISION:
        raise ModelError(
            f"{directory}: vision tower {vt!r} is not supported for the llama.cpp mmproj "
            f"(supported: {', '.join(sorted(SUPPORTED_VISION))})"
        )
    if tt not in SUPPORTED_TEXT:
        raise ModelError(
            f"{directory}: language model {tt!r} is not supported (supported: {', '.join(sorted(SUPPORTED_TEXT))})"
        )
    strategy = config.get("vision_feature_select_strategy", "default")
    want = "default" if vt in CLASS_TOKEN_VISION else "full"
    if strategy != want:
        raise ModelError(
            f"{directory}: vision_feature_select_strategy {strategy!r} is not supported for a "
            + (
                "CLIP tower (supported: default, the patch features without the class token)"
                if want == "default"
                else "SigLIP tower (supported: full, every patch feature)"
            )
        )
    layer = config.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        raise ModelError(f"{directory}: vision_feature_layer {layer!r}: only one feature layer is supported")
    size = vision.get("image_size")
    if not isinstance(size, int) or not isinstance(vision.get("patch_size"), int) or size % vision["patch_size"]:
        raise ModelError(f"{directory}: vision image_size must be a multiple of patch_size")
    if int(vision.get("intermediate_size", 0)) == int(vision.get("hidden_size", -1)):
        # clip.cpp swaps ffn_up/ffn_down of "mlp" projectors when ffn_down's input width equals the
        # embedding width (a fix for old conversions), which a square FFN would trigger wrongly.
        raise ModelError(f"{directory}: a vision FFN as wide as the embedding is not supported by llama.cpp's loader")


def check_idefics3(config: dict[str, Any], directory: Path) -> None:
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    vt, tt = vision.get("model_type"), text.get("model_type", "llama")
    if vt not in IDEFICS3_VISION:
        raise ModelError(f"{directory}: vision tower {vt!r} is not an Idefics3/SmolVLM vision model")
    if tt not in SUPPORTED_TEXT:
        raise ModelError(
            f"{directory}: language model {tt!r} is not supported (supported: {', '.join(sorted(SUPPORTED_TEXT))})"
        )
    size, patch, scale = vision.get("image_size"), vision.get("patch_size"), config.get("scale_factor", 2)
    if not (
        isinstance(size, int)
        and isinstance(patch, int)
        and isinstance(scale, int)
        and min(size, patch, scale) > 0
        and size % patch == 0
        and (size // patch) % scale == 0
    ):
        raise ModelError(
            f"{directory}: image_size / patch_size must be a multiple of scale_factor (got {size}, {patch}, {scale})"
        )
    if scale < 2:
        raise ModelError(f"{directory}: scale_factor {scale} is not supported by llama.cpp's pixel shuffle (>= 2)")
    if vision.get("hidden_act", "gelu_pytorch_tanh") not in ACT_GELU:
        raise ModelError(f"{directory}: vision hidden_act {vision.get('hidden_act')!r} is not supported (gelu)")
    if int(vision.get("intermediate_size", 0)) == int(vision.get("hidden_size", -1)):
        raise ModelError(f"{directory}: a vision FFN as wide as the embedding is not supported by llama.cpp's loader")


def idefics3_image_tokens(config: dict[str, Any]) -> int:
    """Image tokens per image: patches per side squared, divided by the pixel shuffle's scale factor squared."""
    vision = config["vision_config"]
    return (int(vision["image_size"]) // int(vision["patch_size"])) ** 2 // int(config.get("scale_factor", 2)) ** 2


def _arrays(directory: Path) -> Iterator[tuple[str, np.ndarray]]:
    from edgesdk.formats.gguf.convert import tensor_arrays  # the one safetensors walker

    return tensor_arrays(Path(directory))


def _strip(name: str, prefixes: tuple[str, ...]) -> str | None:
    for p in prefixes:
        if name.startswith(p):
            return name[len(p) :]
    return None


def write_text_model_dir(directory: Path, out_dir: Path) -> Path:
    """The language model as a plain HF causal-LM directory (config, tokenizer, weights) of the family record's
    ``text_architecture`` (``LlamaForCausalLM`` unless the record names another)."""
    from safetensors.numpy import save_file

    from edgesdk.formats.vlm.families import by_config

    config = read_config(directory)
    fam = by_config(config)
    text = fam.text_config(config) if fam.text_config is not None else dict(config.get("text_config") or {})
    text["architectures"] = [fam.text_architecture]
    text.setdefault("model_type", "llama")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(text, indent=2), encoding="utf-8")
    for name in TOKENIZER_FILES:
        if (Path(directory) / name).is_file():
            shutil.copyfile(Path(directory) / name, out_dir / name)
    tensors: dict[str, np.ndarray] = {}
    for name, data in _arrays(directory):
        if fam.text_tensor_name is not None:  # the family's own decoder names
            new_name = fam.text_tensor_name(name)
            if new_name is not None:
                tensors[new_name] = np.ascontiguousarray(data)
            continue
        rest = _strip(name, _TEXT_PREFIXES)
        if rest is not None:
            tensors["model." + rest] = np.ascontiguousarray(data)
            continue
        rest = _strip(name, _LM_HEAD)
        if rest is not None:
            tensors["lm_head." + rest] = np.ascontiguousarray(data)
    if not any(k.startswith("model.embed_tokens") for k in tensors):
        raise ModelError(f"{directory}: no language-model tensors (expected language_model.model.*)")
    save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def image_processor(directory: Path) -> dict[str, Any]:
    """The image processor's settings from ``preprocessor_config.json`` (transformers 4) or
    ``processor_config.json``'s ``image_processor`` (transformers 5); ModelError when there is neither."""
    from edgesdk.formats.vlm.facts import image_processor_config

    pre = image_processor_config(Path(directory))
    if pre is None:
        raise ModelError(
            f"{directory}: no image processor (preprocessor_config.json, or processor_config.json's "
            "image_processor with transformers 5): the image size and mean/std come from it",
            hint="save the processor next to the weights with processor.save_pretrained()",
        )
    return pre


def _preprocessor(directory: Path) -> dict[str, Any]:
    pre = image_processor(directory)
    path = Path(directory) / (
        "preprocessor_config.json"
        if (Path(directory) / "preprocessor_config.json").is_file()
        else "processor_config.json"
    )
    for key in ("image_mean", "image_std"):
        v = pre.get(key)
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
            raise ModelError(f"{path}: {key} must be a list of 3 numbers, got {v!r}"[:200])
    return pre


def feature_layer(config: dict[str, Any]) -> int:
    """HF's ``vision_feature_layer`` (an index into hidden_states: 0 = embeddings, -1 = last layer) as
    the non-negative index clip.cpp's ``clip.vision.feature_layer`` takes (layers run before the features)."""
    n_layer = int(config["vision_config"]["num_hidden_layers"])
    layer = int(config.get("vision_feature_layer", -2))
    return layer if layer >= 0 else n_layer + 1 + layer


def _clip_writer(
    directory: Path,
    out_path: Path,
    name: str | None,
    projector: str,
    vision: dict[str, Any],
    text: dict[str, Any],
    pre: dict[str, Any],
    *,
    eps_default: float,
    block_count: int | None = None,
) -> Any:
    """A GGUFWriter for an mmproj with the vision keys every family shares (clip.cpp's names)."""
    import gguf

    writer = gguf.GGUFWriter(str(out_path), "clip")
    meta = gguf.Metadata.load(None, directory, (name or directory.name) + " mmproj", 0)
    meta.set_gguf_meta_model(writer)
    writer.add_file_type(1)  # mostly F16
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type(projector)
    writer.add_vision_image_size(int(vision["image_size"]))
    writer.add_vision_patch_size(int(vision["patch_size"]))
    writer.add_vision_embedding_length(int(vision["hidden_size"]))
    writer.add_vision_feed_forward_length(int(vision["intermediate_size"]))
    writer.add_vision_block_count(int(vision["num_hidden_layers"]) if block_count is None else block_count)
    writer.add_vision_projection_dim(int(text["hidden_size"]))
    writer.add_vision_head_count(int(vision["num_attention_heads"]))
    writer.add_vision_attention_layernorm_eps(float(vision.get("layer_norm_eps", eps_default)))
    writer.add_vision_image_mean([float(x) for x in pre["image_mean"]])
    writer.add_vision_image_std([float(x) for x in pre["image_std"]])
    return writer


def finish_mmproj(
    writer: Any,
    written: int,
    skipped: list[str],
    projector_type: str,
    family: str,
    pre: dict[str, Any],
    layout: dict[str, Any],
    **facts: Any,
) -> dict[str, Any]:
    """Write the mmproj's header, keys and tensors and close it. Returns its facts: the tensors written and
    skipped, the projector and the family, then ``facts`` (the family's own, in order), the image normalisation
    and the checkpoint layout."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "tensors": written,
        "skipped": skipped,
        "projector_type": projector_type,
        "family": family,
        **facts,
        "image_mean": pre["image_mean"],
        "image_std": pre["image_std"],
        "checkpoint_layout": layout,
    }


def write_mmproj(directory: Path, out_path: Path, *, name: str | None = None) -> dict[str, Any]:
    """Write the vision tower + projector of a HF VLM directory as an F16 llama.cpp mmproj GGUF (the family
    record's writer, after its check)."""
    from edgesdk.formats.vlm.families import by_config

    directory = Path(directory)
    config = read_config(directory)
    fam = by_config(config)
    fam.check(config, directory)
    return fam.write_mmproj(directory, out_path, config, name=name)


def write_mmproj_llava(
    directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None
) -> dict[str, Any]:
    """The LLaVA vision tower (SigLIP or CLIP) + MLP projector as an F16 mmproj GGUF (clip.cpp's ``mlp`` layout).

    A class-token (CLIP) tower gets a tokenize-only mmproj (CLASS_TOKEN_NOTE): the same keys with
    ``clip.vision.block_count = 0`` and the projector alone (libmtmd needs its output width and the image / patch
    sizes to tokenize image chunks, no tower weights); the FP16 ONNX graph carries the encoder."""
    import gguf

    vision, text = config["vision_config"], config.get("text_config") or {}
    pre = _preprocessor(directory)
    n_layer = int(vision["num_hidden_layers"])
    tokenize_only = vision.get("model_type") in CLASS_TOKEN_VISION
    writer = _clip_writer(
        directory, out_path, name, "mlp", vision, text, pre, eps_default=1e-5, block_count=0 if tokenize_only else None
    )
    writer.add_array("clip.vision.feature_layer", [0 if tokenize_only else feature_layer(config)])
    act = vision.get("hidden_act", "quick_gelu")
    if act in ACT_GELU:
        writer.add_vision_use_gelu(True)
    elif act != "quick_gelu":
        raise ModelError(f"{directory}: vision hidden_act {act!r} is not supported (quick_gelu, gelu)")
    if config.get("projector_hidden_act", "gelu") not in ACT_GELU:
        raise ModelError(
            f"{directory}: projector_hidden_act {config.get('projector_hidden_act')!r} is not "
            "supported (llama.cpp's LLaVA projector applies GELU)"
        )
    layout = checkpoint_layout(directory)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, n_layer)
    written, skipped = 0, []
    for hf_name, data in _arrays(directory):
        v = _strip(canonical_name(hf_name), _VISION_PREFIXES)  # transformers 5's names in the 4.x layout
        p = _strip(hf_name, _PROJ_PREFIXES)
        if v is not None:
            if tokenize_only or any(k in v for k in SKIPPED_VISION):
                skipped.append(hf_name)
                continue
            new = tmap.get_name("vision_tower." + v, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ModelError(f"{directory}: vision tensor {hf_name} has no mmproj GGUF name")
        elif p is not None:
            layer, _, suffix = p.partition(".")
            if layer not in _PROJ_NAMES:
                raise ModelError(f"{directory}: projector tensor {hf_name} is not a LLaVA-1.5 two-layer MLP")
            new = f"{_PROJ_NAMES[layer]}.{suffix}"
        else:
            continue
        data = data.astype(np.float32 if data.ndim <= 1 else np.float16)
        writer.add_tensor(new, data)
        written += 1
    size, patch = int(vision["image_size"]), int(vision["patch_size"])
    facts = finish_mmproj(
        writer,
        written,
        skipped,
        "mlp",
        "llava",
        pre,
        layout,
        image_size=size,
        patch_size=patch,
        image_tokens=(size // patch) ** 2,
        feature_layer=feature_layer(config),
    )
    return {
        **facts,
        "vision_model_type": vision.get("model_type"),
        # a class-token tower: the mmproj tokenizes image chunks only, the ONNX encoder encodes (CLASS_TOKEN_NOTE)
        "encodes": not tokenize_only,
        **(
            {"tokenize_only": "clip.vision.block_count 0, projector tensors only (the tower is in vision_encoder.onnx)"}
            if tokenize_only
            else {}
        ),
    }


def write_mmproj_idefics3(
    directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None
) -> dict[str, Any]:
    """The Idefics3 / SmolVLM vision tower + connector as an F16 mmproj GGUF in the layout of clip.cpp's
    ``idefics3`` projector (llama.cpp vendored by llama-cpp-python 0.3.36: ``tools/mtmd/clip.cpp``,
    ``models/siglip.cpp``): ``clip.projector_type = idefics3``, ``clip.vision.projector.scale_factor``
    (the pixel shuffle), ``clip.vision.preproc_image_size`` and the ``v.*`` tower tensors including
    ``v.post_ln`` (Idefics3 takes the tower's last layer after its final norm), the connector's linear as
    ``mm.model.fc.weight``. The embeddings stay F32 (as llama.cpp's own SmolVLM converter keeps them).

    ``preproc_image_size`` is the encoder's tile (``max_image_size.longest_edge``), not the processor's
    ``size.longest_edge``: the edgesdk runtime gives llama.cpp one image resized to the tile (no image
    splitting, docs/vlm.md), and with this value libmtmd's own resize is a copy."""
    import gguf

    vision, text = config["vision_config"], config.get("text_config") or {}
    pre = _preprocessor(directory)
    tile = int((pre.get("max_image_size") or {}).get("longest_edge", vision["image_size"]))
    if tile != int(vision["image_size"]):
        raise ModelError(
            f"{directory}: max_image_size.longest_edge {tile} differs from the vision image_size {vision['image_size']}"
        )
    n_layer = int(vision["num_hidden_layers"])
    scale = int(config.get("scale_factor", 2))
    layout = checkpoint_layout(directory)
    writer = _clip_writer(directory, out_path, name, "idefics3", vision, text, pre, eps_default=1e-6)
    writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(scale)
    writer.add_vision_preproc_image_size(tile)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, n_layer)
    written, skipped = 0, []
    for hf_name, data in _arrays(directory):
        if hf_name.startswith(_IDEFICS3_PROJ):
            new = "mm.model.fc." + hf_name[len(_IDEFICS3_PROJ) :]
        elif hf_name.startswith(_IDEFICS3_VISION_PREFIX):
            if "position_ids" in hf_name:
                skipped.append(hf_name)
                continue
            mapped = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if mapped is None:
                raise ModelError(f"{directory}: vision tensor {hf_name} has no mmproj GGUF name")
            new = mapped
        else:
            continue
        f32 = data.ndim <= 1 or ".embeddings." in hf_name
        writer.add_tensor(new, data.astype(np.float32 if f32 else np.float16))
        written += 1
    return finish_mmproj(
        writer,
        written,
        skipped,
        "idefics3",
        "idefics3",
        pre,
        layout,
        image_size=int(vision["image_size"]),
        patch_size=int(vision["patch_size"]),
        scale_factor=scale,
        image_tokens=idefics3_image_tokens(config),
    )
