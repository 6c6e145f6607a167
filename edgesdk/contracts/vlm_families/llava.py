# SPDX-License-Identifier: Apache-2.0
"""LLaVA's runtime record: the LLaVA-1.5 conversation format (build side: ``formats/vlm/families/llava.py``)."""

from __future__ import annotations

from typing import Any

from edgesdk.contracts.vlm_families import RuntimeFamily, parts

PROMPT = "USER: {images}{text} ASSISTANT:"  # LLaVA-1.5 conversation format


def user_prompt(text: str, n_images: int, marker: str) -> str:
    return PROMPT.format(images="".join(marker + "\n" for _ in range(n_images)), text=text)


def chat(messages: list[dict[str, Any]], marker: str) -> str:
    """LLaVA-1.5's conversation: ``USER: `` + one marker line per image + the text, ``ASSISTANT: `` answers."""
    text = ""
    for m in messages:
        ps = parts(m["content"])
        body = "".join(p["text"] for p in ps if p.get("type") == "text")
        n_img = sum(1 for p in ps if p.get("type") in ("image", "image_url"))
        if m["role"] == "system":
            text += body + "\n"
        elif m["role"] == "user":
            text += "USER: " + (marker + "\n") * n_img + body + " "
        else:
            text += "ASSISTANT: " + body + "\n"
    return text + "ASSISTANT:"


FAMILIES = (RuntimeFamily(name="llava", display="LLaVA", user_prompt=user_prompt, chat=chat),)
