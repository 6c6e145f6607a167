# SPDX-License-Identifier: Apache-2.0
"""Model facts from headers only: ``config.json`` and safetensors headers of a Hugging Face directory,
the ONNX graph (without external data), the GGUF key/value header, or an ``nn.Module``'s parameters.

:func:`inspect_model` is the one place the planner's inputs are read from disk; :func:`edgesdk.plan.plan_build`
then reads nothing. A model file is read by the format that knows it (``Format.facts``: the ONNX format's
:mod:`edgesdk.formats.onnx.facts`, the GGUF format's :mod:`edgesdk.formats.gguf.facts`), found through the
registry; Hugging Face directories and ``nn.Module`` objects are read here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError, ModelError
from edgesdk.types import BuildOptions, ModelFacts

ENCODER_MODEL_TYPES = {
    "bert",
    "roberta",
    "distilbert",
    "xlm-roberta",
    "mpnet",
    "albert",
    "electra",
    "deberta",
    "deberta-v2",
}
SAFE_WEIGHTS = ("*.safetensors",)
PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "model*.bin")
PICKLE_FILES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # a model file with one of these suffixes is refused
# JSON files of a model directory the build or the runtime reads, and the top-level type each must have.
JSON_FILES: dict[str, type] = {
    "tokenizer.json": dict,
    "tokenizer_config.json": dict,
    "special_tokens_map.json": dict,
    "generation_config.json": dict,
    "preprocessor_config.json": dict,
    "modules.json": list,
    "sentence_bert_config.json": dict,
    "1_Pooling/config.json": dict,
}
# config.json keys that size the model: when present (and not null) each must be a positive integer.
CONFIG_INTS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_key_value_heads",
    "head_dim",
    "num_channels",
    "type_vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
)


def _read_json(path: Path, expect: type = dict) -> Any:
    """A JSON file of the model source, parsed, with the top-level type ``expect``; else ModelError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{path}: cannot read JSON ({type(exc).__name__}: {str(exc)[:120]})") from exc
    if not isinstance(data, expect):
        want = "an object" if expect is dict else "a list"
        raise ModelError(f"{path}: expected {want} at the top level, got {type(data).__name__}")
    return data


def _check_config(config: dict, path: Path) -> None:
    """Range-check the numbers that size the model, and the shape of the keys the planner reads."""
    for key in CONFIG_INTS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelError(f"{path}: {key} must be a positive integer, got {value!r}"[:200])
    size = config.get("image_size")
    sizes = size if isinstance(size, list) else [size]
    if size is not None and not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        raise ModelError(f"{path}: image_size must be a positive integer, got {size!r}"[:200])
    archs = config.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ModelError(f"{path}: architectures must be a list of strings, got {archs!r}"[:200])
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ModelError(f"{path}: model_type must be a string, got {model_type!r}"[:200])


def _hf_task(config: dict, directory: Path) -> tuple[str, str | None]:
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch and arch.endswith(("ForCausalLM", "LMHeadModel")):
        return "text-generation", arch
    from edgesdk.formats.vlm.families import architectures as vlm_architectures  # light: the family records
    from edgesdk.formats.vlm.families import config_architecture

    # the families of formats/vlm (their records' HF classes), found as the family lookup finds them: a directory
    # saved by transformers 4.57 of Qwen2.5-VL / Qwen2-VL has ``architectures`` only inside text_config
    vlm_arch = config_architecture(config)
    if isinstance(vlm_arch, str) and vlm_arch in vlm_architectures():
        return "image-text-to-text", vlm_arch
    if arch and arch.endswith("ForImageClassification"):
        return "image-classification", arch
    if arch and arch.endswith("ForSequenceClassification"):
        return "text-classification", arch
    if (directory / "modules.json").exists() or config.get("model_type") in ENCODER_MODEL_TYPES:
        return "feature-extraction", arch
    return "other", arch


