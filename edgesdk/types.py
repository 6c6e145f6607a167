# SPDX-License-Identifier: Apache-2.0
"""The planner's data types: what a model is (:class:`ModelFacts`), what the user asked for
(:class:`BuildOptions`), and what was decided (:class:`Decision`, :class:`Plan`).

A low module: it imports nothing else from edgesdk, so the planner, the format packages and the
build all share these types without importing each other.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from edgesdk.profiles import Profile

# JSON data (manifest sections, reports, facts read from config.json). ``JSON`` is any JSON value;
# ``JSONObject`` is a JSON object whose values callers index and convert themselves (json.load's own
# result type is Any, so the values stay loosely typed; the name says what they are).
JSONScalar: TypeAlias = "str | int | float | bool | None"
JSON: TypeAlias = "JSONScalar | list[JSON] | dict[str, JSON]"
JSONObject: TypeAlias = "dict[str, Any]"

# Parity thresholds per precision (min cosine of the pooled output, max abs error of the raw output).
# FP16 and INT8 figures follow what an embedding user notices: a cosine drop below ~0.995 reorders
# nearest neighbours in retrieval benchmarks; profiles may override under policy.parity.
DEFAULT_PARITY: dict[str, dict[str, float | None]] = {
    "fp32": {"min_cosine": 0.9999, "max_abs": 1e-3},
    "fp16": {"min_cosine": 0.999, "max_abs": 5e-2},
    "bf16": {"min_cosine": 0.995, "max_abs": 1e-1},
    "int8": {"min_cosine": 0.995, "max_abs": None},
}


def parity_thresholds(profile: Profile, precision: str) -> dict[str, Any]:
    """The default thresholds for ``precision`` with the profile's ``policy.parity`` overrides applied."""
    base: dict[str, Any] = dict(DEFAULT_PARITY.get(precision, DEFAULT_PARITY["fp32"]))
    base.update((profile.policy.get("parity") or {}).get(precision, {}))
    return base


def execution_provider_chain(profile: Profile) -> list[str]:
    """The profile's execution providers, best first, with the CPU always last."""
    chain = list(profile.policy["execution_providers"])
    if "CPUExecutionProvider" not in chain:
        chain.append("CPUExecutionProvider")
    return chain


class OptimizeMethod(str, enum.Enum):
    """Machine value of the ``optimize`` decision (the builder branches on this, never on the reason)."""

    NONE = "none"
    ORT_TRANSFORMER = "onnxruntime-transformer-optimizer"
    ONNXSLIM = "onnxslim"

    def __str__(self) -> str:
        return self.value


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
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("config", None)
        return d


@dataclass
class Decision:
    """One planning decision: ``value`` is what code reads, ``reason`` is what a person reads."""

    key: str
    value: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
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
    vision_runtime: str | None = None  # VLM vision encoder: auto | onnx (also an FP16 ONNX graph) | gguf (mmproj only)
    context_length: int | None = None
    license_policy: str | None = None
    waivers: str | None = None
    accept_licenses: tuple[str, ...] = ()
    scanoss_url: str | None = None
    model_license: str | None = None  # --model-license: SPDX expression or LicenseRef-*, judged by the policy
    progress: bool = True
    # nn.Module sources only (Python API): example inputs, their names, the module, a license id.
    example_inputs: Any = None
    input_names: list[str] | None = None
    module: Any = None
    license: str | None = None
    # TensorRT optimization-profile bounds (None: batch 8, the model's max positions or >= 512).
    max_batch: int | None = None
    max_seq_len: int | None = None
    # TensorRT optimization profiles given by the user (--shapes NAME:MIN:OPT:MAX): name -> {min, opt, max} dims.
    shapes: dict[str, dict[str, list[int]]] | None = None
    # The model's name in spans, manifest, SBOM and reports (--name); default: the source's file/directory name.
    name: str | None = None
    # Deprecated spelling of the nn.Module fields above ({"example_inputs": ...}); read through option().
    extra: dict[str, Any] = field(default_factory=dict)

    def option(self, name: str) -> Any:
        """A typed field, or the same key from the older ``extra`` dict when the field is unset."""
        value = getattr(self, name)
        return self.extra.get(name) if value is None else value


@dataclass
class Plan:
    format: str
    precision: str
    decisions: list[Decision]
    ep_chain: list[str]
    parity: dict[str, Any]
    model: dict[str, Any]
    profile: str
    # What the plan was made from, for the build that executes it (not part of the plan's JSON).
    facts: ModelFacts | None = field(default=None, repr=False, compare=False)
    target: Profile | None = field(default=None, repr=False, compare=False)

    def decision(self, key: str, default: Any = None) -> Any:
        for d in self.decisions:
            if d.key == key:
                return d.value
        return default

    def to_dict(self) -> dict[str, Any]:
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
