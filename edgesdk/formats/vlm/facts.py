# SPDX-License-Identifier: Apache-2.0
"""Planner facts of a HF vision-language directory: per-component parameter counts from the
safetensors headers (no tensor data) and the decoder's shape from ``text_config``. Headers only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgesdk.formats.gguf.facts import decoder_facts
from edgesdk.formats.vlm.families import architectures, by_architecture, config_architecture

# architecture -> family name, from the family records (formats/vlm/families)
VLM_FAMILIES = {arch: fam.name for arch, fam in architectures().items()}
VLM_ARCHITECTURES = set(VLM_FAMILIES)


def image_processor_config(directory: Path) -> dict[str, Any] | None:
    """The image processor's settings: ``preprocessor_config.json`` (transformers 4) or the ``image_processor``
    object of ``processor_config.json`` (transformers 5 writes no preprocessor_config.json); None if neither."""
    pre, proc = Path(directory) / "preprocessor_config.json", Path(directory) / "processor_config.json"
    if pre.is_file():
        data = json.loads(pre.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else None
    if proc.is_file():
        outer = json.loads(proc.read_text(encoding="utf-8"))
        inner = outer.get("image_processor") if isinstance(outer, dict) else None
        if isinstance(inner, dict):
            # processor_class sits next to it in transformers 5, inside preprocessor_config.json in 4.x
            return {**inner, **({"processor_class": outer["processor_class"]} if "processor_class" in outer else {})}
    return None


def component_params(
    files: list[Path], components: tuple[tuple[str, tuple[str, ...]], ...] | None = None
) -> dict[str, int]:
    """Parameters per component (vision_encoder, projector, decoder) from safetensors headers; ``components``: the
    family record's tensor prefixes per component (default: the first registered family's)."""
    components = components or by_architecture(None).component_prefixes
    out = {name: 0 for name, _ in components}
    for f in files:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for key, meta in header.items():
            if key == "__metadata__" or not isinstance(meta, dict):
                continue
            count = 1
            for d in meta.get("shape", []):
                count *= int(d)
            for name, prefixes in components:
                if key.startswith(prefixes):
                    out[name] += count
                    break
    return out


def _max_frames(pre: dict[str, Any]) -> int | None:
    """Idefics3 / SmolVLM with image splitting: the most frames one image becomes (tiles of the longest edge's
    whole-tile grid + the global image), from ``size.longest_edge`` and ``max_image_size.longest_edge``."""
    size, tile = pre.get("size") or {}, (pre.get("max_image_size") or {}).get("longest_edge")
    edge = size.get("longest_edge") if isinstance(size, dict) else None
    if not (isinstance(edge, int) and isinstance(tile, int) and tile > 0):
        return None
    side = -(-min(edge, 4096) // tile)
    return side * side + 1


def _decoder_supported(text_architecture: str, text: dict[str, Any]) -> bool:
    """Whether the GGUF converter has the family's text architecture (a llama record: a llama ``text_config``)."""
    from edgesdk.formats.gguf.archs import ARCHS

    if text_architecture == "LlamaForCausalLM":
        return bool(text.get("model_type", "llama") == "llama")
    return text_architecture in ARCHS


def hf_vlm_facts(directory: str | Path) -> dict[str, Any]:
    """What the VLM planner needs: architecture, component params, vision and decoder shapes."""
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    vision, text = cfg.get("vision_config") or {}, cfg.get("text_config") or {}
    size, patch = vision.get("image_size"), vision.get("patch_size")
    files = sorted(directory.glob("*.safetensors"))
    arch = config_architecture(cfg)
    fam = by_architecture(arch, strict=False)
    pre = image_processor_config(directory) or {}
    dynamic = fam.frames == "dynamic"
    most = fam.runtime.max_image_tokens  # dynamic resolution: the most image tokens one image becomes
    tokens = most(pre) if dynamic and most is not None and pre else fam.image_tokens(cfg)
    merge = int(vision.get("spatial_merge_size") or 1)
    return {
        "architecture": arch,
        "family": fam.name,
        "scale_factor": cfg.get("scale_factor"),  # a pixel shuffle's
        "image_splitting": bool(pre.get("do_image_splitting")) if fam.frames == "tiles" else False,
        "max_frames": _max_frames(pre) if fam.frames == "tiles" and pre.get("do_image_splitting") else 1,
        "vision_model_type": vision.get("model_type"),
        "text_model_type": text.get("model_type", "llama"),
        "image_size": size,
        "patch_size": patch,
        "image_tokens": tokens,
        "vision_hidden": fam.tower_width(cfg),  # the tower's width, as the family's record reads it
        # the tower's positions per frame (before a pixel shuffle or pooling reduces them to image tokens)
        "encoder_positions": (size // patch) ** 2
        if isinstance(size, int) and isinstance(patch, int) and patch
        else (tokens * merge * merge if dynamic and tokens else None),
        # dynamic resolution: image tokens depend on the image; image_tokens is the most one image becomes
        "dynamic_resolution": dynamic,
        "window_attention": fam.windowed(cfg),  # the record's: the plan counts llama.cpp's window mask then
        "vision_layers": vision.get("num_hidden_layers", vision.get("depth")),
        "feature_select": cfg.get("vision_feature_select_strategy"),
        "component_params": component_params(files, fam.component_prefixes) if files else {},
        "preprocessor": bool(pre),
        # the decoder as the GGUF planner sees a causal LM
        "gguf_supported": _decoder_supported(fam.text_architecture, text),
        **decoder_facts(text),
        "tokenizer_files": [f for f in ("tokenizer.json", "tokenizer.model") if (directory / f).is_file()],
    }
