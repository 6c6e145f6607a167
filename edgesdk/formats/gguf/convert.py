# SPDX-License-Identifier: Apache-2.0
"""Hugging Face causal LM directory -> F16 GGUF (gguf-py), and llama.cpp's own quantizer.

Conversion uses gguf-py's tensor-name maps (``gguf.get_tensor_name_map``) and vocab helpers
(``gguf.BpeVocab``/``gguf.LlamaHfVocab`` + ``gguf.SpecialVocab`` for merges, special ids and the
chat template), so tensor names and tokenizer metadata are the ones llama.cpp expects.

Quantization runs ``llama_model_quantize`` in a child process: llama.cpp aborts (not raises) on
some malformed inputs, and a build must never take the host process down with it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgesdk.contracts.gguf_types import FTYPES
from edgesdk.errors import ExternalToolError, ModelError
from edgesdk.formats.gguf.archs import ARCHS, TextArch
from edgesdk.formats.gguf.archs import base as archbase
from edgesdk.host import default_threads

if TYPE_CHECKING:
    from gguf.vocab import Vocab
    from llama_cpp import Llama

# HF architecture -> (gguf arch name, whether Q/K rows are permuted for llama.cpp's rope layout), from the
# text-architecture records (edgesdk/formats/gguf/archs/: one module per family, one registry line each).
SUPPORTED_ARCHITECTURES = {cls: (rec.gguf_arch, rec.gguf_arch == "llama") for cls, rec in ARCHS.items()}


# ---------------------------------------------------------------------------------------------
# transformers 4.x and 5.x checkpoints (docs/vlm.md, "transformers 4 and 5 checkpoints")
#
# Seen in real saves of the same tiny random models with transformers 4.57.6, 5.0.0, 5.17.0 and 5.25.0:
# transformers 5 writes config.json's RoPE settings as ``rope_parameters: {rope_theta, rope_type, ...}`` (top level
# for a causal LM, ``text_config`` for a VLM) instead of ``rope_theta`` + ``rope_scaling``, writes
# ``tie_word_embeddings`` explicitly, no ``special_tokens_map.json``, and a ``tokenizer_config.json`` with
# ``tokenizer_class: TokenizersBackend`` (unknown to transformers 4) and ``extra_special_tokens`` as a list.
# The converter reads both layouts; the PyTorch reference child gets a transformers 4 view of a 5.x
# directory when this host's transformers is 4.x (:func:`reference_dir`); transformers 5 loads both layouts.

_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def rope_settings(config: Mapping[str, Any], where: str = "config.json") -> tuple[float, str]:
    """(rope_theta, rope_type) from a transformers 4 (``rope_theta``, ``rope_scaling``) or 5 (``rope_parameters``)
    config; theta defaults to 10000 (LlamaConfig's and Qwen2Config's default). ModelError when both layouts are
    present and disagree, or the value is not a number."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if params is not None and not isinstance(params, dict):
        raise ModelError(f"{where}: rope_parameters must be an object, got {type(params).__name__}")
    if params and any(isinstance(v, dict) for v in params.values()):  # per layer type (not llama / qwen2)
        raise ModelError(f"{where}: rope_parameters per layer type ({', '.join(sorted(params))}) is not supported")
    theta_4, theta_5 = config.get("rope_theta"), (params or {}).get("rope_theta")
    if theta_4 is not None and theta_5 is not None and float(theta_4) != float(theta_5):
        raise ModelError(f"{where}: rope_theta {theta_4} and rope_parameters.rope_theta {theta_5} disagree")
    theta = theta_5 if theta_5 is not None else theta_4
    if theta is None:
        theta = 10000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ModelError(f"{where}: rope_theta {theta!r} is not a positive number")
    kind = (params or {}).get("rope_type") or (params or {}).get("type")
    if kind in (None, "default") and isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type")
    return float(theta), str(kind or "default")


