# SPDX-License-Identifier: Apache-2.0
"""What a text architecture is, as the HF -> GGUF converter needs it: one :class:`TextArch` record per family.

A record names the Hugging Face classes it converts, llama.cpp's architecture name (``general.architecture``),
the tensor-name map (gguf-py's map for that architecture plus the record's own additions), the rope types it
can express, and three hooks: ``check`` (refuse a config llama.cpp would run differently), ``metadata`` (the
keys beyond the ones every decoder gets, written by :func:`edgesdk.formats.gguf.convert.convert_hf_to_gguf`),
``transform`` (per-tensor rewrites: llama's rope row order, Gemma's ``1 + w`` norms) and ``extra_tensors``
(tensors llama.cpp reads that HF keeps in config.json: Phi-3's long-rope factors).

The registry (:data:`edgesdk.formats.gguf.archs.ARCHS`) is one line per module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import ModelError

if TYPE_CHECKING:
    from gguf import GGUFWriter


@dataclass(frozen=True)
class Hparams:
    """The decoder shape every architecture writes (read from config.json by :func:`hparams`)."""

    n_layer: int
    n_head: int
    n_kv: int
    hidden: int
    head_dim: int
    rope_dim: int
    ffn: int
    context: int
    rms_eps: float
    rope_theta: float
    rope_type: str
    rope: Mapping[str, Any]  # the rope scaling parameters (rope_scaling or rope_parameters), {} for default


Config = Mapping[str, Any]


@dataclass(frozen=True)
class TextArch:
    """One text-decoder family: everything the converter does differently for it."""

    gguf_arch: str  # llama.cpp's architecture name, gguf-py's MODEL_ARCH member in lower case
    hf_classes: tuple[str, ...]  # config.json ``architectures[0]`` values converted by this record
    rope_types: tuple[str, ...] = ("default",)  # rope_scaling types llama.cpp runs as HF does for this family
    tensor_names: Mapping[str, str] = field(default_factory=dict)  # HF name ({bid} = layer) -> GGUF, beyond gguf-py's
    check: Callable[[Config, str], None] | None = None  # raise ModelError(where: ...) for a config it cannot convert
    metadata: Callable[[GGUFWriter, Config, Hparams], None] | None = None  # arch-specific GGUF keys
    transform: Callable[[str, np.ndarray, Config, Hparams], np.ndarray] | None = None  # (HF name, array) -> array
    extra_tensors: Callable[[Config, Hparams], Iterable[tuple[str, np.ndarray]]] | None = None  # GGUF name, array
    skip: Callable[[str], bool] | None = None  # HF tensors llama.cpp does not read
    layer_rope: bool = False  # transformers 5 writes rope_parameters per layer type (full / sliding attention)
    notes: str = ""  # what is new about the family (docs/gguf.md lists it)
    # the shipped chat template (edgesdk/data/chat_templates/NAME.jinja) a model of this family gets at build time
    # when it carries none of its own; None: the family has no one turn format (llama: Llama 2 vs Llama 3 chats)
    chat_template: str | None = None


def rope_parameters(config: Config) -> dict[str, Any]:
    """The rope scaling parameters of a transformers 4 (``rope_scaling``) or 5 (``rope_parameters``) config,
    without rope_theta; {} when there are none."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and not any(isinstance(v, dict) for v in params.values()):
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        if (rest.get("rope_type") or rest.get("type")) not in (None, "default"):
            return rest
    scaling = config.get("rope_scaling")
    return dict(scaling) if isinstance(scaling, dict) else {}


def hparams(config: Config, where: str, rope_theta: float, rope_type: str) -> Hparams:
    """The shared decoder shape; ModelError (one line) when config.json lacks a required number."""
    try:
        n_layer = int(config["num_hidden_layers"])
        n_head = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        ffn = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(
            f"{where}: missing or invalid {exc} (a decoder config needs num_hidden_layers, "
            "num_attention_heads, hidden_size, intermediate_size)"
        ) from exc
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = int(config.get("head_dim") or hidden // n_head)
    rope = rope_parameters(config)
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    rope_dim = int(head_dim * float(partial)) if partial is not None else head_dim
    return Hparams(
        n_layer=n_layer,
        n_head=n_head,
        n_kv=n_kv,
        hidden=hidden,
        head_dim=head_dim,
        rope_dim=rope_dim,
        ffn=ffn,
        context=int(config.get("max_position_embeddings", 2048)),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_type=rope_type,
        rope=rope,
    )


def finite(value: Any, what: str, where: str) -> float:
    """``value`` as a finite float, else ModelError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ModelError(f"{where}: {what} {value!r} is not a number")
    return float(value)
