# SPDX-License-Identifier: Apache-2.0
"""The planner: a pure function of (model facts, device profile, user options) -> decisions.

:func:`inspect_model` reads just enough of the source (config.json, ONNX graph header, GGUF
header) to describe it; :func:`plan_build` does no I/O beyond what format planners need from
those facts, so every decision is reproducible and explainable (``edgesdk build --explain``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError, ModelError
from edgesdk.profiles import Profile

# Parity thresholds per precision (min cosine of the pooled output, max abs error of the raw output).
# FP16 and INT8 figures follow what an embedding user notices: a cosine drop below ~0.995 reorders
# nearest neighbours in retrieval benchmarks; profiles may override under policy.parity.
DEFAULT_PARITY = {
    "fp32": {"min_cosine": 0.9999, "max_abs": 1e-3},
    "fp16": {"min_cosine": 0.999, "max_abs": 5e-2},
    "bf16": {"min_cosine": 0.995, "max_abs": 1e-1},
    "int8": {"min_cosine": 0.995, "max_abs": None},
}

ENCODER_MODEL_TYPES = {"bert", "roberta", "distilbert", "xlm-roberta", "mpnet", "albert", "electra", "deberta",
                       "deberta-v2"}
FUSION_MODEL_TYPE = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert",
                     "mpnet": "bert", "electra": "bert", "albert": "bert"}
SAFE_WEIGHTS = ("*.safetensors",)
PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "model*.bin")


@dataclass
class ModelFacts:
    source: str
    kind: str  # hf | onnx | gguf | torch
    task: str  # feature-extraction | text-generation | image-classification | other
    name: str
    architecture: str | None = None
    family: str | None = None  # config model_type or GGUF general.architecture
    params: int | None = None
    weight_bytes: int | None = None
    config: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("config", None)
        return d


@dataclass
class Decision:
    key: str
    value: Any
    reason: str

    def to_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "reason": self.reason}


@dataclass
class BuildOptions:
    format: str | None = None
    precision: str | None = None
    force: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    on_parity_fail: str = "error"  # error | fallback
    parity_samples: int = 64
    calibration_samples: int = 32
    seq_len: int = 128
    opset: int = 17
    dla: bool | None = None
    quant_type: str | None = None  # GGUF quantization type override
    context_length: int | None = None
    license_policy: str | None = None
    waivers: str | None = None
    accept_licenses: tuple[str, ...] = ()
    scanoss_url: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)


@dataclass
class Plan:
    format: str
    precision: str
    decisions: list[Decision]
    ep_chain: list[str]
    parity: dict
    model: dict
    profile: str

    def decision(self, key: str, default: Any = None) -> Any:
        for d in self.decisions:
            if d.key == key:
                return d.value
        return default

    def to_dict(self) -> dict:
        return {
            "profile": self.profile,
            "model": self.model,
            "format": self.format,
            "precision": self.precision,
            "ep_chain": self.ep_chain,
            "parity": self.parity,
            "decisions": [d.to_dict() for d in self.decisions],
        }

    def explain(self) -> str:
        lines = [f"plan for {self.model.get('name')} ({self.model.get('kind')}, {self.model.get('task')}) "
                 f"on profile {self.profile}:"]
        width = max(len(d.key) for d in self.decisions) if self.decisions else 8
        for d in self.decisions:
            value = d.value if not isinstance(d.value, (list, tuple)) else " -> ".join(map(str, d.value))
            lines.append(f"  {d.key:<{width}}  {value}")
            lines.append(f"  {'':<{width}}    because {d.reason}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Model inspection


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
        try:
            from edgesdk.formats.gguf import hf_causal_lm_facts
        except ImportError:
            return facts
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
        from edgesdk.formats.gguf import gguf_facts

        info = gguf_facts(path)
        return ModelFacts(source=str(path), kind="gguf", task="text-generation", name=path.stem,
                          architecture=info.get("architecture"), family=info.get("architecture"),
                          params=info.get("params"), weight_bytes=path.stat().st_size, extra=info)
    if suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"):
        raise ModelError(f"{path}: pickle checkpoints are not accepted as a model source",
                         hint="export to ONNX or save a Hugging Face directory with safetensors")
    raise ModelError(f"{path}: unsupported model file type {suffix or '(none)'}",
                     hint="expected a Hugging Face directory, .onnx or .gguf")


# ---------------------------------------------------------------------------------------------
# Planning


def _choose_format(facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision:
    allowed = profile.policy["formats"]
    if options.format:
        fmt = options.format
        if fmt == "gguf" and facts.task != "text-generation":
            raise InputError(f"--format gguf needs a causal language model; {facts.name} is {facts.task}")
        if fmt in ("onnx", "tensorrt") and facts.kind == "gguf":
            raise InputError(f"--format {fmt} cannot take a GGUF source; use --format gguf")
        note = "" if fmt in allowed else f" (not in the profile's preferred formats {allowed})"
        return Decision("format", fmt, f"requested with --format{note}")
    if facts.kind == "gguf" or facts.task == "text-generation":
        if "gguf" not in allowed:
            raise InputError(f"profile {profile.name} does not list gguf; pass --format to override")
        return Decision("format", "gguf", "causal LM: llama.cpp is the runtime Jetson and CPU hosts use for LLMs; "
                                          "GGUF carries weights, tokenizer and chat template in one file")
    if "tensorrt" in allowed and profile.is_gpu:
        return Decision("format", "onnx", "portable ONNX: the runtime takes TensorRT EP -> CUDA EP -> CPU EP, "
                                          "whichever the device has; pass --format tensorrt for a native engine "
                                          "(built on the device, deferred when this host cannot build it)")
    return Decision("format", "onnx", f"profile {profile.name} prefers {allowed[0]}; ONNX Runtime is its runtime")


def _choose_precision(facts: ModelFacts, profile: Profile, options: BuildOptions, fmt: str) -> Decision:
    order = profile.policy["precision"]
    if options.precision:
        if options.precision not in DEFAULT_PARITY:
            raise InputError(f"unknown precision {options.precision!r} (expected one of {', '.join(DEFAULT_PARITY)})")
        return Decision("precision", options.precision, "requested with --precision")
    if fmt == "gguf":
        return Decision("precision", "quantized", "GGUF quantization type is chosen by the memory arithmetic below")
    usable = [p for p in order if p in ("fp32", "fp16", "int8")]
    choice = usable[0] if usable else "fp32"
    if choice == "int8" and facts.task in ("image-classification", "vision"):
        return Decision("precision", "fp32", "the profile prefers INT8, but this model's compute is convolutions: "
                        "accuracy-aware dynamic INT8 covers MatMul/Attention only, and static Conv INT8 needs "
                        "calibration images from your data; pass --precision to override")
    if profile.is_gpu:
        why = (f"GPU profile: tensor cores run FP16 at {profile.figure('device.peak.fp16_tflops')} TFLOPS "
               f"(profile), twice FP32 throughput and half the bytes; first in the profile's order {order}")
    else:
        why = ("CPU profile: dynamic/accuracy-aware INT8 uses VNNI/AMX integer dot products and quarters weight bytes;"
               f" first in the profile's order {order}")
    return Decision("precision", choice, why)


def _parity(profile: Profile, precision: str) -> dict:
    base = dict(DEFAULT_PARITY.get(precision, DEFAULT_PARITY["fp32"]))
    base.update((profile.policy.get("parity") or {}).get(precision, {}))
    return base


def plan_build(facts: ModelFacts, profile: Profile, options: BuildOptions | None = None) -> Plan:
    """Decide format, precision, optimization, parity thresholds and the runtime chain, with reasons."""
    options = options or BuildOptions()
    decisions: list[Decision] = []
    if profile.resolved_from:
        decisions.append(Decision("profile", profile.name, f"alias {profile.resolved_from!r} resolves to "
                                  f"{profile.name} ({profile.data['display_name']})"))
    fmt = _choose_format(facts, profile, options)
    decisions.append(fmt)
    prec = _choose_precision(facts, profile, options, fmt.value)
    decisions.append(prec)
    ep_chain = list(profile.policy["execution_providers"])
    if "CPUExecutionProvider" not in ep_chain:
        ep_chain.append("CPUExecutionProvider")
    if fmt.value in ("onnx", "tensorrt"):
        decisions.extend(_plan_onnx(facts, profile, options, prec.value, fmt.value))
        decisions.append(Decision("ep_chain", ep_chain, "profile's execution providers, best first; the runtime takes "
                                  "only those present and records each fallback; CPU is always last"))
    if fmt.value == "tensorrt":
        from edgesdk.formats.tensorrt import plan_tensorrt

        decisions.extend(plan_tensorrt(facts, profile, options))
    elif fmt.value == "gguf":
        from edgesdk.formats.gguf import plan_gguf

        decisions.extend(plan_gguf(facts, profile, options))
    onnx_precision = next((d.value for d in decisions if d.key == "onnx_precision"), prec.value)
    parity = _parity(profile, onnx_precision)
    if fmt.value != "gguf":
        decisions.append(Decision("parity", parity, f"{onnx_precision} thresholds vs the PyTorch/source outputs on "
                                  f"{options.parity_samples} sample inputs; a miss "
                                  + ("falls back to the next precision" if options.on_parity_fail == "fallback"
                                     else "fails the build")))
    decisions.append(Decision("license_gate", options.license_policy or "default policy",
                              "packaging is gated on the license scan; unknown licenses are denied"))
    return Plan(format=fmt.value, precision=prec.value, decisions=decisions, ep_chain=ep_chain, parity=parity,
                model=facts.to_dict(), profile=profile.name)


def _plan_onnx(facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str,
               fmt: str = "onnx") -> list[Decision]:
    out: list[Decision] = []
    if facts.kind == "hf":
        out.append(Decision("export", f"optimum ONNX exporter, opset {options.opset}, dynamic batch/sequence axes",
                            "optimum-onnx knows each Hugging Face architecture's inputs/outputs and dynamic axes"))
    elif facts.kind == "torch":
        out.append(Decision("export", f"torch.onnx.export, opset {options.opset}", "plain nn.Module source"))
    else:
        out.append(Decision("export", "none (ONNX taken as is)", "the source is already ONNX"))
    if fmt == "tensorrt":
        out.append(Decision("optimize", "onnxslim", "TensorRT parses standard ONNX only: onnxruntime's fused "
                            "com.microsoft ops (Attention, SkipLayerNormalization) would split the engine"))
        out.append(Decision("onnx_precision", "fp32", f"TensorRT applies {precision} itself when it builds the "
                            "engine; FP16-converted or dynamic-INT8 ONNX ops would fall off TensorRT"))
        return out
    fusion = FUSION_MODEL_TYPE.get(facts.family or "")
    if precision == "int8" and not profile.is_gpu:
        out.append(Decision("optimize", "none (plain export; ONNX Runtime's session optimizer runs at load)",
                            "measured on CPU: INT8 on the fused graph ran at 0.56-0.68x FP32 against 0.52-0.58x on "
                            "the plain export in the same runs, and fusion gave FP32 no gain (docs/int8.md)"))
    elif fusion and facts.kind == "hf":
        heads = facts.config.get("num_attention_heads")
        hidden = facts.config.get("hidden_size")
        out.append(Decision("optimize", f"onnxruntime transformer optimizer (model_type={fusion}, heads={heads}, "
                            f"hidden={hidden})", "fuses attention, LayerNorm+residual and GELU into single kernels "
                            "that both CPU and CUDA EPs implement"))
    else:
        out.append(Decision("optimize", "onnxslim", "generic graph cleanup (constant folding, dead nodes); no "
                            "transformer fusion pattern applies to this model"))
    if precision == "int8":
        out.append(Decision("quantize", "accuracy-aware dynamic INT8 (per-channel weights), excluding the most "
                            "sensitive nodes until parity holds",
                            f"INT8 must keep min cosine >= {_parity(profile, 'int8')['min_cosine']} vs the source"))
    elif precision == "fp16":
        out.append(Decision("quantize", "FP16 weights and activations, keeping I/O FP32 and LayerNorm/Softmax "
                            "inputs in FP32 where FP16 overflows", "GPU profile; halves weight bytes"))
    return out
