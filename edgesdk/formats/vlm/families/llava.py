# SPDX-License-Identifier: Apache-2.0
"""LLaVA (``LlavaForConditionalGeneration``): SigLIP or CLIP tower + the LLaVA-1.5 two-layer MLP projector + llama.
A CLIP tower's class token makes the FP16 ONNX graph the encoder (convert.CLASS_TOKEN_NOTE, docs/vlm.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.contracts.vlm_families import llava as runtime
from edgesdk.formats.vlm.families import VLMFamily


def _canonical(name: str) -> str:
    from edgesdk.formats.vlm.convert import canonical_name

    return canonical_name(name)


def _check(config: dict[str, Any], directory: Path) -> None:
    from edgesdk.formats.vlm.convert import check_llava

    check_llava(config, directory)


def _write(directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    from edgesdk.formats.vlm.convert import write_mmproj_llava

    return write_mmproj_llava(directory, out_path, config, name=name)


def image_tokens(config: dict[str, Any]) -> int | None:
    vision = config.get("vision_config") or {}
    size, patch = vision.get("image_size"), vision.get("patch_size")
    return (size // patch) ** 2 if isinstance(size, int) and isinstance(patch, int) and patch else None


FAMILY = VLMFamily(
    runtime=runtime.FAMILIES[0],
    architectures=("LlavaForConditionalGeneration",),
    vision_model_types=frozenset({"siglip_vision_model", "clip_vision_model"}),
    component_prefixes=(
        ("vision_encoder", ("vision_tower.", "model.vision_tower.")),
        ("projector", ("multi_modal_projector.", "model.multi_modal_projector.")),
        ("decoder", ("language_model.", "model.language_model.", "lm_head.")),
    ),
    canonical_name=_canonical,
    check=_check,
    write_mmproj=_write,
    image_tokens=image_tokens,
    projector=lambda info: "MLP projector",
    onnx_encoder=True,
)
