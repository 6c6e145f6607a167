# SPDX-License-Identifier: Apache-2.0
"""Prompt (KV) prefix cache for one llama.cpp context, bounded by a memory budget (opt-in).

After a request, the context's KV state for the tokens it holds (prompt + generated) is copied out
with llama.cpp's per-sequence state functions (``llama_state_seq_get_size/get_data``, public
bindings of llama-cpp-python) and kept under its token sequence. A later request restores the
entry sharing the longest token prefix with its prompt (``llama_state_seq_set_data``) and marks
that many tokens as evaluated (``Llama.n_tokens``/``Llama.input_ids``); ``Llama.generate`` then
drops the cached tokens past the common prefix and evaluates only the rest of the prompt.

Why not ``Llama.save_state``: it also copies the Python-side logits buffer, ``n_tokens x n_vocab``
float32 rows (1 MiB per token for Gemma-3's 262,144-token vocabulary), which ``LlamaRAMCache`` does
not count against its capacity. The sequence state holds only the KV cells (about 18 KiB per token
for Gemma-3-270M).

Entries are evicted least-recently-used first when their bytes exceed the budget; an entry whose
tokens are a prefix of a newer one is dropped (the newer one covers it). Every method is called
with the backend's context lock held.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass

MIN_REUSE_TOKENS = 8  # shorter common prefixes are evaluated again (restoring costs more than it saves)


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    state: bytes


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """Token-prefix -> KV state of sequence 0, at most ``budget_bytes`` in all."""

    def __init__(self, budget_bytes: int, *, min_tokens: int = MIN_REUSE_TOKENS):
        if budget_bytes <= 0:
            raise ValueError("prompt cache budget must be positive")
        self.budget_bytes = int(budget_bytes)
        self.min_tokens = int(min_tokens)
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()  # stats() may be read from another thread
        self.hits = self.misses = self.evictions = self.reused_tokens = 0

    # ------------------------------------------------------------------ used by the backend
    def restore(self, llm, tokens: list[int]) -> int:
        """Load the longest cached prefix of ``tokens`` into ``llm`` (after ``llm.reset()``); returns the
        number of prompt tokens that need no evaluation (0: nothing restored, the context is reset).
        At most ``len(tokens) - 1`` are reused, so the last prompt token is always evaluated and its
        logits are fresh."""
        from edgesdk.native import import_llama_cpp

        llama_cpp = import_llama_cpp()

        with self._guard:
            best, entry = 0, None
            for key, e in self._entries.items():
                n = _common(key, tokens)
                if n > best:
                    best, entry = n, e
            best = min(best, len(tokens) - 1)
            if entry is None or best < self.min_tokens:
                self.misses += 1
                return 0
            self._entries.move_to_end(entry.tokens)
        buf = (ctypes.c_uint8 * len(entry.state)).from_buffer_copy(entry.state)
        mem = llama_cpp.llama_get_memory(llm.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)
        if llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(entry.state), 0) != len(entry.state):
            llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)
            llm.reset()
            with self._guard:
                self.misses += 1
            return 0
        llm.input_ids[:best] = tokens[:best]
        llm.n_tokens = best  # generate() removes the cached cells past this point and evaluates the rest
        with self._guard:
            self.hits += 1
            self.reused_tokens += best
        return best

    def save(self, llm) -> None:
        """Keep the context's current KV state under the tokens it holds."""
        from edgesdk.native import import_llama_cpp

        llama_cpp = import_llama_cpp()

        n = int(llm.n_tokens)
        if n < self.min_tokens:
            return
        size = int(llama_cpp.llama_state_seq_get_size(llm.ctx, 0))
        if size <= 0 or size > self.budget_bytes:
            return
        buf = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(llm.ctx, buf, size, 0))
        if written <= 0:
            return
        key = tuple(int(t) for t in llm.input_ids[:n])
        entry = _Entry(key, bytes(buf)[:written])
        with self._guard:
            for old in [k for k in self._entries if len(k) <= n and key[: len(k)] == k]:
                self._bytes -= len(self._entries.pop(old).state)
            self._entries[key] = entry
            self._bytes += len(entry.state)
            while self._bytes > self.budget_bytes and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped.state)
                self.evictions += 1

    # ------------------------------------------------------------------ reporting
    def stats(self) -> dict:
        with self._guard:
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "reused_tokens": self.reused_tokens,
            }