def transformers_major() -> int | None:
    """This host's transformers major version (no import), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def config_for_transformers4(config: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 config.json as transformers 4 reads it: ``rope_parameters`` back to ``rope_theta`` (and
    ``rope_scaling`` for a non-default type or M-RoPE sections), ``_pad_token_id`` back to ``pad_token_id``; nested
    configs too."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key == "rope_parameters" and isinstance(value, dict) and _per_layer_type(value):
            out.update(per_layer_rope_for_transformers4(value))
            continue
        if key == "rope_parameters" and isinstance(value, dict):
            if "rope_theta" in value:
                out["rope_theta"] = value["rope_theta"]
            rest = {k: v for k, v in value.items() if k != "rope_theta"}
            # a non-default type, or M-RoPE sections (Qwen2-VL / Qwen2.5-VL: type default + mrope_section, which
            # transformers 4's Qwen2_5_VL attention reads from rope_scaling)
            if (rest.get("rope_type") or rest.get("type")) not in (None, "default") or "mrope_section" in rest:
                out["rope_scaling"] = rest
            continue
        if key == "_pad_token_id" and "pad_token_id" not in config:
            key = "pad_token_id"
        out[key] = config_for_transformers4(value) if isinstance(value, dict) and key.endswith("_config") else value
    return out


def _per_layer_type(params: Mapping[str, Any]) -> bool:
    return (
        bool(params)
        and set(params) <= {"full_attention", "sliding_attention"}
        and all(isinstance(v, dict) for v in params.values())
    )


def per_layer_rope_for_transformers4(params: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma-3's transformers 5 ``rope_parameters: {full_attention: {...}, sliding_attention: {...}}`` as the
    transformers 4 keys: ``rope_theta`` (+ ``rope_scaling``) of the global layers, ``rope_local_base_freq`` of
    the sliding ones (whose rope transformers 4 never scales)."""
    out: dict[str, Any] = {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    if "rope_theta" in full:
        out["rope_theta"] = full["rope_theta"]
    rest = {k: v for k, v in full.items() if k != "rope_theta"}
    if (rest.get("rope_type") or rest.get("type")) not in (None, "default"):
        out["rope_scaling"] = rest
    if "rope_theta" in local:
        out["rope_local_base_freq"] = local["rope_theta"]
    return out


def tokenizer_config_for_transformers4(config: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 tokenizer_config.json as transformers 4 reads it: ``TokenizersBackend`` is
    ``PreTrainedTokenizerFast`` (the same tokenizer.json), the ``extra_special_tokens`` list is
    ``additional_special_tokens``, named extra tokens (``image_token``) go back into ``extra_special_tokens``."""
    out = {k: v for k, v in config.items() if k != "backend"}
    if out.get("tokenizer_class") == "TokenizersBackend":
        out["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = out.get("extra_special_tokens")
    # a tokenizer loaded and saved again by transformers 5 names its extra tokens here, with no extra list
    specific = out.pop("model_specific_special_tokens", None)
    if isinstance(extra, list) or isinstance(specific, dict):
        if isinstance(extra, list) and extra:
            out.setdefault("additional_special_tokens", extra)
        named = {
            k: out.pop(k)
            for k in list(out)
            if k.endswith("_token") and k not in _SPECIAL_ATTRS and isinstance(out[k], str)
        }
        if isinstance(specific, dict):
            named.update({k: v for k, v in specific.items() if isinstance(v, str)})
        out["extra_special_tokens"] = named
    return out


def reference_dir(directory: Path, tmp: Path, *, rename: Callable[[str], str] | None = None) -> Path:
    """``directory`` as the PyTorch reference child can load it with this host's transformers: unchanged with
    transformers 5 (it loads 4.x and 5.x checkpoints) or for a 4.x checkpoint; on transformers 4 a 5.x checkpoint
    gets a view in ``tmp`` (symlinks, rewritten config / tokenizer / processor files, and safetensors with
    tensors renamed by ``rename`` where it changes a name)."""
    directory = Path(directory)
    if transformers_major() != 4:
        return directory
    jsons = {
        n: json.loads((directory / n).read_text(encoding="utf-8"))
        for n in ("config.json", "tokenizer_config.json", "processor_config.json")
        if (directory / n).is_file()
    }
    new = dict(jsons)
    if "config.json" in new:
        new["config.json"] = config_for_transformers4(new["config.json"])
    if "tokenizer_config.json" in new:
        new["tokenizer_config.json"] = tokenizer_config_for_transformers4(new["tokenizer_config.json"])
    proc = new.get("processor_config.json") or {}
    if isinstance(proc.get("image_processor"), dict):
        proc = dict(proc)
        image = proc.pop("image_processor")
        new["processor_config.json"] = proc
        if not (directory / "preprocessor_config.json").is_file():
            new["preprocessor_config.json"] = {
                **image,
                **({"processor_class": proc["processor_class"]} if "processor_class" in proc else {}),
            }
    files = sorted(directory.glob("*.safetensors"))
    renamed = [f for f in files if rename is not None and any(rename(k) != k for k in _safetensors_keys(f))]
    if new == jsons and not renamed:
        return directory
    view = Path(tmp) / directory.name
    view.mkdir(parents=True, exist_ok=True)
    for f in directory.iterdir():
        if f.is_file() and f.name not in new and f not in renamed and not f.name.endswith(".safetensors.index.json"):
            (view / f.name).symlink_to(f.resolve())
    for name, data in new.items():
        (view / name).write_text(json.dumps(data, indent=2), encoding="utf-8")
    for f in renamed:
        from safetensors import safe_open
        from safetensors.torch import save_file

        assert rename is not None
        with safe_open(str(f), framework="pt") as fh:
            tensors = {rename(k): fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - no __iter__
            meta = fh.metadata()
        save_file(tensors, str(view / f.name), metadata=meta)
    for index in directory.glob("*.safetensors.index.json"):
        data = json.loads(index.read_text(encoding="utf-8"))
        if rename is not None:
            data["weight_map"] = {rename(k): v for k, v in (data.get("weight_map") or {}).items()}
        (view / index.name).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return view


def _safetensors_keys(path: Path) -> list[str]:
    """Tensor names from a safetensors header (no tensor data read)."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    return [k for k in header if k != "__metadata__"]


def supported_list() -> str:
    return ", ".join(sorted(ARCHS))


def text_arch(config: Mapping[str, Any]) -> tuple[str, TextArch]:
    """(HF class name, its :class:`TextArch` record); ModelError naming the supported classes otherwise."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else str(config.get("model_type"))
    if arch not in ARCHS:
        raise ModelError(f"architecture {arch} not supported for GGUF conversion (supported: {supported_list()})")
    return arch, ARCHS[arch]


def hf_arch(config: Mapping[str, Any]) -> tuple[str, str, bool]:
    arch, rec = text_arch(config)
    gguf_arch, permute = SUPPORTED_ARCHITECTURES[arch]
    return arch, gguf_arch, permute


def _gguf_name(rec: TextArch, tmap: Any, hf_name: str) -> str | None:
    """The GGUF name of a HF tensor: the record's own names first ({bid} = layer index), then gguf-py's map."""
    if rec.tensor_names:
        import re

        for pattern, target in rec.tensor_names.items():
            rx = re.escape(pattern).replace(re.escape("{bid}"), r"(?P<bid>\d+)")
            m = re.fullmatch(rx, hf_name)
            if m:
                return target.format(bid=m.group("bid")) if "bid" in m.groupdict() else target
    name: str | None = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    return name


def _load_vocab(directory: Path) -> tuple[Vocab, str, str]:
    """gguf-py vocab for the directory's tokenizer, and the llama.cpp tokenizer model name."""
    import gguf

    tok_json = directory / "tokenizer.json"
    if not tok_json.is_file() and not (directory / "tokenizer.model").is_file():
        raise ModelError(
            f"{directory}: tokenizer missing (expected tokenizer.json or tokenizer.model)",
            hint="save the tokenizer next to the weights with tokenizer.save_pretrained()",
        )
    if tok_json.is_file():
        spec = json.loads(tok_json.read_text(encoding="utf-8"))
        model = spec.get("model", {})
        if model.get("type") == "BPE" and not model.get("byte_fallback"):
            return gguf.BpeVocab(directory), "gpt2", _bpe_pre_name(spec)
    try:
        import tempfile

        # LlamaHfVocab loads the tokenizer with transformers: a transformers 5 tokenizer_config.json
        # (TokenizersBackend) needs the transformers 4 view on a 4.x host
        with tempfile.TemporaryDirectory(prefix="edgesdk-vocab-") as tmp:
            return gguf.LlamaHfVocab(reference_dir(directory, Path(tmp))), "llama", "default"
    except Exception as exc:  # noqa: BLE001 - gguf-py raises several types for tokenizers it cannot read
        raise ModelError(f"{directory}: tokenizer not supported for GGUF ({type(exc).__name__}: {exc})") from exc


# llama.cpp (llama-vocab.cpp) sets token attributes by model name: a general.name containing "phi-3" or "phi3"
# makes it look up these tokens, and a vocabulary without one of them fails to load ("unordered_map::at").
_PHI3_NAME_TOKENS = (b"</s>", b"<unk>", b"<s>", b"<|endoftext|>")


def _check_name_quirk(writer: Any, tokens: Sequence[bytes]) -> None:
    try:
        name = str(writer.kv_data[0]["general.name"].value)
    except (KeyError, IndexError, AttributeError):
        return
    if "phi-3" in name or "phi3" in name:
        have = set(tokens)
        missing = [t.decode() for t in _PHI3_NAME_TOKENS if t not in have]
        if missing:
            raise ModelError(
                f"model name {name!r} makes llama.cpp look up Phi-3's tokens {', '.join(missing)}, "
                "which this tokenizer lacks (llama.cpp would fail to load the file)",
                hint="rename the model directory (or pass a name) without 'phi3' / 'phi-3'",
            )


def _spm_adds_space_prefix(directory: Path) -> bool:
    """Whether a SentencePiece-style tokenizer prepends "▁" to the text: a ``Prepend`` normalizer (Llama-2) or a
    ``Metaspace`` pre-tokenizer that prepends; Gemma's tokenizer.json has neither. True without a tokenizer.json
    (llama.cpp's default for the SPM model)."""
    tok_json = directory / "tokenizer.json"
    if not tok_json.is_file():
        return True
    spec = json.loads(tok_json.read_text(encoding="utf-8"))

    def parts(node: Any, key: str) -> list[dict[str, Any]]:
        if not isinstance(node, dict):
            return []
        return [p for p in node.get(key, []) if isinstance(p, dict)] if key in node else [node]

    normalizers = parts(spec.get("normalizer"), "normalizers")
    pre = parts(spec.get("pre_tokenizer"), "pretokenizers")
    return any(n.get("type") == "Prepend" for n in normalizers) or any(
        p.get("type") == "Metaspace"
        and p.get("prepend_scheme", "always") != "never"
        and p.get("add_prefix_space", True)
        for p in pre
    )


def _merge_rank_scores(directory: Path, tokens: Sequence[object], scores: list[float]) -> list[float]:
    """Scores for llama.cpp's SentencePiece-style tokenizer from a BPE tokenizer.json's merge list.

    gguf-py's LlamaHfVocab gives every token -1000; llama.cpp's SPM tokenizer merges the adjacent
    pair whose result has the highest score, so equal scores tokenize differently from HF. The token
    made by merge number r gets score -r: earlier merges win, as in BPE."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    rank: dict[str, int] = {}
    for r, merge in enumerate(spec.get("model", {}).get("merges", [])):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank.setdefault(left + right, r)
    out = list(scores)
    for i, tok in enumerate(tokens):
        text = tok.decode("utf-8", errors="replace") if isinstance(tok, bytes) else str(tok)
        if text in rank:
            out[i] = -float(rank[text])
        elif out[i] == -1000.0:
            out[i] = 0.0  # single characters / bytes: never the result of a merge
    return out


# Pre-tokenizer regexes llama.cpp knows by name (llama-vocab.cpp). We match the tokenizer.json split
# pattern against these; an unknown pattern falls back to "default" and the build records it.
_QWEN2_HINT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
_LLAMA3_HINT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"


def _bpe_pre_name(spec: Mapping[str, Any]) -> str:
    pre = spec.get("pre_tokenizer") or {}
    subs = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    patterns = [(s.get("pattern") or {}).get("Regex", "") for s in subs if s.get("type") == "Split"]
    if not patterns and any(s.get("type") == "ByteLevel" and s.get("use_regex", True) for s in subs):
        return "gpt-2"  # plain GPT-2 byte-level regex
    for pattern in patterns:
        if pattern.startswith(_QWEN2_HINT):
            return "qwen2"
        if pattern.startswith(_LLAMA3_HINT):
            return "llama-bpe"
    return "default"


def tensor_arrays(directory: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32-or-float16 numpy array) for every tensor in the safetensors files."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors weights found")
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                t = fh.get_tensor(name)
                yield name, t.float().numpy() if t.dtype.is_floating_point else t.numpy()


def convert_hf_to_gguf(directory: Path, out_path: Path, *, name: str | None = None) -> dict[str, Any]:
    """Write an F16 GGUF for a HF causal-LM directory of a registered architecture (:mod:`.archs`); returns facts
    about what was written."""
    import gguf

    directory = Path(directory)
    where = f"{directory / 'config.json'}"
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    arch, rec = text_arch(config)
    gguf_arch = rec.gguf_arch
    params = config.get("rope_parameters")
    if rec.layer_rope and isinstance(params, dict) and _per_layer_type(params):
        # transformers 5 Gemma-3: rope per layer type; read as the transformers 4 keys the record knows
        config = {
            **{k: v for k, v in config.items() if k != "rope_parameters"},
            **per_layer_rope_for_transformers4(params),
        }
    rope_theta, rope_type = rope_settings(config, where)
    if rope_type not in rec.rope_types:
        known = ", ".join("none/default" if t == "default" else t for t in rec.rope_types)
        raise ModelError(
            f"{directory}: rope_scaling {rope_type!r} is not supported by this converter for "
            f"{gguf_arch} (supported: {known})"
        )
    if rec.check is not None:
        rec.check(config, where)
    hp = archbase.hparams(config, where, rope_theta, rope_type)
    vocab, tok_model, tok_pre = _load_vocab(directory)
    writer = gguf.GGUFWriter(str(out_path), gguf_arch)
    # Model card / config metadata (name, license, ...) as gguf-py reads them, so the license gate and
    # the device see the same general.license the HF model card declared.
    meta = gguf.Metadata.load(None, directory, name or directory.name, 0)
    meta.set_gguf_meta_model(writer)
    writer.add_context_length(hp.context)
    writer.add_embedding_length(hp.hidden)
    writer.add_block_count(hp.n_layer)
    writer.add_feed_forward_length(hp.ffn)
    writer.add_head_count(hp.n_head)
    writer.add_head_count_kv(hp.n_kv)
    writer.add_rope_dimension_count(hp.rope_dim)
    writer.add_rope_freq_base(rope_theta)  # rope_theta or rope_parameters.rope_theta (transformers 5)
    writer.add_layer_norm_rms_eps(hp.rms_eps)
    writer.add_file_type(FTYPES["F16"])
    if hp.head_dim != hp.hidden // hp.n_head:
        writer.add_key_length(hp.head_dim)
        writer.add_value_length(hp.head_dim)
    if rec.metadata is not None:
        rec.metadata(writer, config, hp)

    tokens: list[bytes] = []
    scores: list[float] = []
    toktypes: list[gguf.TokenType] = []
    for text, score, toktype in vocab.all_tokens():
        # gguf-py's BpeVocab yields its base vocabulary as str (its added tokens as bytes) despite its annotation:
        # one type, UTF-8 bytes as the writer stores both, so comparisons with token bytes (_check_name_quirk) hold
        tokens.append(text.encode("utf-8") if isinstance(text, str) else bytes(text))
        scores.append(score)
        toktypes.append(toktype)
    if tok_model == "llama":
        scores = _merge_rank_scores(directory, tokens, scores)
    if (directory / "tokenizer.json").is_file():
        # gguf-py's BpeVocab and LlamaHfVocab type an added token NORMAL when it is also in the base vocab (and,
        # for LlamaHfVocab, not one of the tokenizer's named special tokens: Gemma-3's <start_of_turn>), so
        # llama.cpp would not parse it as special; llama.cpp's own converter types special added tokens CONTROL
        # and other added tokens USER_DEFINED wherever they sit (convert_hf_to_gguf.py, get_vocab_base).
        spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        for item in spec.get("added_tokens") or []:
            i = item.get("id")
            if isinstance(i, int) and 0 <= i < len(toktypes) and toktypes[i] == gguf.TokenType.NORMAL:
                toktypes[i] = gguf.TokenType.CONTROL if item.get("special") else gguf.TokenType.USER_DEFINED
    n_vocab = int(config.get("vocab_size", len(tokens)))
    while len(tokens) < n_vocab:  # embedding rows beyond the tokenizer (padding): llama.cpp needs a token each
        tokens.append(f"[PAD{len(tokens)}]".encode())  # the writer stores str and bytes alike (UTF-8)
        scores.append(-1000.0)
        toktypes.append(gguf.TokenType.UNUSED)
    _check_name_quirk(writer, tokens)
    writer.add_tokenizer_model(tok_model)
    writer.add_tokenizer_pre(tok_pre)
    if tok_model == "llama" and not _spm_adds_space_prefix(directory):
        writer.add_add_space_prefix(False)  # llama.cpp's SPM tokenizer prepends "▁" unless told not to (Gemma)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(toktypes)
    special = gguf.SpecialVocab(directory, load_merges=tok_model == "gpt2", n_vocab=len(tokens))
    special.add_to_gguf(writer, quiet=True)

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[gguf_arch.upper()], hp.n_layer)
    tied = bool(config.get("tie_word_embeddings", False))
    written = 0

    def add(gguf_name: str, data: np.ndarray) -> None:
        nonlocal written
        # 1-D tensors (norms, biases, rope factors) stay F32 as llama.cpp expects; matrices go to F16.
        writer.add_tensor(gguf_name, data.astype(np.float32 if data.ndim == 1 else np.float16))
        written += 1

    for hf_name, data in tensor_arrays(directory):
        if hf_name.endswith(".rotary_emb.inv_freq") or (rec.skip is not None and rec.skip(hf_name)):
            continue  # recomputed by llama.cpp from rope_freq_base
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp reuses token_embd when output.weight is absent
        new_name = _gguf_name(rec, tmap, hf_name)
        if new_name is None:
            raise ModelError(
                f"{directory}: tensor {hf_name} has no GGUF name for {gguf_arch} (unexpected architecture variant)"
            )
        if rec.transform is not None:
            data = rec.transform(hf_name, data, config, hp)
        add(new_name, data)
    if rec.extra_tensors is not None:
        for gguf_name, data in rec.extra_tensors(config, hp):
            add(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "architecture": arch,
        "gguf_architecture": gguf_arch,
        "tensors": written,
        "n_vocab": len(tokens),
        "tokenizer_model": tok_model,
        "tokenizer_pre": tok_pre,
        "chat_template": special.chat_template is not None,
    }


# ---------------------------------------------------------------------------------------------
# Quantization with llama.cpp's own quantizer (in a child process: edgesdk/formats/gguf/_children/quantize.py)


def quantize(
    src: Path,
    dst: Path,
    quant_type: str,
    *,
    threads: int | None = None,
    allow_requantize: bool = False,
    timeout_s: float = 3600,
) -> None:
    """``llama_model_quantize(src -> dst, quant_type)`` in a subprocess; ExternalToolError on failure."""
    if quant_type not in FTYPES:
        raise ModelError(f"unknown GGUF quantization type {quant_type!r} (known: {', '.join(FTYPES)})")
    threads = threads or default_threads(batch=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk.formats.gguf._children.quantize",
            str(src),
            str(dst),
            str(FTYPES[quant_type]),
            str(threads),
            "1" if allow_requantize else "0",
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        detail = lines[-1][:200] if lines else f"exit code {proc.returncode}"
        raise ExternalToolError(f"llama.cpp quantize to {quant_type} failed: {detail}")
    if not dst.is_file() or dst.stat().st_size == 0:
        raise ExternalToolError(f"llama.cpp quantize to {quant_type} wrote no output")


# ---------------------------------------------------------------------------------------------
# Verification: HF logits vs GGUF, and perplexity with llama.cpp itself


def _open_llama(path: Path, n_ctx: int, *, logits_all: bool = True, threads: int | None = None) -> Llama:
    from edgesdk.extras import require

    require("gguf", "llama_cpp", "a GGUF build (llama.cpp quantizes and checks parity)")
    from edgesdk.native import import_llama_cpp, route_llama_logs

    llama_cls = import_llama_cpp().Llama
    route_llama_logs(False)  # llama.cpp's load lines go to the edgesdk.llama_cpp logger, not stderr
    try:
        return cast(
            "Llama",
            llama_cls(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=n_ctx,
                n_ubatch=min(n_ctx, 512),
                logits_all=logits_all,
                n_gpu_layers=0,
                # the checks measure the file, on the CPU: a CUDA build of llama.cpp otherwise sends a batch's
                # matrix products of host-resident weights to the GPU (op offload), whose F16 arithmetic moved a
                # random 1B decoder's logits to min cosine 0.99878 on the H200 (2026-12-04)
                op_offload=False,
                n_threads=threads or default_threads(),
                n_threads_batch=threads or default_threads(batch=True),
                verbose=False,
            ),
        )
    except ValueError as exc:
        raise ModelError(f"{path}: llama.cpp cannot load this GGUF ({exc})") from exc


def _eval_logits(llm: Llama, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def sample_prompts(text: str, n: int = 4) -> list[str]:
    paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40]
    return [p[:300] for p in paragraphs[:n]]


def run_child(module: str, args: list[object], out: Path, what: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args...`` (a build step's child process, an hour at most) that must write ``out``;
    ExternalToolError "<what> failed: <the last line of its stderr>" (or its exit code) when it fails or does not."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0 or not out.is_file():
        lines = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        raise ExternalToolError(f"{what} failed: {lines[-1][:200] if lines else proc.returncode}")
    return proc


# The HF reference runs in a child process (edgesdk/formats/gguf/_children/hf_logits.py): torch's bundled
# CUDA libraries and a CUDA build of llama.cpp in one process crashed with "free(): invalid pointer" on the
# H200 machine (P4 run).
def hf_reference_logits(hf_dir: Path, prompts: list[str]) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(ids fed, full tokenization, fp32 logits) per prompt from the HF model, computed in a child process."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgesdk-hf-logits-") as tmp:
        pfile, out = Path(tmp) / "prompts.json", Path(tmp) / "logits.npz"
        pfile.write_text(json.dumps(prompts))
        ref_dir = reference_dir(Path(hf_dir), Path(tmp) / "ref")  # a transformers 5 checkpoint on transformers 4
        run_child("edgesdk.formats.gguf._children.hf_logits", [ref_dir, pfile, out], out, "HF reference logits")
        with np.load(out) as data:
            return [
                (data[f"ids{i}"].tolist(), data[f"full{i}"].tolist(), data[f"logits{i}"]) for i in range(len(prompts))
            ]


def logits_parity(hf_dir: Path, gguf_path: Path, text: str) -> dict[str, Any]:
    """Feed the same token ids (HF tokenizer) to the HF model (fp32, torch) and the F16 GGUF
    (llama.cpp, CPU); compare next-token logits at every position."""
    prompts = sample_prompts(text)
    refs = hf_reference_logits(hf_dir, prompts)
    llm = _open_llama(gguf_path, n_ctx=128)
    cos_min, max_abs, agree, positions, tok_match = 1.0, 0.0, 0, 0, 0
    try:
        for prompt, (ids, full, ref) in zip(prompts, refs, strict=True):
            got = _eval_logits(llm, ids)
            num = (ref * got).sum(axis=1)
            den = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
            cos_min = min(cos_min, float((num / np.clip(den, 1e-30, None)).min()))
            max_abs = max(max_abs, float(np.abs(ref - got).max()))
            agree += int((ref.argmax(axis=1) == got.argmax(axis=1)).sum())
            positions += len(ids)
            tok_match += int(llm.tokenize(prompt.encode(), add_bos=False, special=False) == full)
    finally:
        llm.close()
    return {
        "prompts": len(prompts),
        "positions": positions,
        "min_cosine": round(cos_min, 6),
        "max_abs": round(max_abs, 6),
        "top1_agreement": round(agree / max(positions, 1), 4),
        "tokenizer_agreement": f"{tok_match}/{len(prompts)} prompts tokenized identically by llama.cpp and HF",
    }


def perplexity(path: Path, text: str, n_ctx: int = 256, *, threads: int | None = None) -> dict[str, float]:
    """exp(mean NLL of each next token) over consecutive windows of ``n_ctx`` tokens (llama.cpp, CPU)."""
    llm = _open_llama(path, n_ctx=n_ctx, threads=threads)
    try:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        bos = llm.token_bos()
        nll, count = 0.0, 0
        step = n_ctx - 1
        for start in range(0, max(len(tokens) - 1, 1), step):
            window = tokens[start : start + step + 1]
            if len(window) < 2:
                break
            ids = ([bos] if bos >= 0 else []) + window[:-1]
            llm.reset()
            llm.eval(ids)
            # float32 view of llama.cpp's logits: a 262k vocabulary makes float64 copies cost seconds
            logits = llm.scores[len(ids) - (len(window) - 1) : len(ids)]
            targets = np.asarray(window[1:])
            shift = logits.max(axis=1)
            lse = np.log(np.exp(logits - shift[:, None], dtype=np.float32).sum(axis=1, dtype=np.float64)) + shift
            nll += float((lse - logits[np.arange(len(targets)), targets]).sum())
            count += len(targets)
    finally:
        llm.close()
    return {"ppl": round(math.exp(nll / max(count, 1)), 4), "tokens": count, "n_ctx": n_ctx}
