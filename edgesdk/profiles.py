# SPDX-License-Identifier: Apache-2.0
"""Device profiles: load, validate, resolve names/aliases/paths, and a basic detector.

A profile is data (``profiles/*.yaml``): facts about a device, each figure a mapping
``{value, source, status?}``, plus policies (format preference, precision order, memory budget).
Validation errors name the file, the key path and the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from edgesdk.errors import ProfileError
from edgesdk.types import DEFAULT_PARITY

SCHEMA_VERSION = 1
FIGURE_STATUSES = ("confirmed", "derived", "unconfirmed", "measured")

# The schema: edgesdk/data/profile.schema.json (JSON Schema 2020-12, shipped so editors complete profile files),
# checked with jsonschema; errors become today's one-line messages ("KEY: expected TYPE, got ...", "KEY: missing
# (expected ...)", "KEY: unknown key"). Ranges the planner relies on are checked after it (_check_ranges).
_FIGURE_TEXT = "a figure mapping {value, source, status?}"
_JSON_TYPES = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "object": "mapping",
    "null": "null",
    "array": "list",
}


@functools.lru_cache(maxsize=1)
def profile_schema() -> dict[str, Any]:
    """The shipped JSON Schema of profile files (``edgesdk/data/profile.schema.json``)."""
    from edgesdk.resources import read_data_text

    schema: dict[str, Any] = json.loads(read_data_text("profile.schema.json"))
    return schema


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    import sys

    # jsonschema imports its optional IRI format checker, rfc3987-syntax, when installed (scanoss, on build
    # hosts, brings it): that builds a Lark grammar at import, 2 s on a loaded 2-core host, on every CLI command
    # that reads a profile. Profiles use no "format" keywords, so jsonschema is imported without it (only if
    # nothing imported jsonschema before; format checks are off by default in jsonschema anyway).
    hide = "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules
    if hide:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
    try:
        from jsonschema import Draft202012Validator
    finally:
        if hide:
            del sys.modules["rfc3987_syntax"]
    return Draft202012Validator(profile_schema())


def _describe(sub: dict[str, Any]) -> str:
    """A schema node in the words the messages use: ``string``, ``one of 'a', 'b'``, ``a list of string``."""
    if sub.get("$ref") == "#/$defs/figure":
        return _FIGURE_TEXT
    if "enum" in sub:
        return "one of " + ", ".join(repr(e) for e in sub["enum"])
    if "const" in sub:
        return repr(sub["const"])
    if "anyOf" in sub:
        return " or ".join(_describe(s) for s in sub["anyOf"])
    kind = sub.get("type")
    if kind == "array":
        return f"a list of {_describe(sub.get('items') or {})}"
    if kind == "object":
        return "a mapping"
    return _JSON_TYPES.get(str(kind), str(kind))


def _got(value: Any) -> str:
    return type(value).__name__ if isinstance(value, (dict, list)) else f"{type(value).__name__} {value!r}"


def _schema_order(error: Any) -> list[int]:
    """Errors in the order of the schema's keys (as a profile file is written), not alphabetical."""
    node, rank = profile_schema(), []
    for part in error.absolute_path:
        if isinstance(part, int):
            rank.append(part)
            node = node.get("items") or {}
            continue
        props = node.get("properties") or {}
        rank.append(list(props).index(part) if part in props else len(props))
        node = props.get(part) or {}
    if error.validator == "required":  # the missing key's own place
        props = list((error.schema or {}).get("properties") or {})
        missing = [n for n in error.validator_value if n not in error.instance]
        rank.append(props.index(missing[0]) if missing and missing[0] in props else len(props))
    return rank


def _message(error: Any) -> str:
    """One jsonschema error as ``KEY: what was expected, what was there``."""
    key = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in error.absolute_path).replace(".[", "[")
    sub = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        name = next((n for n in error.validator_value if n not in error.instance), "?")
        prop = (sub.get("properties") or {}).get(name, {})
        child = f"{key}.{name}" if key else name
        return f"{child}: missing (expected {_describe(prop)})" if prop else f"{child}: missing"
    if error.validator == "additionalProperties":
        known = set(sub.get("properties") or {})
        extra = next((n for n in error.instance if n not in known), "?")
        return f"{key + '.' if key else ''}{extra}: unknown key"
    if error.validator == "const" and key == "schema_version":
        return f"schema_version: expected {error.validator_value}, got {error.instance!r}"
    if error.validator in ("enum",):
        return f"{key}: expected {_describe(sub)}, got {error.instance!r}"
    if any(p == "figure" for p in error.absolute_schema_path) or sub.get("$ref") == "#/$defs/figure":
        return f"{key}: expected {_FIGURE_TEXT}, got {type(error.instance).__name__}"
    if error.validator == "anyOf":
        return f"{key}: expected {_describe(sub)}, got {type(error.instance).__name__}"
    if error.validator == "type" and sub.get("type") == "object":
        return f"{key}: expected a mapping, got {type(error.instance).__name__}"
    return f"{key}: expected {_describe(sub)}, got {_got(error.instance)}"


