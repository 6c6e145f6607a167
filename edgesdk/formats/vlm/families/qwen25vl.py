# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``: Qwen2.5-VL 3B / 7B / 32B / 72B): a ViT with dynamic
resolution (the image keeps its aspect ratio, resized to multiples of 28 px between ``min_pixels`` and
``max_pixels``, so the number of image tokens depends on the image), 2-D rotary positions, RMS norms, SwiGLU MLPs,
window attention in all blocks but ``fullatt_block_indexes``, then the patch merger (2 x 2 patches -> one token: an
RMS norm and a two-layer GELU MLP) + the Qwen2 decoder with M-RoPE (image tokens get (t, row, column) positions).

The mmproj is clip.cpp's ``qwen2.5vl_merger`` projector (llama.cpp vendored by llama-cpp-python 0.3.36:
``tools/mtmd/clip.cpp``, ``models/qwen2vl.cpp``, ``clip-impl.h``): ``clip.projector_type = qwen2.5vl_merger``,
``clip.use_silu``, ``clip.vision.n_wa_pattern`` (every n-th block attends to the whole image: clip.cpp computes
full attention where ``(block + 1) % n == 0``, so ``fullatt_block_indexes`` must be that pattern; Qwen2.5-VL's
[7, 15, 23, 31] of 32 is n = 8), ``clip.vision.spatial_merge_size``. Tensors: the Conv3d patch embedding
``[width, 3, 2, 14, 14]`` as two 2-D kernels ``v.patch_embd.weight`` (frame 0) and ``v.patch_embd.weight.1``
(frame 1): a still image is two equal frames, so the two convolutions add up to the Conv3d; each block's fused
``attn.qkv`` split into ``attn_q`` / ``attn_k`` / ``attn_v`` (weights and biases); ``merger.ln_q`` as ``v.post_ln``,
``merger.mlp.0`` / ``mlp.2`` as ``mm.0`` / ``mm.2``. 1-D tensors F32, matrices F16. clip.cpp uses a window of
112 px (it reads no window size for this projector), a 2 x 2 merge, 2 frames per patch: other values are refused.

Dynamic resolution at run time, the prompt and the chat template are the runtime record's
(:mod:`edgesdk.contracts.vlm_families.qwen_vl`: ``smart_resize``, ``max_image_tokens``, :data:`MAX_IMAGE_TOKENS`).

Positions: libmtmd's ``mtmd_helper_decode_image_chunk`` gives image token (row r, column c) of an image starting at
position p the M-RoPE ids (p, p + r, p + c) and advances the position by max(rows, columns), as HF's
``get_rope_index``; text tokens get one id used in all three sections.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgesdk.contracts.vlm_families import qwen_vl as runtime
from edgesdk.contracts.vlm_families.qwen_vl import MAX_IMAGE_TOKENS, factor, max_image_tokens, pixel_limits
from edgesdk.errors import ModelError
from edgesdk.formats.vlm.families import VLMFamily

WINDOW = 112  # px: the attention window clip.cpp uses for qwen2.5vl_merger
_VISION = ("visual.", "model.visual.")
_MERGER = ("visual.merger.", "model.visual.merger.")
_TEXT = ("model.language_model.",)  # transformers 5; 4.x saves the hub's model.layers.* / model.embed_tokens.*
_LEGACY_TEXT = ("model.embed_tokens.", "model.layers.", "model.norm.")
# the merger first: it sits inside the vision prefix (facts count each tensor in its first matching component)
COMPONENT_PREFIXES = (
    ("projector", _MERGER),
    ("vision_encoder", _VISION),
    ("decoder", _TEXT + _LEGACY_TEXT + ("lm_head.",)),
)
# how the HF processor marks an image, the parity images
REFERENCE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"
PARITY_IMAGE_SIZES = ((250, 190), (140, 300), (96, 60))
MERGER_NAMES = {
    "ln_q.weight": "v.post_ln.weight",
    "mlp.0.weight": "mm.0.weight",
    "mlp.0.bias": "mm.0.bias",
    "mlp.2.weight": "mm.2.weight",
    "mlp.2.bias": "mm.2.bias",
}
_PATCH = "patch_embed.proj.weight"


def _vision_name(name: str) -> str | None:
    """A vision tensor's name below ``visual.`` (either layout), else None."""
    for p in _VISION:
        if name.startswith(p):
            return name[len(p) :]
    return None


