# SPDX-License-Identifier: Apache-2.0
"""Speculative decoding with a draft model (issue 37 item 2): the small model of a bundle (``edgesdk build --draft``)
proposes the next tokens of a request, and the :class:`~edgesdk.runtime.batching.BatchEngine` verifies them in its
one ``llama_decode`` step as it verifies prompt-lookup drafts (``BatchEngine._verified``: the longest prefix the
target's own sampling agrees with is kept, so greedy output is the target's and sampled output keeps the target's
distribution).

:class:`Drafter` owns one llama.cpp context on the draft's :class:`~edgesdk.runtime.batching.Weights`, with one
sequence per engine slot (its own KV buffer each: a slot's draft steps attend to that slot's cells only). Per slot it
remembers the tokens whose KV cells it holds. :meth:`Drafter.propose` brings a slot's cells in line with the request's
text so far (the cells past the common prefix are removed: the drafts the target rejected, or a previous request's
text; what is missing, at most the accepted tokens and the target's last one, is decoded in one call), then drafts
``k`` tokens greedily, one ``llama_decode`` each. :meth:`Drafter.rollback` drops the cells of rejected drafts as soon
as the target's step has judged them. Runs on the engine's thread only.

llama-cpp-python is imported only through :func:`edgesdk.native.import_llama_cpp`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, InputError
from edgesdk.native import import_llama_cpp

#: drafted tokens per step when the plan gives no k (the manifest of a bundle built before the decision)
DRAFT_K_DEFAULT = 4


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0])


class Drafter:
    """A draft model's context for a :class:`~edgesdk.runtime.batching.BatchEngine` of ``slots`` sequences of up to
    ``n_ctx`` tokens: ``model`` a loaded ``llama_model`` (:class:`~edgesdk.runtime.batching.Weights`, borrowed, never
    freed here) whose vocabulary is the target's (``n_vocab``, checked). ``k``: tokens drafted per step at most (the
    plan's); ``auto``: whether requests in ``auto`` mode draft with it (the plan's method ``draft``) rather than by
    prompt lookup."""

    def __init__(
        self,
        model: Any,
        *,
        slots: int,
        n_ctx: int,
        n_vocab: int,
        k: int = DRAFT_K_DEFAULT,
        auto: bool = True,
        threads: int = 1,
        n_batch: int = 512,
        path: str = "",
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"draft k must be a positive integer, got {k!r}")
        ll = import_llama_cpp()
        self._ll = ll
        self.k = k
        self.auto = bool(auto)
        self.path = path
        vocab = ll.llama_model_get_vocab(model)
        own = int(ll.llama_vocab_n_tokens(vocab))
        if own != n_vocab:
            raise InputError(
                f"draft model {path or '(given)'} has {own} tokens, the model {n_vocab}: a draft needs the model's "
                "vocabulary"
            )
        self.n_vocab = n_vocab
        self.n_batch = max(1, min(n_batch, n_ctx))
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx * slots
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = slots
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = False  # a slot's draft steps attend to its own cells only
        cparams.no_perf = True
        self._ctx = ll.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise BackendUnavailableError(
                f"llama.cpp could not create a draft context with {slots} sequences x {n_ctx} tokens for {path}"
            )
        self._mem = ll.llama_get_memory(self._ctx)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self.n_ctx = n_ctx
        self._held: list[list[int]] = [[] for _ in range(slots)]  # per slot: the tokens whose cells it holds
        self._vocab = vocab
        self.stats = {"draft_calls": 0, "draft_decodes": 0, "draft_tokens": 0, "catch_up_tokens": 0}

    def _decode(self, slot: int, tokens: list[int], start: int) -> np.ndarray:
        """``tokens`` at positions from ``start`` on sequence ``slot``, in calls of ``n_batch`` tokens; the raw
        logits row of the last one."""
        ll, b = self._ll, self._batch
        for at in range(0, len(tokens), self.n_batch):
            chunk = tokens[at : at + self.n_batch]
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = start + at + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = slot
                b.logits[i] = 0
            b.logits[len(chunk) - 1] = 1 if at + len(chunk) == len(tokens) else 0
            b.n_tokens = len(chunk)
            rc = ll.llama_decode(self._ctx, b)
            self.stats["draft_decodes"] += 1
            if rc != 0:
                self._forget(slot)
                raise RuntimeError(f"draft llama_decode returned {rc} for {len(chunk)} tokens")
        return np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))

    def _forget(self, slot: int) -> None:
        self._ll.llama_memory_seq_rm(self._mem, slot, -1, -1)
        self._held[slot] = []

    def rollback(self, slot: int, tokens: list[int]) -> None:
        """Keep only the cells of ``slot`` that hold a prefix of ``tokens`` (the accepted text): the drafts the
        target rejected leave the draft's cache as they left the target's."""
        held = self._held[slot]
        keep = _common(held, tokens)
        if keep < len(held):
            if not self._ll.llama_memory_seq_rm(self._mem, slot, keep, -1):
                self._forget(slot)
                return
            del held[keep:]

    def propose(self, slot: int, history: list[int], k: int, is_eog: Any = None) -> list[int]:
        """Up to ``k`` tokens the draft model expects after ``history`` (the request's prompt and generated tokens,
        the last one not yet evaluated by the target), greedily; a drafted end-of-generation token (``is_eog``) is
        the last one."""
        if k <= 0 or not history:
            return []
        self.stats["draft_calls"] += 1
        self.rollback(slot, history[:-1])  # at least the last token is evaluated again, for its logits
        held = self._held[slot]
        if len(history) + k > self.n_ctx:
            k = self.n_ctx - len(history)
            if k <= 0:
                return []
        missing = history[len(held) :]
        self.stats["catch_up_tokens"] += len(missing)
        row = self._decode(slot, missing, len(held))
        held.extend(missing)
        out: list[int] = []
        while True:
            tok = int(row.argmax())
            out.append(tok)
            if len(out) >= k or (is_eog is not None and is_eog(tok)):
                break
            row = self._decode(slot, [tok], len(held))
            held.append(tok)
        self.stats["draft_tokens"] += len(out)
        return out

    def close(self) -> None:
        ll = self._ll
        with contextlib.suppress(Exception):
            ll.llama_batch_free(self._batch)
        with contextlib.suppress(Exception):
            ll.llama_free(self._ctx)
        self._ctx = None