# policy.parity: per precision, the thresholds a build may override (numbers; null = not checked).
PARITY_KEYS = ("min_cosine", "max_abs", "ppl_ratio_max", "logits_min_cosine", "logits_min_top1")
PARITY_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8")
MAX_CONTEXT_LENGTH = 1 << 24  # 16M tokens: more than any model's trained context


def _is_num(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_ranges(data: dict[str, Any], errors: list[str]) -> None:
    """Ranges of the numbers the planner computes with (types were checked by the schema)."""
    from edgesdk.contracts.gguf_types import BPW  # lazy: keeps `import edgesdk.profiles` light

    def positive(key: str, value: Any, *, allow_zero: bool = False) -> None:
        if value is None:
            return
        if not _is_num(value) or value < 0 or (value == 0 and not allow_zero):
            errors.append(f"{key}: expected a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")

    memory = data["device"]["memory"]
    for name in ("total_gb", "usable_gb", "bandwidth_gbps"):
        fig = memory.get(name)
        if isinstance(fig, dict):
            positive(f"device.memory.{name}.value", fig.get("value"))
    for name, fig in (data["device"].get("peak") or {}).items():
        if isinstance(fig, dict) and fig.get("value") is not None:
            positive(f"device.peak.{name}.value", fig.get("value"))
    cpu = data["device"].get("cpu") or {}
    if "cores" in cpu and cpu["cores"] < 1:
        errors.append(f"device.cpu.cores: expected a positive integer, got {cpu['cores']!r}")
    dla = data["device"].get("dla") or {}
    if "cores" in dla and dla["cores"] < 0:
        errors.append(f"device.dla.cores: expected a non-negative integer, got {dla['cores']!r}")
    policy = data["policy"]
    for key in ("formats", "precision", "execution_providers"):
        if not policy[key]:
            errors.append(f"policy.{key}: expected a non-empty list")
    for i, ep in enumerate(policy["execution_providers"]):
        if not ep.endswith("ExecutionProvider") or not ep.isidentifier():
            errors.append(
                f"policy.execution_providers[{i}]: expected an ONNX Runtime provider name "
                f"(...ExecutionProvider), got {ep!r}"
            )
    frac = policy["memory_headroom_fraction"]
    if not _is_num(frac) or not 0 <= frac < 1:
        errors.append(f"policy.memory_headroom_fraction: expected a number in [0, 1), got {frac!r}")
    positive("policy.memory_budget_gb", policy.get("memory_budget_gb"))
    positive("policy.latency_target_ms", policy.get("latency_target_ms"))
    llm = policy.get("llm")
    if llm:
        for i, q in enumerate(llm["quant_order"]):
            if q.upper() not in BPW:
                errors.append(f"policy.llm.quant_order[{i}]: unknown GGUF type {q!r} (known: {', '.join(BPW)})")
        if not llm["quant_order"]:
            errors.append("policy.llm.quant_order: expected a non-empty list")
        for key in ("context_length", "min_context_length"):
            if key in llm and not 1 <= llm[key] <= MAX_CONTEXT_LENGTH:
                errors.append(f"policy.llm.{key}: expected an integer in [1, {MAX_CONTEXT_LENGTH}], got {llm[key]!r}")
        if llm.get("min_context_length", 1) > llm["context_length"]:
            errors.append(
                f"policy.llm.min_context_length: {llm['min_context_length']} is larger than "
                f"context_length {llm['context_length']}"
            )
    parity = policy.get("parity") or {}
    for prec, table in parity.items():
        if prec not in PARITY_PRECISIONS and prec not in BPW:  # GGUF types: their ppl_ratio_max (docs/gguf.md)
            errors.append(
                f"policy.parity.{prec}: unknown precision (expected one of {', '.join(PARITY_PRECISIONS)} "
                "or a GGUF type such as Q4_K_M)"
            )
            continue
        if not isinstance(table, dict):
            errors.append(f"policy.parity.{prec}: expected a mapping, got {type(table).__name__}")
            continue
        for key, value in table.items():
            if key not in PARITY_KEYS:
                errors.append(f"policy.parity.{prec}.{key}: unknown key (expected one of {', '.join(PARITY_KEYS)})")
            elif value is not None:
                positive(f"policy.parity.{prec}.{key}", value)


def validate_profile_data(data: Any, source: str) -> None:
    """Raise :class:`ProfileError` naming file, key and expected type (or range) for the first problems found."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    found = sorted(_validator().iter_errors(data), key=_schema_order)
    errors: list[str] = [_message(e) for e in found]
    if not errors:
        _check_ranges(data, errors)
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ProfileError(f"{source}: invalid profile: {errors[0]}{more}")


@dataclass(frozen=True)
class KernelSupport:
    """One row of a profile's ``kernels`` table (``flash_attention``, ``cuda_graphs``, ``fp8``, ...), as written:
    None where the row or the field is absent."""

    supported: bool | None = None
    recommended: bool | None = None
    source: str | None = None


@dataclass(frozen=True)
class LlmPolicy:
    """A profile's ``policy.llm`` (the GGUF planner's inputs), as written: None where not set."""

    context_length: int | None = None
    min_context_length: int | None = None
    quant_order: list[str] | None = None
    kv_type: str | None = None
    n_ubatch: int | None = None


@dataclass(frozen=True)
class Profile:
    """A validated device profile. ``data`` is the YAML mapping; typed accessors read what planners use."""

    name: str
    path: Path
    data: dict[str, Any] = field(repr=False)
    resolved_from: str | None = None  # the alias the user typed, if any

    @property
    def kind(self) -> str:
        return str(self.data["device"]["kind"])

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("jetson", "gpu")

    @property
    def _policy(self) -> dict[str, Any]:
        section: dict[str, Any] = self.data["policy"]
        return section

    @property
    def kernels(self) -> dict[str, Any]:
        section: dict[str, Any] = self.data["kernels"]
        return section

    @property
    def sm(self) -> str | None:
        sm = (self.data["device"].get("gpu") or {}).get("sm")
        return None if sm is None else str(sm)

    @property
    def _software(self) -> dict[str, Any]:
        section: dict[str, Any] = self.data["software"]
        return section

    @property
    def dla_cores(self) -> int:
        return int((self.data["device"].get("dla") or {}).get("cores", 0))

    # ------------------------------------------------------------------ typed accessors (policy, kernels, software)
    @property
    def preferred_formats(self) -> list[str]:
        """``policy.formats``: output formats in the profile's order of preference."""
        return list(self._policy["formats"])

    @property
    def precision_order(self) -> list[str]:
        """``policy.precision``: precisions, preferred first."""
        return list(self._policy["precision"])

    @property
    def execution_providers(self) -> list[str]:
        """``policy.execution_providers``: ONNX Runtime EPs, best first (as written; the CPU is not added)."""
        return list(self._policy.get("execution_providers") or [])

    def parity_overrides(self, precision: str) -> dict[str, Any]:
        """``policy.parity.<precision>``: threshold overrides ({} where none)."""
        table = (self._policy.get("parity") or {}).get(precision)
        return dict(table) if isinstance(table, dict) else {}

    @property
    def memory_headroom_fraction(self) -> float:
        return float(self._policy["memory_headroom_fraction"])

    @property
    def llm(self) -> LlmPolicy:
        """``policy.llm``."""
        d = self._policy.get("llm") or {}
        order = d.get("quant_order")
        return LlmPolicy(
            context_length=d.get("context_length"),
            min_context_length=d.get("min_context_length"),
            quant_order=list(order) if order else None,
            kv_type=d.get("kv_type"),
            n_ubatch=d.get("n_ubatch"),
        )

    def kernel(self, name: str) -> KernelSupport:
        """Row ``name`` of the ``kernels`` table."""
        row = self.kernels.get(name)
        if not isinstance(row, dict):
            return KernelSupport()
        return KernelSupport(
            supported=row.get("supported"), recommended=row.get("recommended"), source=row.get("source")
        )

    def software_version(self, name: str) -> str | None:
        """``software.<name>`` (``tensorrt``, ``l4t``, ``jetpack``, ``cuda``), or ``software.source``."""
        value = self._software.get(name)
        return None if value is None else str(value)

    @property
    def cpu_cores(self) -> int | None:
        """``device.cpu.cores`` (None where the profile lists no core count)."""
        cores = (self.data["device"].get("cpu") or {}).get("cores")
        return int(cores) if cores else None

    @property
    def unified_memory(self) -> bool:
        """``device.memory.unified``: CPU and GPU share one memory (a Jetson, a CPU host); False where not set."""
        return bool((self.data["device"].get("memory") or {}).get("unified"))

    @property
    def latency_target_ms(self) -> float | None:
        """``policy.latency_target_ms`` (the profiler's latency budget), None where not set."""
        value = self._policy.get("latency_target_ms")
        return None if value is None else float(value)

    # ------------------------------------------------------------------ typed accessors (device identity, listing)
    @property
    def arch(self) -> str:
        """``device.arch`` (``x86_64``, ``aarch64``)."""
        return str(self.data["device"]["arch"])

    @property
    def platform(self) -> str | None:
        """``device.platform`` (a Jetson's SoC, ``tegra234``), None where absent."""
        value = self.data["device"].get("platform")
        return None if value is None else str(value)

    @property
    def module_part_number(self) -> str | None:
        """``device.module_part_number`` (a Jetson module's, ``p3767-0003``), None where absent."""
        value = self.data["device"].get("module_part_number")
        return None if value is None else str(value)

    @property
    def gpu_name(self) -> str | None:
        """``device.gpu.name`` (as NVML reports it), None where the profile names no GPU."""
        value = (self.data["device"].get("gpu") or {}).get("name")
        return None if value is None else str(value)

    @property
    def cpu_isa(self) -> list[str]:
        """``device.cpu.isa``: the CPU features the profile assumes ([] where none are listed)."""
        return list((self.data["device"].get("cpu") or {}).get("isa") or [])

    @property
    def display_name(self) -> str:
        """``display_name``: the device as people call it."""
        return str(self.data["display_name"])

    @property
    def power_modes(self) -> list[str]:
        """``device.power_modes.value``: the board's power modes (nvpmodel names; [] where none are listed)."""
        node = (self.data["device"].get("power_modes") or {}).get("value")
        return [str(m) for m in node] if isinstance(node, list) else []

    @property
    def aliases(self) -> list[str]:
        """``aliases``: other names the profile resolves from."""
        return list(self.data.get("aliases") or [])

    def figure(self, dotted: str) -> float | None:
        """Value of a figure by dotted path (``device.memory.bandwidth_gbps``), or None when absent."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        value: float | None = node["value"] if isinstance(node, dict) and "value" in node else node
        return value

    def memory_budget_gb(self) -> float | None:
        """Memory the model may use: explicit policy budget, else usable (or total) memory minus headroom."""
        explicit = self._policy.get("memory_budget_gb")
        if explicit is not None:
            return float(explicit)
        usable = self.figure("device.memory.usable_gb") or self.figure("device.memory.total_gb")
        if usable is None:
            return None
        return round(float(usable) * (1.0 - float(self._policy["memory_headroom_fraction"])), 2)

    def with_figure(self, dotted: str, value: float, source: str, name: str | None = None) -> Profile:
        """A copy of this profile with one sourced figure set (``device.memory.bandwidth_gbps`` of a power mode
        the profile does not describe, for a prediction in that mode); the copy is named ``name`` if given."""
        import copy

        data = copy.deepcopy(self.data)
        parts = dotted.split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = {"value": value, "source": source}
        return dataclasses.replace(self, name=name or self.name, data=data)

    def as_written(self) -> dict[str, Any]:
        """A deep copy of the YAML mapping, for tools that write a new profile from this one (``profiler detect
        --write-profile``); planners and the runtime read the typed views above."""
        import copy

        return copy.deepcopy(self.data)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display_name": self.data["display_name"],
            "aliases": self.data.get("aliases", []),
            "kind": self.kind,
            "arch": self.data["device"]["arch"],
            "sm": self.sm,
            "memory_gb": self.figure("device.memory.total_gb"),
            "bandwidth_gbps": self.figure("device.memory.bandwidth_gbps"),
            "fp16_tflops": self.figure("device.peak.fp16_tflops"),
            "tensorrt": self._software.get("tensorrt"),
            "dla_cores": self.dla_cores,
            "formats": self._policy["formats"],
            "precision": self._policy["precision"],
            "path": str(self.path),
        }


def parity_thresholds(profile: Profile, precision: str) -> dict[str, Any]:
    """The default thresholds for ``precision`` with the profile's ``policy.parity`` overrides applied."""
    base: dict[str, Any] = dict(DEFAULT_PARITY.get(precision, DEFAULT_PARITY["fp32"]))
    base.update(profile.parity_overrides(precision))
    return base