def text_tensor_name(name: str) -> str | None:
    """A decoder tensor's name in a plain Qwen2 causal-LM directory (``model.*`` / ``lm_head.*``), else None."""
    if name.startswith(_TEXT):
        return "model." + name[len(_TEXT[0]) :]
    if name.startswith(_LEGACY_TEXT) or name.startswith("lm_head."):
        return name
    return None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's config as a Qwen2 causal LM (``model_type qwen2``: transformers runs it as ``Qwen2ForCausalLM``,
    the text-only reference) that the GGUF converter writes as llama.cpp's ``qwen2vl`` (``architectures``:
    the record's ``text_architecture``, ``Qwen2_5_VLTextModel`` or Qwen2-VL's ``Qwen2VLTextModel``; the M-RoPE sections
    kept in ``rope_scaling``)."""
    from edgesdk.formats.gguf.archs.qwen2vl import mrope_section

    text = dict(config.get("text_config") or {})
    for key, value in config.items():  # 4.x writes the decoder's keys at the top level too; text_config wins
        if key not in ("text_config", "vision_config", "architectures", "model_type", "auto_map"):
            text.setdefault(key, value)
    section = mrope_section(text) or mrope_section(config)
    params = text.pop("rope_parameters", None)
    theta = text.get("rope_theta", (params or {}).get("rope_theta") if isinstance(params, dict) else None)
    text.update(
        model_type="qwen2",
        rope_theta=theta if theta is not None else 1_000_000.0,
        rope_scaling={"type": "default", "rope_type": "default", "mrope_section": section},
    )
    text.pop("layer_types", None)
    return text


def _merge(vision: dict[str, Any]) -> int:
    return int(vision.get("spatial_merge_size", 2))


def wa_pattern(vision: dict[str, Any]) -> int:
    """The n of clip.cpp's ``n_wa_pattern`` (full attention where ``(block + 1) % n == 0``) for
    ``fullatt_block_indexes``; ModelError when the indexes are not that pattern."""
    depth = int(vision.get("depth") or 0)
    full = vision.get("fullatt_block_indexes")
    if not (isinstance(full, list) and full and all(isinstance(i, int) for i in full)):
        raise ModelError(f"vision_config.fullatt_block_indexes {full!r} must be a non-empty list of block indexes")
    n = int(full[0]) + 1
    if n < 1 or full != [i for i in range(depth) if (i + 1) % n == 0]:
        raise ModelError(
            f"vision_config.fullatt_block_indexes {full} is not every {n}-th of the {depth} blocks "
            "(llama.cpp's qwen2.5vl_merger graph attends fully where (block + 1) % n == 0)"
        )
    return n


def tower_dims(config: dict[str, Any]) -> tuple[int, int]:
    """(tower width, FFN width) of Qwen2.5-VL's tower: ``hidden_size``, ``intermediate_size``."""
    vision = config["vision_config"]
    return int(vision["hidden_size"]), int(vision["intermediate_size"])


def window_attention(config: dict[str, Any]) -> bool:
    """Whether the tower attends within windows: every block but ``fullatt_block_indexes`` does (clip.cpp keeps an
    F32 mask over the image's positions for them)."""
    return bool((config.get("vision_config") or {}).get("fullatt_block_indexes"))


