# SPDX-License-Identifier: Apache-2.0
"""Gemma-3 vision (``Gemma3ForConditionalGeneration``: Gemma-3 4B / 12B / 27B): SigLIP tower (its last layer after
``post_layernorm``) + Gemma-3's projector (average pooling of the patch grid to ``mm_tokens_per_image`` tokens, an
RMS norm scaled by ``1 + w``, one bias-free input projection) + the gemma3 decoder; image tokens attend to each other
both ways (libmtmd's ``mtmd_helper_decode_image_chunk`` turns causal attention off for a ``gemma3`` image chunk, as
HF's ``token_type_ids`` mask does).

The mmproj is clip.cpp's ``gemma3`` projector (llama.cpp vendored by llama-cpp-python 0.3.36: ``tools/mtmd/clip.cpp``,
``models/siglip.cpp``, ``clip-impl.h``): ``clip.projector_type = gemma3``, the SigLIP keys every family writes,
``clip.vision.projector.scale_factor`` = the pooling kernel (patches per side / tokens per side; clip.cpp's default
4 is Gemma-3's own), the ``v.*`` tower tensors including ``v.post_ln``, ``mm.soft_emb_norm.weight`` (stored as
``1 + w``: clip.cpp multiplies by the stored weight) and ``mm.input_projection.weight`` (HF's ``[vision, text]``
matrix as it is: clip.cpp transposes it in the graph). Embeddings and 1-D tensors F32, matrices F16.

One image in the prompt: the HF processor replaces ``<start_of_image>`` with ``\\n\\n<start_of_image>`` +
``mm_tokens_per_image`` x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``; libmtmd wraps each media marker in
``<start_of_image>`` / ``<end_of_image>``, so the runtime writes ``\\n\\n`` + marker + ``\\n\\n`` (the runtime
record's ``image_text``, :mod:`edgesdk.contracts.vlm_families.gemma3`).
Pan and scan (extra crops per image) is refused.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.contracts.vlm_families import gemma3 as runtime
from edgesdk.errors import ModelError
from edgesdk.formats.vlm.families import VLMFamily

_VISION = ("vision_tower.", "model.vision_tower.")
_PROJECTOR = ("multi_modal_projector.", "model.multi_modal_projector.")
_PROJ_NAMES = {
    "mm_input_projection_weight": "mm.input_projection.weight",
    "mm_soft_emb_norm.weight": "mm.soft_emb_norm.weight",
}
_SKIPPED = ("position_ids", ".head.")  # no vision head in Gemma-3 (vision_use_head false); ids are recomputed


def _canonical(name: str) -> str:
    from edgesdk.formats.vlm.convert import canonical_name

    return canonical_name(name)  # transformers 5 saves the SigLIP tower without its vision_model level


def _pool(config: dict[str, Any]) -> tuple[int, int, int]:
    """(patches per side, tokens per side, pooling kernel); ModelError unless the image tokens are a square whose
    side divides the patch grid."""
    vision = config.get("vision_config") or {}
    size, patch, tokens = vision.get("image_size"), vision.get("patch_size"), config.get("mm_tokens_per_image", 256)
    if not (
        isinstance(size, int)
        and isinstance(patch, int)
        and isinstance(tokens, int)
        and min(size, patch, tokens) > 0
        and size % patch == 0
    ):
        raise ModelError(
            f"vision image_size {size!r} must be a multiple of patch_size {patch!r} and "
            f"mm_tokens_per_image {tokens!r} a positive number"
        )
    side, per_side = size // patch, math.isqrt(tokens)
    if per_side * per_side != tokens or side % per_side:
        raise ModelError(
            f"mm_tokens_per_image {tokens} must be a square whose side divides the {side} x {side} "
            "patch grid (Gemma-3 average-pools the grid)"
        )
    return side, per_side, side // per_side


def _check(config: dict[str, Any], directory: Path) -> None:
    from edgesdk.formats.vlm.convert import ACT_GELU, image_processor

    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    if vision.get("model_type") != "siglip_vision_model":
        raise ModelError(f"{directory}: vision tower {vision.get('model_type')!r} is not Gemma-3's SigLIP tower")
    if text.get("model_type") != "gemma3_text":
        raise ModelError(f"{directory}: language model {text.get('model_type')!r} is not gemma3_text")
    try:
        _pool(config)
    except ModelError as exc:
        raise ModelError(f"{directory}: {exc}") from None
    if vision.get("hidden_act", "gelu_pytorch_tanh") not in ACT_GELU:
        raise ModelError(f"{directory}: vision hidden_act {vision.get('hidden_act')!r} is not supported (gelu)")
    if int(vision.get("intermediate_size", 0)) == int(vision.get("hidden_size", -1)):
        raise ModelError(f"{directory}: a vision FFN as wide as the embedding is not supported by llama.cpp's loader")
    pre = image_processor(directory)
    if pre.get("do_pan_and_scan"):
        raise ModelError(
            f"{directory}: do_pan_and_scan (extra crops per image) is not supported; the runtime gives "
            "llama.cpp one image resized to the encoder's size"
        )
    size = pre.get("size") or {}
    if isinstance(size, dict) and {size.get("height"), size.get("width")} - {None, vision.get("image_size")}:
        raise ModelError(
            f"{directory}: the image processor's size {size} differs from the vision image_size "
            f"{vision.get('image_size')}"
        )


def _write(directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    import gguf

    from edgesdk.formats.vlm.convert import _arrays, _clip_writer, _preprocessor, checkpoint_layout, finish_mmproj

    vision, text = config["vision_config"], config.get("text_config") or {}
    pre = _preprocessor(directory)
    _, per_side, kernel = _pool(config)
    layout = checkpoint_layout(directory)
    writer = _clip_writer(directory, out_path, name, "gemma3", vision, text, pre, eps_default=1e-6)
    writer.add_vision_use_gelu(True)
    writer.add_vision_projector_scale_factor(kernel)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, int(vision["num_hidden_layers"]))
    written, skipped, projector = 0, [], set()
    for hf_name, data in _arrays(directory):
        canon = _canonical(hf_name)
        v = next((canon[len(p) :] for p in _VISION if canon.startswith(p)), None)
        p = next((hf_name[len(q) :] for q in _PROJECTOR if hf_name.startswith(q)), None)
        if v is not None:
            if any(k in v for k in _SKIPPED):
                skipped.append(hf_name)
                continue
            new = tmap.get_name("vision_tower." + v, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ModelError(f"{directory}: vision tensor {hf_name} has no mmproj GGUF name")
            f32 = data.ndim <= 1 or ".embeddings." in v
        elif p is not None:
            if p not in _PROJ_NAMES:
                raise ModelError(f"{directory}: projector tensor {hf_name} is not part of Gemma-3's projector")
            new = _PROJ_NAMES[p]
            projector.add(new)
            if p.startswith("mm_soft_emb_norm"):
                data = data.astype(np.float32) + 1.0  # Gemma3RMSNorm: x * (1 + w); clip.cpp: x * w
            f32 = data.ndim <= 1
        else:
            continue
        writer.add_tensor(new, data.astype(np.float32 if f32 else np.float16))
        written += 1
    if projector != set(_PROJ_NAMES.values()):
        writer.close()
        raise ModelError(
            f"{directory}: Gemma-3's projector needs {', '.join(sorted(_PROJ_NAMES))} (multi_modal_projector.*)"
        )
    return finish_mmproj(
        writer,
        written,
        skipped,
        "gemma3",
        "gemma3",
        pre,
        layout,
        image_size=int(vision["image_size"]),
        patch_size=int(vision["patch_size"]),
        pooling_kernel=kernel,
        image_tokens=per_side * per_side,
    )


def image_tokens(config: dict[str, Any]) -> int | None:
    tokens = config.get("mm_tokens_per_image", 256)
    return tokens if isinstance(tokens, int) and tokens > 0 else None


def _projector(info: dict[str, Any]) -> str:
    size, patch, tokens = info.get("image_size"), info.get("patch_size"), info.get("image_tokens")
    kernel = (
        (size // patch) // math.isqrt(tokens)
        if isinstance(size, int) and isinstance(patch, int) and isinstance(tokens, int) and patch and math.isqrt(tokens)
        else None
    )
    return f"average pooling ({kernel} x {kernel}) + soft-embedding RMS norm + input projection"


FAMILY = VLMFamily(
    runtime=runtime.FAMILIES[0],
    architectures=("Gemma3ForConditionalGeneration",),
    vision_model_types=frozenset({"siglip_vision_model"}),
    component_prefixes=(
        ("vision_encoder", _VISION),
        ("projector", _PROJECTOR),
        ("decoder", ("language_model.", "model.language_model.", "lm_head.")),
    ),
    canonical_name=_canonical,
    check=_check,
    write_mmproj=_write,
    image_tokens=image_tokens,
    projector=_projector,
    text_architecture="Gemma3ForCausalLM",
    reference_marker="<start_of_image>",
)
