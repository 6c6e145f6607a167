# SPDX-License-Identifier: Apache-2.0
"""Model facts from headers only: ``config.json`` and safetensors headers of a Hugging Face directory,
the ONNX graph (without external data), the GGUF key/value header, or an ``nn.Module``'s parameters.

:func:`inspect_model` is the one place the planner's inputs are read from disk; :func:`edgesdk.plan.plan_build`
then reads nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError, ModelError
from edgesdk.types import BuildOptions, ModelFacts

ENCODER_MODEL_TYPES = {"bert", "roberta", "distilbert", "xlm-roberta", "mpnet", "albert", "electra", "deberta",
                       "deberta-v2"}
SAFE_WEIGHTS = ("*.safetensors",)
PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "model*.bin")



def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read JSON ({exc})") from exc


def _hf_task(config: dict, directory: Path) -> tuple[str, str | None]:
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch and arch.endswith(("ForCausalLM", "LMHeadModel")):
        return "text-generation", arch
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
    safe = [p for pat in SAFE_WEIGHTS for p in directory.glob(pat)]
    pickles = [p for pat in PICKLE_WEIGHTS for p in directory.glob(pat)]
    if not safe and not pickles:
        raise ModelError(f"{directory}: no weights found (expected *.safetensors)")
    allow_pickle = bool(options and options.allow_pickle)
    if not safe and pickles and not allow_pickle:
        raise ModelError(f"{directory}: only pickle weights ({pickles[0].name}); pickle can execute code on load",
                         hint="convert to safetensors, or pass --allow-pickle if you trust the source")
    if config.get("auto_map") and not (options and options.trust_remote_code):
        raise ModelError(f"{directory}: model needs custom code (auto_map in config.json)",
                         hint="pass --trust-remote-code only if you trust the source")
    task, arch = _hf_task(config, directory)
    weights = safe or pickles
    weight_bytes = sum(p.stat().st_size for p in weights)
    params = _safetensors_params(safe) if safe else None
    tokenizer = any((directory / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.txt"))
    facts = ModelFacts(source=str(directory), kind="hf", task=task, name=directory.name, architecture=arch,
                       family=config.get("model_type"), params=params, weight_bytes=weight_bytes, config=config,
                       extra={"tokenizer": tokenizer, "weights": [p.name for p in weights],
                              "pickle_weights": not safe,
                              "sentence_transformers": (directory / "modules.json").exists()})
    if task == "text-generation":
        from edgesdk.formats.gguf.facts import hf_causal_lm_facts

        facts.extra.update(hf_causal_lm_facts(directory))
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
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{f}: corrupt safetensors file ({exc})") from exc
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            count = 1
            for dim in meta.get("shape", []):
                count *= int(dim)
            total += count
    return total


def _onnx_facts(path: Path) -> ModelFacts:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError / google.protobuf errors for corrupt files
        raise ModelError(f"{path}: not a valid ONNX model ({type(exc).__name__})") from exc
    if not model.graph.node:
        raise ModelError(f"{path}: ONNX model has an empty graph")
    params = 0
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        params += n
    inputs = [i.name for i in model.graph.input]
    task = "feature-extraction" if "input_ids" in inputs else "other"
    meta = {p.key: p.value for p in model.metadata_props}
    ops = sorted({n.op_type for n in model.graph.node})
    if task == "other" and any(op in ops for op in ("Conv", "ConvTranspose")):
        task = "vision"
    return ModelFacts(source=str(path), kind="onnx", task=task, name=path.stem, architecture=None,
                      family=meta.get("model_type"), params=params, weight_bytes=path.stat().st_size,
                      extra={"inputs": inputs, "outputs": [o.name for o in model.graph.output], "opset":
                             max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None),
                             "metadata": meta, "op_types": ops})


def inspect_model(source: str | os.PathLike | Any, options: BuildOptions | None = None) -> ModelFacts:
    """Describe a model source: HF directory, ``.onnx`` file, ``.gguf`` file or a torch ``nn.Module``."""
    if not isinstance(source, (str, os.PathLike)):
        try:
            import torch
        except ImportError as exc:
            raise InputError("model source must be a path (torch is not installed)") from exc
        if isinstance(source, torch.nn.Module):
            params = sum(p.numel() for p in source.parameters())
            return ModelFacts(source=f"<{type(source).__name__}>", kind="torch", task="other",
                              name=type(source).__name__, architecture=type(source).__name__, params=params,
                              weight_bytes=sum(p.numel() * p.element_size() for p in source.parameters()))
        raise InputError(f"unsupported model source type {type(source).__name__}")
    path = Path(source)
    if not path.exists():
        raise ModelError(f"model not found: {path}")
    if path.is_dir():
        return _hf_facts(path, options)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return _onnx_facts(path)
    if suffix == ".gguf":
        from edgesdk.formats.gguf.facts import gguf_facts

        info = gguf_facts(path)
        return ModelFacts(source=str(path), kind="gguf", task="text-generation", name=path.stem,
                          architecture=info.get("architecture"), family=info.get("architecture"),
                          params=info.get("params"), weight_bytes=path.stat().st_size, extra=info)
    if suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"):
        raise ModelError(f"{path}: pickle checkpoints are not accepted as a model source",
                         hint="export to ONNX or save a Hugging Face directory with safetensors")
    raise ModelError(f"{path}: unsupported model file type {suffix or '(none)'}",
                     hint="expected a Hugging Face directory, .onnx or .gguf")
