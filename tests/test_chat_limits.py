# SPDX-License-Identifier: Apache-2.0
"""A chat template renders within a budget (issue 34, item 2).

A GGUF's own ``tokenizer.chat_template`` with two nested ``range(100000)`` loops built fine and, served, held
the event loop for over a minute on one chat request. Here: the budget itself (loop items, rendered size) on
llama-cpp-python's real Jinja formatter; ordinary templates render exactly as before; ``edgesdk serve`` with
such a template answers the chat request with a 400 and keeps serving; ``edgesdk build`` refuses a GGUF whose
template cannot render a sample chat.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

pytest.importorskip("llama_cpp")

from test_serve import ServerProcess  # noqa: E402  (gemma_chat_bundle: tests/conftest.py, once per session)

from edgesdk.errors import InputError  # noqa: E402
from edgesdk.formats.gguf import chat_limits  # noqa: E402

BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
WIDE = "{{ 'x' * 5000000 }}"
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<start_of_turn>model\n"
    "{% else %}<start_of_turn>user\n{% endif %}{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
COUNTED = "{% for i in range(3) %}{{ i }}{% endfor %}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def formatter(template: str):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")


def test_nested_loops_stop_at_the_item_budget():
    with pytest.raises(InputError, match=r"loops more than 1,000,000 times for one prompt"):
        chat_limits.render(formatter(BOMB), messages=chat_limits.SAMPLE_CHAT)


def test_a_huge_rendered_prompt_is_refused():
    with pytest.raises(InputError, match=r"rendered 5,000,000 characters for one prompt \(limit 4,194,304\)"):
        chat_limits.render(formatter(WIDE), messages=chat_limits.SAMPLE_CHAT)


@pytest.mark.parametrize("template", [GEMMA, COUNTED])
def test_ordinary_templates_render_as_before(template):
    fmt = formatter(template)
    for messages in (chat_limits.SAMPLE_CHAT, [{"role": "user", "content": "hi"}]):
        assert chat_limits.render(fmt, messages=messages).prompt == fmt(messages=messages).prompt
    chat_limits.check_template(fmt)


def test_check_template_names_the_sample_chat():
    with pytest.raises(InputError, match=r"cannot render a 4-turn sample chat: the chat template loops more"):
        chat_limits.check_template(formatter(BOMB))
    with pytest.raises(InputError, match=r"fails on a 4-turn sample chat \(UndefinedError"):
        chat_limits.check_template(formatter("{{ messages[0].content.nope.deeper }}"))


@pytest.mark.slow
def test_serve_answers_a_template_bomb_with_400_and_keeps_serving(gemma_chat_bundle, tmp_path):
    bomb = tmp_path / "bomb.jinja"
    bomb.write_text(BOMB)
    srv = ServerProcess([gemma_chat_bundle, "--name", "gemma", "--chat-template", bomb], tmp_path)
    try:
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 400, r.text
        assert "loops more than 1,000,000 times" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        r = httpx.post(
            srv.url + "/v1/completions", json={"model": "gemma", "prompt": "The sea", "max_tokens": 4}, timeout=120
        )
        assert r.status_code == 200, r.text
    finally:
        assert srv.stop() == 0


@pytest.mark.slow
def test_build_refuses_a_gguf_whose_template_cannot_render(gemma_gguf, tmp_path):
    bomb = tmp_path / "bomb.jinja"
    bomb.write_text(BOMB)
    gguf = tmp_path / "gemma-bomb.gguf"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gguf.scripts.gguf_new_metadata",
            str(gemma_gguf),
            str(gguf),
            "--chat-template-file",
            str(bomb),
            "--force",
        ],
        check=True,
        capture_output=True,
    )
    out = tmp_path / "b"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            str(gguf),
            "--profile",
            "cpu",
            "-o",
            str(out),
            "--accept-license",
            "LicenseRef-gemma",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "the GGUF's tokenizer.chat_template: the chat template cannot render a 4-turn sample chat" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
