# SPDX-License-Identifier: Apache-2.0
"""SmolVLM / Idefics3 (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``): SigLIP-style
tower with ``post_layernorm`` + pixel-shuffle connector + llama; images as frames (tiles + global image with
``do_image_splitting``) between the processor's ``<fake_token_around_image>`` / ``<row_R_col_C>`` /
``<global-img>`` markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.contracts.vlm_families import idefics3 as runtime
from edgesdk.formats.vlm.families import VLMFamily


def _check(config: dict[str, Any], directory: Path) -> None:
    from edgesdk.formats.vlm.convert import check_idefics3

    check_idefics3(config, directory)


def _write(directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    from edgesdk.formats.vlm.convert import write_mmproj_idefics3

    return write_mmproj_idefics3(directory, out_path, config, name=name)


def image_tokens(config: dict[str, Any]) -> int | None:
    """Per frame: patches per side squared over the pixel shuffle's scale factor squared."""
    vision = config.get("vision_config") or {}
    size, patch, scale = vision.get("image_size"), vision.get("patch_size"), config.get("scale_factor", 2)
    if not (
        isinstance(size, int) and isinstance(patch, int) and isinstance(scale, int) and min(size, patch, scale) > 0
    ):
        return None
    return (size // patch) ** 2 // (scale * scale)


FAMILY = VLMFamily(
    runtime=runtime.FAMILIES[0],
    architectures=("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
    vision_model_types=frozenset({"idefics3_vision", "smolvlm_vision"}),
    component_prefixes=(
        ("vision_encoder", ("model.vision_model.",)),
        ("projector", ("model.connector.",)),
        ("decoder", ("model.text_model.", "lm_head.")),
    ),
    canonical_name=lambda name: name,  # transformers 5 keeps every Idefics3 / SmolVLM name
    check=_check,
    write_mmproj=_write,
    image_tokens=image_tokens,
    projector=lambda info: f"pixel-shuffle connector (scale factor {info.get('scale_factor')}, one linear)",
    onnx_encoder=False,
)
