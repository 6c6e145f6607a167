# SPDX-License-Identifier: Apache-2.0
"""Replies shaped as OpenAI sends them: a whole reply's choice, finish reasons, tool calls parsed out of a reply in
llama.cpp's generic tool format (whole, or streamed as they are generated: :class:`ToolCallStream`), and
log-probabilities in the chat and completions forms (:class:`ReplyShape`)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from edgesdk.runtime import grammar as _grammar


@dataclass
class ReplyShape:
    """How a generation's reply is shaped: tool calls parsed out of it, log-probabilities in OpenAI's form."""

    operation: str
    tools: bool = False
    logprobs: bool = False

    def tool_calls(self, text: str, finish: str) -> tuple[list[dict], str | None] | None:
        """(tool calls, text content) of a reply in the generic tool format; None when tools are off. A reply
        cut by max_tokens is its raw text."""
        if not self.tools:
            return None
        if finish == "length":
            return [], text
        calls, content = _grammar.parse_tool_reply(text)
        return [
            {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls
        ], content

    def choice(self, index: int, text: str, last: dict) -> dict:
        """A whole (not streamed) reply as OpenAI's choice: a chat message, with its tool calls, or a completion
        (``last``: the generation's done event, with its log-probabilities)."""
        finish = finish_reason(last)
        lps = self.logprobs_of(last.get("logprobs") or [], 0)
        if self.operation != "chat":
            return {"index": index, "text": text, "logprobs": lps, "finish_reason": finish}
        message: dict = {"role": "assistant", "content": text}
        calls = self.tool_calls(text, finish)
        if calls is not None:
            message = {"role": "assistant", "content": calls[1], "tool_calls": calls[0] or None}
            if calls[0]:
                finish = "tool_calls"
        return {"index": index, "message": message, "logprobs": lps, "finish_reason": finish}

    def logprobs_of(self, entries: list, offset: int) -> dict | None:
        """OpenAI's ``logprobs`` of a choice (chat: ``content``; completions: tokens, token_logprobs,
        top_logprobs, text_offset from ``offset`` characters into the completion)."""
        if not self.logprobs:
            return None

        def tok(b: bytes) -> str:
            return b.decode("utf-8", errors="replace")

        if self.operation == "chat":
            return {
                "content": [
                    {
                        "token": tok(e.text),
                        "logprob": e.logprob,
                        "bytes": list(e.text),
                        "top_logprobs": [{"token": tok(t), "logprob": lp, "bytes": list(t)} for _, t, lp in e.top],
                    }
                    for e in entries
                ],
                "refusal": None,
            }
        offsets = []
        for e in entries:
            offsets.append(offset)
            offset += len(tok(e.text))
        return {
            "tokens": [tok(e.text) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{tok(t): lp for _, t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }


_CALL_HEAD = re.compile(r'\s*\{\s*"tool_call"\s*:\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')
_FIRST_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"')


class ToolCallStream:
    """A tool-call reply streamed as OpenAI streams one: the reply (llama.cpp's generic tool format, which the
    grammar holds it to: ``{"tool_call": {"name": ..., "arguments": {...}}}``) is read as it is generated; once
    its name is known, the first delta carries the call's ``id``, ``type``, ``name`` and empty ``arguments``, then
    every piece of the arguments object goes out as an ``arguments`` fragment. A reply that is not a call
    (``{"response": ...}`` under ``tool_choice: "auto"``) is held and sent whole at the end, as is a reply cut
    before its name: :meth:`end` gives its deltas as the non-streamed reply's (:meth:`ReplyShape.tool_calls`)."""

    def __init__(self, shape: ReplyShape) -> None:
        self.shape = shape
        self.text = ""
        self.mode = "head"  # "head": not known yet; "args": a call, streaming; "after": its arguments are out; "held"
        self._args_from = 0  # where the arguments start in text
        self._sent = 0  # characters of text sent as arguments
        self._depth = 0
        self._in_string = self._escape = False

    def feed(self, piece: str) -> list[dict]:
        """The deltas ``piece`` completes (none while the call's name is not known yet)."""
        self.text += piece
        out: list[dict] = []
        if self.mode == "head":
            head = _CALL_HEAD.match(self.text)
            if head is None:
                first = _FIRST_KEY.match(self.text)
                if first is not None and first.group(1) != "tool_call":
                    self.mode = "held"
                return out
            if not self.text[head.end() :]:
                return out  # the arguments' first character decides
            if self.text[head.end()] != "{":
                self.mode = "held"
                return out
            self.mode, self._args_from = "args", head.end()
            self._sent = head.end()
            out.append(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": new_call_id(),
                            "type": "function",
                            "function": {"name": json.loads(head.group(1)), "arguments": ""},
                        }
                    ]
                }
            )
        if self.mode == "args":
            end = self._scan()
            upto = len(self.text) if end is None else end
            if upto > self._sent:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": self.text[self._sent : upto]}}]})
                self._sent = upto
            if end is not None:
                self.mode = "after"
        return out

    def _scan(self) -> int | None:
        """The end of the arguments object in text (None: not reached yet); scans only what is new."""
        i = max(self._sent, self._args_from)
        while i < len(self.text):
            c = self.text[i]
            i += 1
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i
        return None

    @property
    def streamed(self) -> bool:
        """The call went out as it was generated (its finish reason is ``tool_calls``, or ``length`` if cut)."""
        return self.mode in ("args", "after")

    def end(self, finish: str) -> tuple[list[dict], str]:
        """The deltas left at the end of the reply and its finish reason."""
        if self.streamed:
            return [], "tool_calls" if self.mode == "after" and finish != "length" else finish
        calls = self.shape.tool_calls(self.text, finish)
        if calls is not None and calls[0]:
            out = []
            for i, call in enumerate(calls[0]):  # as OpenAI streams them: id and name, then arguments
                fn = call["function"]
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                out.append({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
            return out, "tool_calls"
        return ([{"content": calls[1]}] if calls is not None else []), finish


def new_call_id() -> str:
    """A tool call's ``id`` (OpenAI's form: ``call_`` and 24 characters)."""
    return "call_" + uuid.uuid4().hex[:24]


def finish_reason(last: dict) -> str:
    """OpenAI's ``finish_reason`` of a generation's done event: ``length`` (cut by max_tokens) or ``stop``."""
    reason = last.get("finish_reason")
    return "length" if reason == "length" else "stop"
