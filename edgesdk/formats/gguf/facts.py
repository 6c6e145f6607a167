# SPDX-License-Identifier: Apache-2.0
"""What the GGUF planner needs to know about a source: a GGUF file's header facts, or a Hugging
Face causal-LM directory's config. Headers only (no tensor data); no gguf-py needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgesdk.contracts.gguf_header import read_gguf_header
from edgesdk.contracts.gguf_types import FTYPE_NAMES
from edgesdk.errors import ModelError
from edgesdk.types import ModelFacts


def gguf_file_facts(path: Path) -> ModelFacts:
    """Model facts of a ``.gguf`` file (the GGUF format's ``facts``): its header (:func:`gguf_facts`)."""
    info = gguf_facts(path)
    return ModelFacts(
        source=str(path),
        kind="gguf",
        task="text-generation",
        name=path.stem,
        architecture=info.get("architecture"),
        family=info.get("architecture"),
        params=info.get("params"),
        weight_bytes=path.stat().st_size,
        extra=info,
    )


def gguf_facts(path: str | Path) -> dict[str, Any]:
    """Header facts of a GGUF file (no tensor data is read). ModelError if truncated or corrupt."""
    path = Path(path)
    header = read_gguf_header(path)
    size = path.stat().st_size
    params, end = 0, header.data_start
    for t in header.tensors:
        params += t.n_elements
        end = max(end, header.data_start + t.offset + t.n_bytes)
    if end > size or not header.tensors:
        raise ModelError(f"{path}: truncated GGUF file (tensor data needs {end} bytes, file has {size})")
    arch = header.scalar("general.architecture")
    if not arch:
        raise ModelError(f"{path}: GGUF file has no general.architecture")
    heads = header.scalar(f"{arch}.attention.head_count")
    hidden = header.scalar(f"{arch}.embedding_length")
    kv_heads = (
        header.scalar(f"{arch}.attention.head_count_kv")
        if f"{arch}.attention.head_count_kv" in header.fields
        else heads
    )
    file_type = header.scalar("general.file_type")
    return {
        "architecture": arch,
        "name": header.scalar("general.name"),
        "params": int(params),
        "layers": header.scalar(f"{arch}.block_count"),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": header.scalar(f"{arch}.attention.key_length") or (hidden // heads if hidden and heads else None),
        "hidden": hidden,
        "ffn": header.scalar(f"{arch}.feed_forward_length"),
        "ctx_train": header.scalar(f"{arch}.context_length"),
        "n_vocab": header.array_length("tokenizer.ggml.tokens"),
        "file_type": FTYPE_NAMES.get(file_type, f"ftype {file_type}") if file_type is not None else None,
        "license": header.scalar("general.license"),
        "license_name": header.scalar("general.license.name"),
        "license_link": header.scalar("general.license.link"),
        "chat_template": "tokenizer.chat_template" in header.fields,
        "tensor_bytes": int(end),
    }


def decoder_facts(cfg: dict[str, Any]) -> dict[str, Any]:
    """The shape of a HF decoder config as the GGUF planner reads it: layers, heads, KV heads, widths, the trained
    context and the vocabulary (a VLM's ``text_config`` too)."""
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    return {
        "layers": cfg.get("num_hidden_layers"),
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "hidden": hidden,
        "head_dim": cfg.get("head_dim") or (hidden // heads if hidden and heads else None),
        "ffn": cfg.get("intermediate_size"),
        "ctx_train": cfg.get("max_position_embeddings"),
        "n_vocab": cfg.get("vocab_size"),
    }


def hf_causal_lm_facts(directory: str | Path) -> dict[str, Any]:
    """Facts the GGUF planner needs from a HF causal-LM directory's config.json and tokenizer files."""
    from edgesdk.formats.gguf.archs import ARCHS

    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    archs = cfg.get("architectures") or []
    tok_cfg = directory / "tokenizer_config.json"
    chat = (directory / "chat_template.jinja").is_file() or (
        tok_cfg.is_file() and "chat_template" in json.loads(tok_cfg.read_text(encoding="utf-8"))
    )
    return {
        "architecture": archs[0] if archs else cfg.get("model_type"),
        "gguf_supported": bool(archs) and archs[0] in ARCHS,
        **decoder_facts(cfg),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "tokenizer_files": [f for f in ("tokenizer.json", "tokenizer.model") if (directory / f).is_file()],
        "chat_template": chat,
    }
