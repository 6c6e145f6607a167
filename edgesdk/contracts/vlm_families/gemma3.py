# SPDX-License-Identifier: Apache-2.0
"""Gemma-3's runtime record: its chat template and one image's layout (build side: ``formats/vlm/families/gemma3.py``).

One image in the prompt: the HF processor replaces ``<start_of_image>`` with ``\\n\\n<start_of_image>`` +
``mm_tokens_per_image`` x ``<image_soft_token>`` + ``<end_of_image>\\n\\n``; libmtmd wraps each media marker in
``<start_of_image>`` / ``<end_of_image>``, so the runtime writes ``\\n\\n`` + marker + ``\\n\\n`` (:func:`image_text`).
"""

from __future__ import annotations

from typing import Any

from edgesdk.contracts.vlm_families import RuntimeFamily, parts

TURN = "<start_of_turn>{role}\n{prefix}{body}<end_of_turn>\n"
GENERATION = "<start_of_turn>model\n"


def user_prompt(text: str, n_images: int, marker: str) -> str:
    """Gemma-3's chat template for one user turn (images first, the text trimmed) + the generation prompt."""
    return TURN.format(role="user", prefix="", body=marker * n_images + text.strip()) + GENERATION


def chat(messages: list[dict[str, Any]], marker: str) -> str:
    """Gemma-3's chat template: a system message prefixes the first user turn (+ ``\\n\\n``), ``assistant`` is
    ``model``, text parts trimmed, images where they appear; then ``<start_of_turn>model\\n``. No ``<bos>``: the
    tokenizer adds it."""
    prefix, text = "", ""
    if messages and messages[0]["role"] == "system":
        content = messages[0]["content"]
        prefix = (content if isinstance(content, str) else content[0].get("text", "")) + "\n\n"
        messages = messages[1:]
    for i, m in enumerate(messages):
        body = "".join(p["text"].strip() if p.get("type") == "text" else marker for p in parts(m["content"]))
        text += TURN.format(
            role="model" if m["role"] == "assistant" else m["role"], prefix=prefix if i == 0 else "", body=body
        )
    return text + GENERATION


def image_text(rows: int, cols: int, marker: str) -> str:
    """One image as Gemma3Processor writes it around its tokens (libmtmd adds ``<start_of_image>`` /
    ``<end_of_image>`` around the marker)."""
    return "\n\n" + marker + "\n\n"


FAMILIES = (
    RuntimeFamily(
        name="gemma3",
        display="Gemma-3",
        user_prompt=user_prompt,
        chat=chat,
        processor_types=frozenset({"Gemma3ImageProcessor", "Gemma3ImageProcessorFast"}),
        processor_keys=frozenset({"do_pan_and_scan"}),
        image_text=image_text,
    ),
)
