# SPDX-License-Identifier: Apache-2.0
"""The planner's data types: what a model is (:class:`ModelFacts`), what the user asked for
(:class:`BuildOptions`), and what was decided (:class:`Decision`, :class:`Plan`).

A low module: it imports nothing else from edgesdk, so the planner, the format packages and the
build all share these types without importing each other.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, TypeAlias, TypeVar, runtime_checkable

# JSON data (manifest sections, reports, facts read from config.json). ``JSON`` is any JSON value;
# ``JSONObject`` is a JSON object whose values callers index and convert themselves (json.load's own
# result type is Any, so the values stay loosely typed; the name says what they are).
JSONScalar: TypeAlias = "str | int | float | bool | None"
JSON: TypeAlias = "JSONScalar | list[JSON] | dict[str, JSON]"
JSONObject: TypeAlias = "dict[str, Any]"
# A JSON value as code hands it on (a decision's value): read-only containers, so a list[str] or a
# dict[str, float] is one without a copy.
JSONValue: TypeAlias = "JSONScalar | Sequence[JSONValue] | Mapping[str, JSONValue]"

# Parity thresholds per precision (min cosine of the pooled output, max abs error of the raw output).
# FP16 and INT8 figures follow what an embedding user notices: a cosine drop below ~0.995 reorders
# nearest neighbours in retrieval benchmarks; profiles may override under policy.parity.
DEFAULT_PARITY: dict[str, dict[str, float | None]] = {
    "fp32": {"min_cosine": 0.9999, "max_abs": 1e-3},
    "fp16": {"min_cosine": 0.999, "max_abs": 5e-2},
    "bf16": {"min_cosine": 0.995, "max_abs": 1e-1},
    "int8": {"min_cosine": 0.995, "max_abs": None},
}


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
    # ONNX sources: what planners read from the graph and its sibling config files (inspect's
    # onnx_graph_facts), so the planner opens no file; None: not read (facts made elsewhere). Like config,
    # not part of the plan's JSON.
    graph: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("config", None)
        d.pop("graph", None)
        return d


@dataclass
class Decision:
    """One planning decision as ``--explain`` prints it and the plan's JSON holds it: ``value`` (JSON) and
    ``reason`` (what a person reads). Code reads a format's typed :class:`PlanSection`, not these."""

    key: str
    value: JSONValue
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "reason": self.reason}


class JSONable:
    """A typed decision value that writes itself as the JSON the plan always held (``to_json``)."""

    def to_json(self) -> JSONValue:
        raise NotImplementedError


def _json_value(value: object) -> JSONValue:
    if isinstance(value, JSONable):
        return value.to_json()
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    assert value is None or isinstance(value, (str, int, float, bool)), f"not JSON: {type(value).__name__}"
    return value


_S = TypeVar("_S", bound="PlanSection")


@runtime_checkable
class OnnxRuntimeSection(Protocol):
    """A section that carries the ONNX Runtime EP chain and the parity thresholds (ONNX, TensorRT)."""

    ep_chain: list[str]
    parity: dict[str, float | None]


@dataclass
class PlanSection:
    """A format's decisions, typed: each format subclasses this (``OnnxPlan``, ``TensorRTPlan``, ``GgufPlan``,
    ``VlmPlan``) with one attribute per decision, and builders read the attributes.

    ``FIELDS`` maps a decision key to its attribute; ``PARSE`` turns a decision's JSON value into the attribute's
    type where it is not JSON itself (a dataclass such as ``EngineTarget``). ``why`` holds each decision's reason
    in plan order, so :meth:`decisions` (``--explain``, the plan's JSON) is derived from the attributes and
    prints exactly what the decisions always printed. A decision whose key the section does not type (a
    registered format's own, or one added by another module) is kept, in order, under ``other``.
    """

    why: dict[str, str] = field(default_factory=dict, repr=False)
    other: dict[str, JSONValue] = field(default_factory=dict)

    FIELDS: ClassVar[dict[str, str]] = {}
    PARSE: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_decisions(cls: type[_S], decisions: Iterable[Decision]) -> _S:
        section = cls()
        for d in decisions:
            section.record(d.key, d.value, d.reason)
        return section

    def record(self, key: str, value: JSONValue, reason: str) -> None:
        """Set decision ``key`` (its attribute, or ``other``); a key already recorded keeps its place."""
        attr = self.FIELDS.get(key)
        if attr is None:
            self.other[key] = value
        else:
            parse = self.PARSE.get(attr)
            setattr(self, attr, parse(value) if parse is not None and value is not None else value)
        self.why[key] = reason

    def value(self, key: str) -> JSONValue:
        """Decision ``key``'s value as JSON (from its attribute for a typed key)."""
        attr = self.FIELDS.get(key)
        return _json_value(getattr(self, attr)) if attr is not None else self.other[key]

    def decisions(self) -> list[Decision]:
        return [Decision(key, self.value(key), reason) for key, reason in self.why.items()]

    def copy(self: _S) -> _S:
        return copy.deepcopy(self)


