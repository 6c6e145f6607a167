# SPDX-License-Identifier: Apache-2.0
"""SmolVLM / Idefics3's runtime record: the processor's chat template and its image layout (tiles + global image
between ``<fake_token_around_image>`` / ``<row_R_col_C>`` / ``<global-img>`` markers; build side:
``formats/vlm/families/idefics3.py``)."""

from __future__ import annotations

from typing import Any

from edgesdk.contracts.vlm_families import RuntimeFamily, parts

PROMPT = "<|im_start|>User:{sep}{images}{text}<end_of_utterance>\nAssistant:"
FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"


def user_prompt(text: str, n_images: int, marker: str) -> str:
    """The processor's chat template for one user turn ("User:" before an image, "User: " before text)."""
    return PROMPT.format(sep="" if n_images else " ", images=marker * n_images, text=text)


def chat(messages: list[dict[str, Any]], marker: str) -> str:
    """SmolVLM's chat template (its processor's default, images where they appear in the content):
    ``<|im_start|>`` + per message ``Role:`` (``Role: `` unless the content starts with an image) + parts +
    ``<end_of_utterance>\\n``, then ``Assistant:``."""
    text = "<|im_start|>"
    for m in messages:
        ps = parts(m["content"])
        text += m["role"].capitalize() + (":" if ps and ps[0].get("type") != "text" else ": ")
        text += "".join(p["text"] if p.get("type") == "text" else marker for p in ps) + "<end_of_utterance>\n"
    return text + "Assistant:"


def image_text(rows: int, cols: int, marker: str) -> str:
    """One image as Idefics3Processor writes it (``_prompt_single_image`` / ``_prompt_split_image``), with one
    ``marker`` per frame where the processor writes ``image_seq_len`` image tokens."""
    glob = FAKE + GLOBAL + marker + FAKE
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{marker}" for c in range(cols)) + "\n" for r in range(rows))
    return grid + "\n" + glob


FAMILIES = (
    RuntimeFamily(
        name="idefics3",
        display="Idefics3/SmolVLM",
        user_prompt=user_prompt,
        chat=chat,
        processor_types=frozenset(
            {
                "Idefics3ImageProcessor",
                "Idefics3ImageProcessorFast",
                "SmolVLMImageProcessor",
                "SmolVLMImageProcessorFast",
            }
        ),
        processor_keys=frozenset({"max_image_size"}),
        image_text=image_text,
        frames="tiles",
    ),
)
