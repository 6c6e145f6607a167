# SPDX-License-Identifier: Apache-2.0
"""One check for every VLM family: ``edgesdk serve`` on the family's bundle, asked with the real ``openai`` client
(an OpenAI chat request whose image is an ``image_url`` data URL), answers exactly what ``edgesdk run --chat
--image`` answers for the same image and prompt, with the same prompt-token count (image tokens included)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest


def served_reply_equals_run(
    bundle: Path, image: Path, prompt: str, tmp_path: Path, run_cli: Any, *, name: str, max_tokens: int = 6
) -> int:
    """Serve ``bundle`` as ``name``, ask it about ``image``, compare with ``edgesdk run``; returns the prompt
    tokens both counted."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_serve import ServerProcess

    mime = "image/png" if image.suffix == ".png" else "image/jpeg"
    url = f"data:{mime};base64," + base64.b64encode(image.read_bytes()).decode("ascii")
    srv = ServerProcess([bundle, "--name", name], tmp_path)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=name,
            max_tokens=max_tokens,
            temperature=0,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": prompt}],
                }
            ],
        )
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-3000:]
    proc = run_cli(
        "run", str(bundle), "--chat", "--image", str(image), "--prompt", prompt,
        "-n", str(max_tokens), "--temp", "0", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert reply.choices[0].message.content == out["text"]
    assert reply.usage is not None and reply.usage.prompt_tokens == out["usage"]["prompt_tokens"]
    return int(out["usage"]["prompt_tokens"])
