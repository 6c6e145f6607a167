# SPDX-License-Identifier: Apache-2.0
"""VLM families, the build side: one :class:`VLMFamily` record per family, one module per record (issue 21).

A record holds what the build needs of a family: the HF classes, the tensor-name map of both transformers layouts
(to the 4.x names the converter reads), the support check and the mmproj writer, image tokens per frame, the plan's
words for the projector, the decoder's causal-LM class, config and tensor names, and the parity settings. What the
runtime needs (prompt, chat format, image layout, preprocessing) is the record's ``runtime``, a
:class:`edgesdk.contracts.vlm_families.RuntimeFamily` (issue 40, item 3: a device imports no build module to run a
VLM); ``name``, ``display``, ``frames`` and ``user_prompt`` read through to it. The converter, the plan and the
build's parity look the family up here (:func:`by_architecture`, :func:`by_config`, :func:`by_name`); the runtime
looks up its own records (:func:`edgesdk.contracts.vlm_families.by_name`, ``by_processor``).

Adding a family: its runtime record in ``edgesdk/contracts/vlm_families/``, and a module in this package defining
``FAMILY = VLMFamily(runtime=..., ...)`` with its name in :data:`REGISTRY`. Light on import: records load the
converter only when their functions are called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.contracts.vlm_families import RuntimeFamily
from edgesdk.errors import ModelError

# the family modules of this package, in lookup order (the first is the default for configs naming no class)
REGISTRY = ("llava", "idefics3", "gemma3", "qwen25vl", "qwen2vl")


@dataclass(frozen=True)
class VLMFamily:
    runtime: RuntimeFamily  # what the runtime reads of the family (contracts/vlm_families)
    architectures: tuple[str, ...]  # HF classes (config.json ``architectures``)
    vision_model_types: frozenset[str]  # vision_config.model_type values the converter writes
    component_prefixes: tuple[tuple[str, tuple[str, ...]], ...]  # vision_encoder / projector / decoder tensors
    canonical_name: Callable[[str], str]  # a tensor name of either transformers layout -> the 4.x name
    check: Callable[[dict[str, Any], Path], None]  # ModelError when the converter cannot write this checkpoint
    write_mmproj: Callable[..., dict[str, Any]]  # (directory, out_path, config, *, name) -> mmproj facts
    image_tokens: Callable[[dict[str, Any]], int | None]  # image tokens per frame, from config.json
    projector: Callable[[dict[str, Any]], str]  # the plan's words for the projector (facts.extra in)
    onnx_encoder: bool = False  # the FP16 ONNX encoder export (onnx_encoder.py) supports this family
    text_architecture: str = "LlamaForCausalLM"  # the HF causal-LM class its language model converts as
    reference_marker: str = "<image>"  # what the HF processor replaces with one image's tokens
    # the decoder directory (convert.write_text_model_dir): a checkpoint tensor name -> its causal-LM name or None
    # (default: the language_model.* / text_model.* prefixes), and the causal LM's config.json from config.json
    # (default: text_config with architectures = text_architecture)
    text_tensor_name: Callable[[str], str | None] | None = None
    text_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # the parity images' (width, height) where the family's image tokens depend on the size (None: the default set)
    parity_image_sizes: tuple[tuple[int, int], ...] | None = None
    # the vision tower as the plan counts it, from config.json: its width (default: vision_config.hidden_size) and
    # whether it attends within windows, for which llama.cpp keeps an F32 mask over an image's positions (default:
    # no window attention)
    vision_width: Callable[[dict[str, Any]], int | None] | None = None
    window_attention: Callable[[dict[str, Any]], bool] | None = None

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def display(self) -> str:
        """How messages name the family ("LLaVA", "Idefics3/SmolVLM")."""
        return self.runtime.display

    @property
    def frames(self) -> str:
        """The runtime's preprocessing ("single", "tiles" or "dynamic")."""
        return self.runtime.frames

    def user_prompt(self, text: str, n_images: int, marker: str) -> str:
        """One user turn + the generation prompt, as the runtime writes it."""
        return self.runtime.user_prompt(text, n_images, marker)

    def tower_width(self, config: dict[str, Any]) -> int | None:
        """The vision tower's width (:attr:`vision_width`, else ``vision_config.hidden_size``)."""
        if self.vision_width is not None:
            return self.vision_width(config)
        width = (config.get("vision_config") or {}).get("hidden_size")
        return width if isinstance(width, int) else None

    def windowed(self, config: dict[str, Any]) -> bool:
        """Whether the vision tower attends within windows (:attr:`window_attention`; False without one)."""
        return bool(self.window_attention(config)) if self.window_attention is not None else False

    def reference_prompt(self, text: str) -> str:
        """The prompt for one image as the HF processor sees it (:attr:`reference_marker` where the image goes)."""
        return self.user_prompt(text, 1, self.reference_marker)


def families() -> tuple[VLMFamily, ...]:
    return tuple(importlib.import_module(f"{__name__}.{m}").FAMILY for m in REGISTRY)


def architectures() -> dict[str, VLMFamily]:
    return {a: f for f in families() for a in f.architectures}


def by_name(name: str) -> VLMFamily:
    for f in families():
        if f.name == name:
            return f
    raise ModelError(f"unknown VLM family {name!r} (known: {', '.join(f.name for f in families())})")


def by_architecture(arch: str | None, *, strict: bool = True) -> VLMFamily:
    """The family of a HF class (the first registered family when ``arch`` is None; ModelError for an unknown
    class when ``strict``, else the first family)."""
    table = architectures()
    if arch is None or (arch not in table and not strict):
        return families()[0]
    if arch not in table:
        raise ModelError(
            f"architecture {arch!r} is not a supported vision-language family (supported: {', '.join(sorted(table))})"
        )
    return table[arch]


def config_architecture(config: dict[str, Any]) -> str | None:
    """config.json's ``architectures[0]``; else ``text_config.architectures[0]`` (transformers 4.57's
    Qwen2_5_VLConfig hands ``architectures`` to its text_config, so its saves have it only there)."""
    archs = config.get("architectures") or (config.get("text_config") or {}).get("architectures") or [None]
    return archs[0] if isinstance(archs, list) and archs else None


def by_config(config: dict[str, Any], *, strict: bool = True) -> VLMFamily:
    return by_architecture(config_architecture(config), strict=strict)