def check_checkpoint(
    config: dict[str, Any],
    directory: Path,
    *,
    name: str,
    projector: str,
    towers: tuple[str, ...],
    text_types: tuple[str, ...],
    act: str,
    tower: Callable[[dict[str, Any]], object],
    fixed: tuple[tuple[str, int, str], ...] = (),
) -> None:
    """The checks a Qwen-VL tower + patch merger share: the vision and language model types (the first of each
    is the default), the tower's activation, clip.cpp's fixed 2 frames per patch and 2 x 2 merge (+ ``fixed``:
    (key, value, what) the projector's graph also fixes), ``tower`` (reads the tower's shape: ModelError, or a
    KeyError / TypeError / ValueError for a missing width) and the image processor's agreement with the config."""
    from edgesdk.formats.vlm.convert import image_processor

    vision = config.get("vision_config") or {}
    if vision.get("model_type", towers[0]) not in towers:
        raise ModelError(f"{directory}: vision tower {vision.get('model_type')!r} is not {name}'s")
    text_type = (config.get("text_config") or {}).get("model_type", text_types[0])
    if text_type not in text_types:
        raise ModelError(f"{directory}: language model {text_type!r} is not {name}'s")
    if vision.get("hidden_act", act) != act:
        raise ModelError(f"{directory}: vision hidden_act {vision.get('hidden_act')!r} is not supported ({act})")
    for key, want, what in (("temporal_patch_size", 2, "frames per patch"), ("spatial_merge_size", 2, "merge"), *fixed):
        if int(vision.get(key, want)) != want:
            raise ModelError(
                f"{directory}: vision {key} {vision.get(key)} is not supported: llama.cpp's "
                f"{projector} graph has a fixed {what} of {want}"
            )
    try:
        tower(config)
    except ModelError as exc:
        raise ModelError(f"{directory}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{directory}: vision_config lacks a valid {exc} (the tower's width)") from None
    pre = image_processor(directory)
    for key, cfg_key in (
        ("patch_size", "patch_size"),
        ("merge_size", "spatial_merge_size"),
        ("temporal_patch_size", "temporal_patch_size"),
    ):
        if key in pre and int(pre[key]) != int(vision.get(cfg_key, pre[key])):
            raise ModelError(
                f"{directory}: the image processor's {key} {pre[key]} differs from the vision "
                f"config's {cfg_key} {vision.get(cfg_key)}"
            )
    lo, hi = pixel_limits(pre)
    if not 0 < lo <= hi:
        raise ModelError(f"{directory}: the image processor's min_pixels {lo} / max_pixels {hi} are not a range")


def _tower(config: dict[str, Any]) -> None:
    tower_dims(config)
    wa_pattern(config.get("vision_config") or {})


def _check(config: dict[str, Any], directory: Path) -> None:
    check_checkpoint(
        config,
        directory,
        name="Qwen2.5-VL",
        projector="qwen2.5vl_merger",
        # transformers 4.57 names the tower qwen2_5_vl, transformers 5 qwen2_5_vl_vision
        towers=("qwen2_5_vl", "qwen2_5_vl_vision"),
        text_types=("qwen2_5_vl_text", "qwen2_5_vl"),
        act="silu",
        tower=_tower,
        fixed=(("window_size", WINDOW, "attention window (px)"),),
    )


