# SPDX-License-Identifier: Apache-2.0
"""A chat template renders within a budget, whoever wrote it.

A GGUF carries its own ``tokenizer.chat_template`` (Jinja), and Jinja's sandbox bounds one ``range()`` at
100,000 items but not their product: two nested ``range(100000)`` loops rendered for one request held the
server's event loop for over a minute (no answer, ``/health`` silent, SIGTERM ignored). :func:`render` runs a
llama-cpp-python ``Jinja2ChatFormatter`` with ``range`` replaced, for that render only, by one that counts
every item it yields against :data:`MAX_TEMPLATE_ITEMS` and checks a :data:`MAX_TEMPLATE_SECONDS` deadline, and
refuses a rendered prompt longer than :data:`MAX_TEMPLATE_CHARS`; each is an InputError naming the limit.
:func:`check_template` renders a sample chat under the same limits (``edgesdk build`` refuses a template
that fails it). The limits are in docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from edgesdk.errors import InputError

MAX_TEMPLATE_ITEMS = 1_000_000  # items all range() calls of one render may yield together
MAX_TEMPLATE_SECONDS = 2.0  # wall clock of one render, checked at every range() item
MAX_TEMPLATE_CHARS = 4 << 20  # characters of a rendered prompt
SAMPLE_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]


class _Budget:
    def __init__(self) -> None:
        self.items = 0
        self.deadline = time.monotonic() + MAX_TEMPLATE_SECONDS

    def range(self, *args: int) -> Iterator[int]:
        for i in range(*args):  # noqa: UP028 - every item is counted and the clock checked
            self.items += 1
            if self.items > MAX_TEMPLATE_ITEMS:
                raise InputError(
                    f"the chat template loops more than {MAX_TEMPLATE_ITEMS:,} times for one prompt (docs/security.md)"
                )
            if self.items % 1024 == 0 and time.monotonic() > self.deadline:
                raise InputError(f"the chat template took over {MAX_TEMPLATE_SECONDS:g} s to render one prompt")
            yield i


def render(formatter: Any, **kwargs: Any) -> Any:
    """``formatter(**kwargs)`` (a ``Jinja2ChatFormatter`` call) within the budget; its result."""
    budget = _Budget()
    result = formatter(range=budget.range, **kwargs)  # template variables shadow the environment's globals
    prompt = getattr(result, "prompt", "")
    if isinstance(prompt, str) and len(prompt) > MAX_TEMPLATE_CHARS:
        raise InputError(
            f"the chat template rendered {len(prompt):,} characters for one prompt (limit {MAX_TEMPLATE_CHARS:,})"
        )
    if time.monotonic() > budget.deadline:
        raise InputError(f"the chat template took over {MAX_TEMPLATE_SECONDS:g} s to render one prompt")
    return result


def check_template(formatter: Any) -> None:
    """InputError when ``formatter`` cannot render :data:`SAMPLE_CHAT` within the budget (a build check)."""
    try:
        render(formatter, messages=SAMPLE_CHAT)
    except InputError as exc:
        raise InputError(f"the chat template cannot render a 4-turn sample chat: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - jinja errors of any kind: one line
        raise InputError(f"the chat template fails on a 4-turn sample chat ({type(exc).__name__}: {exc})") from None
