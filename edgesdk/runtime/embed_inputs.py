# SPDX-License-Identifier: Apache-2.0
"""Token-id inputs of :meth:`edgesdk.runtime.session.Session.embed` (the OpenAI embeddings API's ``input`` as
lists of integers, which LangChain's ``OpenAIEmbeddings`` and llama.cpp's server clients send).

Token ids are the model's own vocabulary (the bundle's ``tokenizer.json``), taken as the encoder's input as they
are: a BERT-style model's ``[CLS] ... [SEP]`` are part of them, as ``Tokenizer.encode(text).ids`` gives them, so
the ids of a text embed exactly as the text does. Each id must be in the vocabulary (``0 <= id < vocab size``,
added tokens included). Longer than the tokenizer's ``max_length``: the same rule as text, truncated to
``max_length`` keeping a final special token (``[SEP]``), as the tokenizer truncates a text's tokens and then
appends its special ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from edgesdk.errors import InputError


class Row(NamedTuple):
    """One encoded input, as a ``tokenizers.Encoding`` reads: ``ids``, ``attention_mask``, ``type_ids``."""

    ids: list[int]
    attention_mask: list[int]
    type_ids: list[int]


def is_token_ids(value: object) -> bool:
    """A non-empty list of integers (booleans are not integers here)."""
    return (
        isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def vocab_size(tokenizer: Any) -> int:
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def check_token_ids(tokenizer: Any, inputs: Sequence[object], name: str = "input") -> None:
    """An InputError naming ``name[i]`` for the first token id outside the vocabulary."""
    size = vocab_size(tokenizer)
    for i, item in enumerate(inputs):
        if isinstance(item, list):
            bad = next((t for t in item if not 0 <= t < size), None)
            if bad is not None:
                raise InputError(
                    f"{name}[{i}] holds token id {bad}, outside this model's vocabulary (ids 0 to {size - 1})"
                )


def _truncate(tokenizer: Any, ids: list[int]) -> list[int]:
    truncation = tokenizer.truncation or {}
    limit = truncation.get("max_length")
    if not limit or len(ids) <= limit:
        return ids
    special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
    if limit > 1 and ids[-1] in special:
        return ids[: limit - 1] + [ids[-1]]
    return ids[:limit]


def encode_inputs(tokenizer: Any, inputs: Sequence[str | list[int]]) -> list[Row]:
    """Each input (a text, or token ids) as a :class:`Row`, all padded on the right to the longest; texts are
    encoded by ``tokenizer`` exactly as ``embed()`` encodes texts (its truncation and special tokens)."""
    check_token_ids(tokenizer, inputs)
    texts = [t for t in inputs if isinstance(t, str)]
    encoded = iter(tokenizer.encode_batch(texts) if texts else [])
    rows = []
    for item in inputs:
        if isinstance(item, str):
            e = next(encoded)
            n = int(sum(e.attention_mask))
            rows.append(Row(list(e.ids[:n]), list(e.attention_mask[:n]), list(e.type_ids[:n])))
        else:
            ids = _truncate(tokenizer, [int(t) for t in item])
            rows.append(Row(ids, [1] * len(ids), [0] * len(ids)))
    padding = tokenizer.padding or {}
    pad_id = int(padding.get("pad_id", 0))
    width = max(len(r.ids) for r in rows)
    return [
        Row(
            r.ids + [pad_id] * (width - len(r.ids)),
            r.attention_mask + [0] * (width - len(r.ids)),
            r.type_ids + [0] * (width - len(r.ids)),
        )
        for r in rows
    ]