def execution_provider_chain(profile: Profile) -> list[str]:
    """The profile's execution providers, best first, with the CPU always last."""
    chain = profile.execution_providers
    if "CPUExecutionProvider" not in chain:
        chain.append("CPUExecutionProvider")
    return chain


PROFILES_PACKAGE = "edgesdk.profiles_data"  # the top-level profiles/ directory, mapped by setup.py


def profiles_dir() -> Path:
    """Where the shipped profiles live: ``$EDGESDK_PROFILES_DIR`` if set, else the package data.

    The YAML files are in the repository's top-level ``profiles/``; the wheel ships them as the
    package ``edgesdk.profiles_data`` and an editable install maps that package onto the same
    directory, so :mod:`importlib.resources` finds them in both.
    """
    env = os.environ.get("EDGESDK_PROFILES_DIR")
    if env:
        return Path(env)
    try:
        return Path(str(files(PROFILES_PACKAGE)))
    except ModuleNotFoundError as exc:
        # An editable install made before the profiles became package data does not map the package
        # yet (`pip install -e .` again fixes it); a source checkout still has the directory.
        checkout = Path(__file__).resolve().parent.parent / "profiles"
        if (checkout / "__init__.py").is_file():
            return checkout
        raise ProfileError(
            f"the device profiles are not installed (no package {PROFILES_PACKAGE})", hint="reinstall edgesdk"
        ) from exc