def _hf_facts(directory: Path, options: BuildOptions | None) -> ModelFacts:
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{directory}: not a Hugging Face model directory (config.json missing)")
    config = _read_json(cfg_path)
    _check_config(config, cfg_path)
    for rel, expect in JSON_FILES.items():
        if (directory / rel).is_file():
            _read_json(directory / rel, expect)
    safe = [p for pat in SAFE_WEIGHTS for p in directory.glob(pat)]
    pickles = [p for pat in PICKLE_WEIGHTS for p in directory.glob(pat)]
    if not safe and not pickles:
        raise ModelError(f"{directory}: no weights found (expected *.safetensors)")
    allow_pickle = bool(options and options.allow_pickle)
    if not safe and pickles and not allow_pickle:
        raise ModelError(
            f"{directory}: only pickle weights ({pickles[0].name}); pickle can execute code on load",
            hint="convert to safetensors, or pass --allow-pickle if you trust the source",
        )
    if config.get("auto_map") and not (options and options.trust_remote_code):
        raise ModelError(
            f"{directory}: model needs custom code (auto_map in config.json)",
            hint="pass --trust-remote-code only if you trust the source",
        )
    task, arch = _hf_task(config, directory)
    weights = safe or pickles
    weight_bytes = sum(p.stat().st_size for p in weights)
    params = _safetensors_params(safe) if safe else None
    tokenizer = any((directory / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.txt"))
    facts = ModelFacts(
        source=str(directory),
        kind="hf",
        task=task,
        name=directory.name,
        architecture=arch,
        family=config.get("model_type"),
        params=params,
        weight_bytes=weight_bytes,
        config=config,
        extra={
            "tokenizer": tokenizer,
            "weights": [p.name for p in weights],
            "pickle_weights": not safe,
            "sentence_transformers": (directory / "modules.json").exists(),
        },
    )
    if task == "text-generation":
        from edgesdk.formats.gguf.facts import hf_causal_lm_facts

        facts.extra.update(hf_causal_lm_facts(directory))
    elif task == "image-text-to-text":
        from edgesdk.formats.vlm.facts import hf_vlm_facts

        facts.extra.update(hf_vlm_facts(directory))
    return facts


def _safetensors_params(files: list[Path]) -> int | None:
    """Count parameters from safetensors headers (no tensor data read)."""
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                if n <= 0 or n > 100 * 1024 * 1024:
                    raise ModelError(f"{f}: corrupt safetensors header")
                header = json.loads(fh.read(n))
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelError(f"{f}: corrupt safetensors file ({type(exc).__name__})") from exc
        if not isinstance(header, dict):
            raise ModelError(f"{f}: corrupt safetensors header (not a JSON object)")
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            shape = meta.get("shape", []) if isinstance(meta, dict) else None
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise ModelError(f"{f}: corrupt safetensors header (tensor {str(key)[:60]!r} has no valid shape)")
            count = 1
            for dim in shape:
                count *= dim
            total += count
    return total


def inspect_model(source: str | os.PathLike | Any, options: BuildOptions | None = None) -> ModelFacts:
    """Describe a model source: HF directory, ``.onnx`` file, ``.gguf`` file or a torch ``nn.Module``."""
    if not isinstance(source, (str, os.PathLike)):
        try:
            import torch
        except ImportError as exc:
            raise InputError("model source must be a path (torch is not installed)") from exc
        if isinstance(source, torch.nn.Module):
            params = sum(p.numel() for p in source.parameters())
            return ModelFacts(
                source=f"<{type(source).__name__}>",
                kind="torch",
                task="other",
                name=type(source).__name__,
                architecture=type(source).__name__,
                params=params,
                weight_bytes=sum(p.numel() * p.element_size() for p in source.parameters()),
            )
        raise InputError(f"unsupported model source type {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise ModelError(f"model not found: {path}")
    if path.is_dir():
        return _hf_facts(path, options)
    if not path.is_file():  # a FIFO or device named *.onnx would block the reader forever
        raise ModelError(f"{path}: not a regular file")
    suffix = path.suffix.lower()
    if suffix in PICKLE_FILES:  # before any format reads it
        raise ModelError(
            f"{path}: pickle checkpoints are not accepted as a model source",
            hint="export to ONNX or save a Hugging Face directory with safetensors",
        )
    from edgesdk.formats import read_facts

    facts = read_facts(path)  # the format that reads this file (ONNX: .onnx, GGUF: .gguf)
    if facts is not None:
        return facts
    raise ModelError(
        f"{path}: unsupported model file type {suffix or '(none)'}",
        hint="expected a Hugging Face directory, .onnx or .gguf",
    )
