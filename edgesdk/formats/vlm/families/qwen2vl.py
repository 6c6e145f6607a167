# SPDX-License-Identifier: Apache-2.0
"""Qwen2-VL (``Qwen2VLForConditionalGeneration``: Qwen2-VL 2B / 7B / 72B): Qwen2.5-VL's predecessor. The decoder
(Qwen2 with M-RoPE, llama.cpp's ``qwen2vl``), the image processor (``Qwen2VLImageProcessor``, dynamic resolution),
the prompt and the positions are Qwen2.5-VL's, imported from :mod:`.qwen25vl`; the tower differs: LayerNorms (with
biases), a QuickGELU MLP (``fc1`` / ``fc2`` -> ``ffn_up`` / ``ffn_down``), full attention in every block and its
width under ``embed_dim`` (FFN ``embed_dim x mlp_ratio``; ``hidden_size`` is the merger's output there).

The mmproj is clip.cpp's ``qwen2vl_merger`` projector (llama.cpp vendored by llama-cpp-python 0.3.36): no
``clip.use_silu`` (clip.cpp's default activation is QuickGELU), no ``clip.vision.n_wa_pattern`` (no window
attention, so the plan counts no window mask), ``clip.vision.spatial_merge_size`` 2; the tensors as Qwen2.5-VL's
(:func:`.qwen25vl.write_merger`: the Conv3d patch embedding as two 2-D kernels, the fused ``attn.qkv`` split), and
the merger's ``ln_q`` LayerNorm keeps its bias (``v.post_ln.bias``). transformers 4.57 names the tower
``qwen2_vl``, transformers 5 ``qwen2_vl_vision`` (a 5.17 save on the GPU machine, 2026-12-04).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.contracts.vlm_families import qwen_vl as runtime
from edgesdk.errors import ModelError
from edgesdk.formats.vlm.families import VLMFamily
from edgesdk.formats.vlm.families.qwen25vl import (
    COMPONENT_PREFIXES,
    MERGER_NAMES,
    PARITY_IMAGE_SIZES,
    REFERENCE_MARKER,
    check_checkpoint,
    image_tokens,
    projector_words,
    text_config,
    text_tensor_name,
    write_merger,
)

TOWERS = ("qwen2_vl", "qwen2_vl_vision")  # vision_config.model_type: transformers 4.57, 5


def tower_dims(config: dict[str, Any]) -> tuple[int, int]:
    """(tower width, FFN width): ``embed_dim`` and ``embed_dim x mlp_ratio``."""
    vision = config["vision_config"]
    width = int(vision["embed_dim"])
    return width, int(width * float(vision.get("mlp_ratio", 4)))


def vision_width(config: dict[str, Any]) -> int | None:
    """The tower's width for the plan: ``embed_dim`` (its ``hidden_size`` is the merger's output)."""
    width = (config.get("vision_config") or {}).get("embed_dim")
    return width if isinstance(width, int) else None


def _tower(config: dict[str, Any]) -> None:
    width, ffn = tower_dims(config)
    if ffn == width:
        raise ModelError("a vision FFN as wide as the embedding is not supported by llama.cpp's loader")


def _check(config: dict[str, Any], directory: Path) -> None:
    check_checkpoint(
        config,
        directory,
        name="Qwen2-VL",
        projector="qwen2vl_merger",
        towers=TOWERS,
        text_types=("qwen2_vl_text", "qwen2_vl"),
        act="quick_gelu",
        tower=_tower,
    )


def _write(directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    import gguf

    return write_merger(
        directory,
        out_path,
        config,
        name=name,
        projector=gguf.VisionProjectorType.QWEN2VL,
        family="qwen2vl",
        dims=tower_dims(config),
        out_dim=config["vision_config"].get("hidden_size"),
        merger_names={**MERGER_NAMES, "ln_q.bias": "v.post_ln.bias"},
    )


FAMILY = VLMFamily(
    runtime=runtime.FAMILIES[1],
    architectures=("Qwen2VLForConditionalGeneration",),
    vision_model_types=frozenset(TOWERS),
    component_prefixes=COMPONENT_PREFIXES,
    canonical_name=lambda name: name,
    check=_check,
    write_mmproj=_write,
    image_tokens=image_tokens,
    projector=lambda info: projector_words("LayerNorm"),
    text_architecture="Qwen2VLTextModel",
    reference_marker=REFERENCE_MARKER,
    text_tensor_name=text_tensor_name,
    text_config=text_config,
    parity_image_sizes=PARITY_IMAGE_SIZES,
    vision_width=vision_width,
)
