# SPDX-License-Identifier: Apache-2.0
"""Issue 24, Python API: ``Session.generate()``/``chat()`` return a :class:`Generation`, the text as a ``str``
(equality, concatenation, JSON as before) with ``.text`` and ``.usage`` of that request."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

import edgesdk
from edgesdk.runtime.session import Generation


@pytest.fixture(scope="module")
def gemma_bundle(gemma_gguf, tmp_path_factory) -> Path:
    from edgesdk.build import build
    from edgesdk.types import BuildOptions

    out = tmp_path_factory.mktemp("api") / "gemma-cpu"
    return build(
        gemma_gguf,
        "cpu-x86_64",
        out,
        BuildOptions(progress=False, accept_licenses=("LicenseRef-gemma",), context_length=256),
    )


def test_generate_returns_text_with_usage(gemma_bundle):
    with edgesdk.load(gemma_bundle) as s:
        out = s.generate("The capital of France is", max_tokens=6, temperature=0)
        last = s.report()["backend_report"]["last_request"]
        again = s.generate("The capital of France is", max_tokens=6, temperature=0)
        streamed = "".join(s.generate("The capital of France is", max_tokens=6, temperature=0, stream=True))
        reply = s.chat([{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0, chat_template="gemma")
    assert isinstance(out, str) and isinstance(out, Generation)
    assert out == again == streamed and out.text == streamed and type(out.text) is str and type(str(out)) is str
    assert out + "!" == streamed + "!" and json.dumps({"t": out}) == json.dumps({"t": streamed})
    assert out.usage == {
        "prompt_tokens": last["input_tokens"],
        "completion_tokens": last["output_tokens"],
        "ttft_ms": round(last["ttft_s"] * 1000, 2),
        "tokens_per_s": last["decode_tok_s"],
        "finish_reason": last["finish_reason"],
    }
    assert out.usage["completion_tokens"] == 6 and out.usage["finish_reason"] == "length"
    assert out.usage["prompt_tokens"] > 0 and out.usage["ttft_ms"] > 0
    assert isinstance(reply, Generation) and reply.usage["completion_tokens"] <= 4
    back = pickle.loads(pickle.dumps(out))
    assert back == out and back.usage == out.usage
