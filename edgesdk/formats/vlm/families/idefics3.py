# SPDX-License-Identifier: Apache-2.0
"""SmolVLM / Idefics3 (``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``): SigLIP-style
tower with ``post_layernorm`` + pixel-shuffle connector + llama; images as frames (tiles + global image with
``do_image_splitting``) between the processor's ``<fake_token_around_image>`` / ``<row_R_col_C>`` /
``<global-img>`` markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgesdk.formats.vlm.families import VLMFamily

PROMPT = "<|im_start|>User:{sep}{images}{text}<end_of_utterance>\nAssistant:"
FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"


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


def user_prompt(text: str, n_images: int, marker: str) -> str:
    """The processor's chat template for one user turn ("User:" before an image, "User: " before text)."""
    return PROMPT.format(sep="" if n_images else " ", images=marker * n_images, text=text)


def chat(messages: list[dict[str, Any]], marker: str) -> str:
    """SmolVLM's chat template (its processor's default, images where they appear in the content):
    ``<|im_start|>`` + per message ``Role:`` (``Role: `` unless the content starts with an image) + parts +
    ``<end_of_utterance>\\n``, then ``Assistant:``."""
    text = "<|im_start|>"
    for m in messages:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        text += m["role"].capitalize() + (":" if parts and parts[0].get("type") != "text" else ": ")
        text += "".join(p["text"] if p.get("type") == "text" else marker for p in parts) + "<end_of_utterance>\n"
    return text + "Assistant:"


def image_text(rows: int, cols: int, marker: str) -> str:
    """One image as Idefics3Processor writes it (``_prompt_single_image`` / ``_prompt_split_image``), with one
    ``marker`` per frame where the processor writes ``image_seq_len`` image tokens."""
    glob = FAKE + GLOBAL + marker + FAKE
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{marker}" for c in range(cols)) + "\n" for r in range(rows))
    return grid + "\n" + glob


FAMILY = VLMFamily(
    name="idefics3",
    display="Idefics3/SmolVLM",
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
    user_prompt=user_prompt,
    chat=chat,
    projector=lambda info: f"pixel-shuffle connector (scale factor {info.get('scale_factor')}, one linear)",
    processor_types=frozenset(
        {"Idefics3ImageProcessor", "Idefics3ImageProcessorFast", "SmolVLMImageProcessor", "SmolVLMImageProcessorFast"}
    ),
    processor_keys=frozenset({"max_image_size"}),
    image_text=image_text,
    frames="tiles",
    onnx_encoder=False,
)