#: A profile file's size and YAML nodes (scalars, sequences, mappings), checked before the tree is built: the
#: shipped profiles are a few KiB and a few hundred nodes; a 3,000,000-item list took over 120 s to load and
#: check, and aliases can make a small file expand without end ("billion laughs").
MAX_PROFILE_BYTES = 1 << 20
MAX_PROFILE_NODES = 100_000


def _check_yaml_bounds(text: str, path: Path) -> None:
    """ProfileError for YAML with an alias (``*name``: profiles need none, and aliases are how a small file
    expands without end) or more than :data:`MAX_PROFILE_NODES` nodes; a parse error is left to the loader."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    nodes = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                raise ProfileError(
                    f"{path}: line {mark.line + 1}: YAML aliases ('*{event.anchor}') are not allowed in a profile"
                )
            if isinstance(event, yaml.ScalarEvent | yaml.SequenceStartEvent | yaml.MappingStartEvent):
                nodes += 1
                if nodes > MAX_PROFILE_NODES:
                    raise ProfileError(f"{path}: more than {MAX_PROFILE_NODES:,} YAML nodes: not a device profile")
    except yaml.YAMLError:
        return


def load_profile_file(path: Path, resolved_from: str | None = None) -> Profile:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_PROFILE_BYTES + 1)
    except FileNotFoundError as exc:
        raise ProfileError(f"profile file not found: {path}") from exc
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{path}: over {MAX_PROFILE_BYTES // 1024} KiB: not a device profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save the profile as UTF-8"
        ) from None
    _check_yaml_bounds(text, path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ProfileError(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    validate_profile_data(data, str(path))
    return Profile(name=data["name"], path=path, data=data, resolved_from=resolved_from)


def list_profiles(directory: Path | None = None) -> list[Profile]:
    directory = directory or profiles_dir()
    return [load_profile_file(p) for p in sorted(directory.glob("*.yaml"))]


def _alias_table(profiles: list[Profile]) -> dict[str, Profile]:
    table: dict[str, Profile] = {}
    for p in profiles:
        table[p.name] = p
        for alias in p.data.get("aliases", []):
            table.setdefault(alias, p)
    return table


def resolve_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Name, alias or path to a YAML file -> validated :class:`Profile`.

    Unknown names raise :class:`ProfileError` suggesting the closest known names.
    """
    text = str(name_or_path)
    candidate = Path(text)
    if text.endswith((".yaml", ".yml")) or os.sep in text or candidate.is_file():
        return load_profile_file(candidate)
    profiles = list_profiles()
    table = _alias_table(profiles)
    key = text.strip().lower()
    if key in table:
        p = table[key]
        return Profile(p.name, p.path, p.data, resolved_from=text if key != p.name else None)
    close = difflib.get_close_matches(key, list(table), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run `edgesdk profiles list`"
    raise ProfileError(f"unknown device profile {text!r}", hint=hint)