def write_merger(
    directory: Path,
    out_path: Path,
    config: dict[str, Any],
    *,
    name: str | None,
    projector: str,
    family: str,
    dims: tuple[int, int],
    out_dim: int | None,
    merger_names: dict[str, str],
    vision_keys: Callable[[Any], None] | None = None,
    n_wa_pattern: int | None = None,
) -> dict[str, Any]:
    """Write a Qwen-VL tower + patch merger as clip.cpp's ``projector`` mmproj: ``dims`` (tower width, FFN width),
    ``out_dim`` the merger's output (default: the decoder's width), ``merger_names`` the merger's tensors (below
    ``merger.``) -> their GGUF names, ``vision_keys(writer)`` the projector's own keys (written before the merge
    size), ``n_wa_pattern`` what the facts report of it. Returns the mmproj facts (``family``: the record's)."""
    import gguf

    from edgesdk.formats.vlm.convert import _arrays, _clip_writer, _preprocessor, checkpoint_layout, finish_mmproj

    vision, text = config["vision_config"], config.get("text_config") or config
    pre = _preprocessor(directory)
    depth, (width, ffn) = int(vision["depth"]), dims
    shim = {
        "image_size": MAX_IMAGE_TOKENS**0.5 * factor(pre),
        "patch_size": int(vision.get("patch_size", 14)),
        "hidden_size": width,
        "intermediate_size": ffn,
        "num_hidden_layers": depth,
        "num_attention_heads": int(vision["num_heads"]),
        "layer_norm_eps": 1e-6,
    }
    shim["image_size"] = int(shim["image_size"])  # nominal (clip.cpp's warm-up size); images keep their own size
    proj_dim = {"hidden_size": int(out_dim or text["hidden_size"])}
    layout = checkpoint_layout(directory)
    writer = _clip_writer(directory, out_path, name, projector, shim, proj_dim, pre, eps_default=1e-6)
    if vision_keys is not None:
        vision_keys(writer)
    writer.add_vision_spatial_merge_size(_merge(vision))
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, depth)
    written, merger = 0, set()

    def add(new: str, data: np.ndarray) -> None:
        nonlocal written
        writer.add_tensor(new, data.astype(np.float32 if data.ndim <= 1 else np.float16))
        written += 1

    for hf_name, data in _arrays(directory):
        v = _vision_name(hf_name)
        if v is None:
            continue
        if v.startswith("merger."):
            key = v[len("merger.") :]
            if key not in merger_names:
                raise ModelError(f"{directory}: merger tensor {hf_name} is not part of the patch merger")
            merger.add(key)
            add(merger_names[key], data)
        elif v == _PATCH:
            if data.ndim != 5 or data.shape[2] != 2:
                raise ModelError(f"{directory}: {hf_name} {list(data.shape)} is not a Conv3d kernel of 2 frames")
            add("v.patch_embd.weight", np.ascontiguousarray(data[:, :, 0]))
            add("v.patch_embd.weight.1", np.ascontiguousarray(data[:, :, 1]))
        elif ".attn.qkv." in v:
            if data.shape[0] % 3:
                raise ModelError(f"{directory}: {hf_name} {list(data.shape)} is not three equal q/k/v parts")
            for part, chunk in zip("qkv", np.split(data, 3, axis=0), strict=True):
                new = tmap.get_name("visual." + v.replace(".qkv.", f".{part}."), try_suffixes=(".weight", ".bias"))
                if new is None:
                    raise ModelError(f"{directory}: vision tensor {hf_name} has no mmproj GGUF name")
                add(new, np.ascontiguousarray(chunk))
        else:
            new = tmap.get_name("visual." + v, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise ModelError(f"{directory}: vision tensor {hf_name} has no mmproj GGUF name")
            add(new, data)
    if merger != set(merger_names):
        writer.close()
        raise ModelError(f"{directory}: the patch merger needs merger.{', merger.'.join(sorted(merger_names))}")
    return finish_mmproj(
        writer,
        written,
        [],
        projector,
        family,
        pre,
        layout,
        image_size=None,
        dynamic_resolution=True,
        patch_size=int(vision.get("patch_size", 14)),
        merge_size=_merge(vision),
        image_tokens=max_image_tokens(pre),
        image_tokens_note=f"per image: its resized size / 28 px squared, at most {max_image_tokens(pre)}",
        min_max_pixels=list(pixel_limits(pre)),
        n_wa_pattern=n_wa_pattern,
    )


def _write(directory: Path, out_path: Path, config: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    import gguf

    vision = config["vision_config"]
    n = wa_pattern(vision)

    def vision_keys(writer: Any) -> None:  # SwiGLU MLPs; full attention every n-th block, windows elsewhere
        writer.add_vision_use_silu(True)
        writer.add_vision_n_wa_pattern(n)

    return write_merger(
        directory,
        out_path,
        config,
        name=name,
        projector=gguf.VisionProjectorType.QWEN25VL,
        family="qwen25vl",
        dims=tower_dims(config),
        out_dim=vision.get("out_hidden_size"),
        merger_names=MERGER_NAMES,
        vision_keys=vision_keys,
        n_wa_pattern=n,
    )


def image_tokens(config: dict[str, Any]) -> int | None:
    return None  # dynamic: per image (the facts read the processor's maximum, :func:`max_image_tokens`)


def projector_words(norm: str) -> str:
    """The plan's words for a Qwen-VL patch merger whose norm is ``norm``."""
    return f"patch merger (2 x 2 patches -> one token: {norm} + two-layer GELU MLP)"


def _projector(info: dict[str, Any]) -> str:
    return projector_words("RMS norm")


FAMILY = VLMFamily(
    runtime=runtime.FAMILIES[0],
    architectures=("Qwen2_5_VLForConditionalGeneration",),
    vision_model_types=frozenset({"qwen2_5_vl", "qwen2_5_vl_vision"}),
    component_prefixes=COMPONENT_PREFIXES,
    canonical_name=lambda name: name,
    check=_check,
    write_mmproj=_write,
    image_tokens=image_tokens,
    projector=_projector,
    text_architecture="Qwen2_5_VLTextModel",
    reference_marker=REFERENCE_MARKER,
    text_tensor_name=text_tensor_name,
    text_config=text_config,
    parity_image_sizes=PARITY_IMAGE_SIZES,
    window_attention=window_attention,
)
