# SPDX-License-Identifier: Apache-2.0
"""Chat templates: the ones shipped in ``edgesdk/data/chat_templates`` (``NAME.jinja``), a Jinja file given by
path, and the build-time choice for a GGUF that carries no ``tokenizer.chat_template``.

A leaf: it reads the package's data files only (no llama.cpp, no numpy), so the GGUF planner, the builder, the
llama.cpp runtime and the CLI share one resolver. The choice by architecture comes from the text-architecture
registry (:func:`edgesdk.formats.gguf.archs.chat_template_for`).

A template's stop strings come from ``{# edgesdk-stop: TEXT #}`` lines in it (besides the model's
end-of-generation tokens, which always stop).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError

#: The plan decision that records which template a GGUF bundle's chats use.
DECISION_KEY = "gguf.chat_template"
#: The bundle file (artifact role ``chat_template``) holding the chosen template's text.
ARTIFACT = "chat_template.jinja"
ALIASES = {
    "llama3": "llama-3",
    "llama-3.1": "llama-3",
    "llama2": "llama-2",
    "qwen": "chatml",
    "qwen2": "chatml",
    "phi3": "phi-3",
    "gemma3": "gemma",
    "gemma-3": "gemma",
}
_STOP_MARK = re.compile(r"\{#-?\s*edgesdk-stop:\s*(.*?)\s*-?#\}")


def names() -> list[str]:
    """Named chat templates shipped in ``edgesdk/data/chat_templates`` (``NAME.jinja``)."""
    from edgesdk.resources import data_file

    return sorted(p.name[: -len(".jinja")] for p in data_file("chat_templates").iterdir() if p.name.endswith(".jinja"))


def shipped_name(spec: str) -> str | None:
    """The shipped template ``spec`` names (aliases as :data:`ALIASES`), else None (it may be a path)."""
    from edgesdk.resources import data_file

    if not isinstance(spec, str) or "/" in spec or not spec.strip():
        return None
    name = ALIASES.get(spec.strip().lower(), spec.strip().lower())
    return name if data_file("chat_templates", f"{name}.jinja").is_file() else None


def resolve(spec: str) -> tuple[str, str, list[str]]:
    """``NAME`` (a shipped template) or a path to a Jinja file -> (label, template text, stop strings);
    InputError (one line, listing the names) for anything else."""
    from edgesdk.resources import data_file

    if not isinstance(spec, str) or not spec.strip():
        raise InputError("chat_template must be a template name or a path to a Jinja file")
    name = shipped_name(spec)
    if name is not None:
        label, text = name, data_file("chat_templates", f"{name}.jinja").read_text(encoding="utf-8")
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise InputError(
                f"chat template {spec!r} is neither a shipped name ({', '.join(names())}) nor a readable file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"chat template {path}: not readable UTF-8 text ({exc})") from exc
        label = str(path)
    return label, text, stops(text)


def stops(text: str) -> list[str]:
    """The ``{# edgesdk-stop: TEXT #}`` stop strings of a template's text."""
    return [s for s in _STOP_MARK.findall(text) if s]


def plan_decision(facts: Any, requested: str | None) -> tuple[str | None, str, str]:
    """The chat template a GGUF build records: (value, source, reason).

    ``value``: a shipped name, the path of a file given with ``--chat-template``, or None (the GGUF's own
    template is used, or there is none). ``source``: ``requested`` | ``gguf`` | ``architecture`` | ``none``.
    A name is checked here (InputError listing the names); a path is read by the build (it must be a file)."""
    from edgesdk.formats.gguf.archs import chat_template_for

    info = facts.extra
    arch = str(info.get("architecture") or "")
    own = bool(info.get("chat_template"))
    where = "its tokenizer_config.json / chat_template.jinja" if facts.kind == "hf" else "tokenizer.chat_template"
    if requested is not None:
        if not isinstance(requested, str) or not requested.strip():
            raise InputError("--chat-template must be a template name or a path to a Jinja file")
        name = shipped_name(requested)
        if name is None:
            path = Path(requested).expanduser()
            if not path.is_file():
                raise InputError(
                    f"--chat-template {requested!r} is neither a shipped name ({', '.join(names())}) "
                    "nor a readable file"
                )
            value = str(path.resolve())
        else:
            value = name
        over = f"; it replaces the model's own template ({where})" if own else ""
        return (
            value,
            "requested",
            (
                f"--chat-template {requested}: chats are formatted with "
                f"{'the shipped ' + value if name else 'the file ' + value} template, bundled as "
                f"{ARTIFACT}{over}"
            ),
        )
    if own:
        return None, "gguf", f"the model carries its own chat template ({where}): chats use it"
    chosen = chat_template_for(arch)
    if chosen is not None:
        return (
            chosen,
            "architecture",
            (
                f"the model carries no chat template ({where}); architecture {arch} -> the shipped {chosen} template "
                f"(edgesdk/formats/gguf/archs), bundled as {ARTIFACT}; edgesdk serve/run --chat-template NAME|FILE "
                "overrides it at run time"
            ),
        )
    return (
        None,
        "none",
        (
            f"no chat template: the model carries none ({where}) and architecture {arch or '(unknown)'} maps to no "
            f"shipped one, so completions work and chat is refused; rebuild with --chat-template NAME|FILE or pass "
            f"--chat-template to edgesdk serve/run (names: {', '.join(names())})"
        ),
    )