@dataclass
class BuildOptions:
    """What the user asked a build for (``edgesdk build``'s options, the Python API's keywords). A format declares
    the ``edgesdk build`` options it owns in its package (``edgesdk.formats.FormatOptions``: its click options and
    checks); their values land here, in the field of the same name (those below are the public API) or, for an
    option without a field, in ``extra`` (read with :meth:`option`)."""

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
    chat_template: str | None = None  # GGUF: a shipped chat template name or a Jinja file (--chat-template)
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
    # A format's options without a field here (by name), and the deprecated spelling of the nn.Module fields
    # above ({"example_inputs": ...}); read through option().
    extra: dict[str, Any] = field(default_factory=dict)

    def option(self, name: str) -> Any:
        """A typed field, or the same key from the ``extra`` dict when the field is unset or there is none."""
        value = getattr(self, name, None)
        return self.extra.get(name) if value is None else value


@dataclass
class Plan:
    """What :func:`edgesdk.plan.plan_build` decided: the shared decisions (``head``: profile, format, precision;
    ``tail``: the license gate), the format's typed :class:`PlanSection`, and what the build added (``added``:
    GGUF parity attempts). :attr:`decisions` (``--explain`` and the plan's JSON) is derived from them.

    ``ep_chain`` and ``parity`` are the section's own where it has them (ONNX, TensorRT). A section without
    them (GGUF, VLM) does not steer by either; the plan's JSON still carries the profile's ONNX Runtime chain and
    thresholds there (``profile_ep_chain``, ``profile_parity``) so bundles and their hashes stay as they were.
    """

    format: str
    precision: str
    section: PlanSection
    model: dict[str, Any]
    profile: str
    head: list[Decision] = field(default_factory=list)
    tail: list[Decision] = field(default_factory=list)
    added: list[Decision] = field(default_factory=list)
    profile_ep_chain: list[str] = field(default_factory=list)
    profile_parity: dict[str, float | None] = field(default_factory=dict)
    # What the plan was made from, for the build that executes it (not part of the plan's JSON).
    facts: ModelFacts | None = field(default=None, repr=False, compare=False)
    # the edgesdk.profiles.Profile planned for; Any here, as types.py imports nothing from edgesdk (build.py types it)
    target: Any = field(default=None, repr=False, compare=False)

    @property
    def decisions(self) -> list[Decision]:
        return [*self.head, *self.section.decisions(), *self.tail, *self.added]

    @property
    def ep_chain(self) -> list[str]:
        return list(self.section.ep_chain if isinstance(self.section, OnnxRuntimeSection) else self.profile_ep_chain)

    @property
    def parity(self) -> dict[str, float | None]:
        return dict(self.section.parity if isinstance(self.section, OnnxRuntimeSection) else self.profile_parity)

    def decision(self, key: str, default: JSONValue = None) -> JSONValue:
        """A decision's JSON value by key (``default`` when the plan has none): for a registered format's own
        keys (``section.other``), tests and tools. Built-in builders read their typed section instead."""
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
        lines = [
            f"plan for {self.model.get('name')} ({self.model.get('kind')}, {self.model.get('task')}) "
            f"on profile {self.profile}:"
        ]
        width = max(len(d.key) for d in self.decisions) if self.decisions else 8
        for d in self.decisions:
            value = d.value if not isinstance(d.value, (list, tuple)) else " -> ".join(map(str, d.value))
            lines.append(f"  {d.key:<{width}}  {value}")
            lines.append(f"  {'':<{width}}    because {d.reason}")
        return "\n".join(lines)
