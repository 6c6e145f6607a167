# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check traces``: check OTLP/JSON telemetry against GenAI semantic conventions v1.41.1.

Rules come from ``edgesdk/data/semconv/gen_ai_v1.41.1.yaml``. Findings carry Weaver's levels:
``violation`` (fails CI), ``improvement`` and ``information``. Identical findings are grouped
with a count; the first occurrence gives the file line, trace and span id.

The file is checked as it is read, one export request at a time: what stays in memory is the
grouped findings and, per distinct span (trace id + span id), its name (to check a build stage's parent,
which an SDK exports after its children), per GenAI span its start and end (for inference-stage
children), per stage span a small reference, not the spans themselves. Both are bounded, so a file of
any size (a gzip bomb of repeated lines included) is checked in bounded memory: at most
``MAX_TRACKED_SPANS`` distinct spans are kept for the parent checks (past that, a parent that was not
kept is not reported missing, and an ``information`` finding says the checks were partial), a span
seen again under the same ids is the same span, and at most ``MAX_FINDING_GROUPS`` distinct findings
are listed (further ones are counted per level and rule).

Inference-stage spans (``edgesdk.inference.stage`` set: ``preprocess``, ``encode``, ``prefill``,
``decode``) are children of a request's GenAI span, not GenAI operations: they are held to their own
rules (known stage, name = stage, INTERNAL, no ``gen_ai.*`` attribute, non-negative duration, a
GenAI parent in the same trace, within the parent's time span), all violations.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from edgesdk.tracecheck.otlp_json import MAX_BYTES, Attr, Metric, Span, TelemetryFile, iter_otlp_json

LEVELS = ("violation", "improvement", "information")
_MASK64 = (1 << 64) - 1
RULES_FILE = "gen_ai_v1.41.1.yaml"
# Distinct spans kept for the parent checks (~150-300 bytes each: a few hundred MB at most), and distinct
# findings listed (further ones are folded into one group per level and rule).
MAX_TRACKED_SPANS = 1_000_000
MAX_FINDING_GROUPS = 10_000
# What is kept of a span's name and ids: names are compared with short convention names and quoted in
# messages; ids longer than real ones (32 and 16 hex digits) are kept as a digest.
_NAME_CHARS = 128
_ID_CHARS = 64


@dataclass
class Finding:
    level: str
    rule: str
    message: str
    span: str = ""
    attribute: str = ""
    line: int = 0
    trace_id: str = ""
    span_id: str = ""
    count: int = 1


@lru_cache(maxsize=1)
def load_rules() -> dict:
    text = (resources.files("edgesdk") / "data" / "semconv" / RULES_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@dataclass(slots=True)
class _StageRef:
    """What a parent check needs of a stage span (checked once the whole file is read)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    parent_key: str
    start_ns: int
    end_ns: int
    line: int


def _stage_ref(span: Span) -> _StageRef:
    return _StageRef(
        sys.intern(_short(span.name, _NAME_CHARS)),
        _short(span.trace_id, _ID_CHARS),
        _short(span.span_id, _ID_CHARS),
        _short(span.parent_span_id, _ID_CHARS),
        _span_key(span.trace_id, span.parent_span_id),
        span.start_ns,
        span.end_ns,
        span.line,
    )


class _Spans:
    """What the parent checks keep, per distinct span (trace id + span id): its name, a GenAI span's
    start and end, a stage span's reference. At most ``limit`` distinct spans are kept; a span seen again
    under the same ids is the same span (kept once, the first time)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.names: dict[str, str] = {}
        # a GenAI span's start and end packed in one int (start << 64 | end): a stage's parent may come
        # before or after it in the file, so every GenAI span is kept, compactly
        self.genai: dict[str, int] = {}
        self.build_stages: dict[str, _StageRef] = {}
        self.inference_stages: dict[str, _StageRef] = {}
        self.dropped = 0  # spans not kept: past the limit

    def keep(self, span: Span) -> str | None:
        """The span's key, or None when it is new and the limit is reached."""
        key = _span_key(span.trace_id, span.span_id)
        if key not in self.names:
            if len(self.names) >= self.limit:
                self.dropped += 1
                return None
            self.names[key] = sys.intern(_short(span.name, _NAME_CHARS))
        return key


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _span_key(trace_id: str, span_id: str) -> str:
    """The key of a span in the parent checks: its trace and span id (a digest when they are longer than
    real ids, so a file of huge ids cannot grow the tables by their length)."""
    key = trace_id + "/" + span_id
    if len(key) <= 2 * _ID_CHARS:
        return key
    return "#" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class _Collector:
    def __init__(self, max_groups: int = MAX_FINDING_GROUPS) -> None:
        self.groups: dict[tuple, Finding] = {}
        self.max_groups = max_groups

    def add(
        self,
        level: str,
        rule: str,
        message: str,
        *,
        span: Span | _StageRef | None = None,
        name: str = "",
        attribute: str = "",
        line: int = 0,
    ) -> None:
        span_name = _short(span.name if span is not None else name, _NAME_CHARS)
        message, attribute = _short(message, 1000), _short(attribute, _NAME_CHARS)
        key = (level, rule, span_name, attribute, message)
        found = self.groups.get(key)
        if found is None and len(self.groups) >= self.max_groups:
            # a file whose findings differ span by span (unique names or values): list no more groups,
            # count the rest under their level and rule so the verdict and totals stay right
            span_name, attribute = "", ""
            message = f"further distinct {rule} findings (the report lists {self.max_groups} distinct findings)"
            key = (level, rule, span_name, attribute, message)
            found = self.groups.get(key)
        if found is not None:
            found.count += 1
            return
        self.groups[key] = Finding(
            level,
            rule,
            message,
            span_name,
            attribute,
            span.line if span is not None else line,
            _short(span.trace_id, _ID_CHARS) if span is not None else "",
            _short(span.span_id, _ID_CHARS) if span is not None else "",
        )

    def findings(self) -> list[Finding]:
        order = {level: i for i, level in enumerate(LEVELS)}
        return sorted(self.groups.values(), key=lambda f: (order[f.level], f.rule, f.span, f.attribute))


def _type_ok(expected: str, attr: Attr) -> bool:
    if expected == "any":
        return True
    if attr.type == expected:
        return True
    # An empty array carries no element type; an int is an exact double.
    return attr.type == "[]" and expected.endswith("[]")


def _is_true(attr: Attr | None) -> bool:
    return attr is not None and (attr.value is True or str(attr.value).lower() in ("true", "1"))


def _check_attribute_names(span: Span, rules: dict, out: _Collector) -> None:
    registry = rules["attributes"]
    deprecated = rules["deprecated_attributes"]
    patterns = [(re.compile(p["pattern"]), p["replacement"]) for p in rules["deprecated_attribute_patterns"]]
    content = set(rules["content_attributes"])
    content_patterns = [re.compile(p) for p in rules["content_attribute_patterns"]]
    opted_in = any(_is_true(span.attributes.get(m)) or _is_true(span.resource.get(m)) for m in rules["opt_in_markers"])
    for key, attr in span.attributes.items():
        if key in content or any(p.match(key) for p in content_patterns):
            if opted_in:
                out.add(
                    "information",
                    "content_captured",
                    f"{key} carries content (capture opted in)",
                    span=span,
                    attribute=key,
                )
            else:
                out.add(
                    "violation",
                    "content_without_opt_in",
                    f"{key} carries prompt/output content but no opt-in marker "
                    f"({', '.join(rules['opt_in_markers'])}) is set",
                    span=span,
                    attribute=key,
                )
        if key in deprecated:
            out.add("violation", "deprecated", f"{key} is deprecated; use {deprecated[key]}", span=span, attribute=key)
            continue
        replacement = next((r for p, r in patterns if p.match(key)), None)
        if replacement:
            out.add("violation", "deprecated", f"{key} is a legacy name; use {replacement}", span=span, attribute=key)
            continue
        expected = registry.get(key)
        if expected is None:
            if key.startswith("gen_ai."):
                out.add(
                    "improvement",
                    "not_in_registry",
                    f"{key} is not defined in semantic conventions {rules['semconv_version']}",
                    span=span,
                    attribute=key,
                )
            continue
        if not _type_ok(expected, attr):
            level = "improvement" if (expected == "double" and attr.type == "int") else "violation"
            out.add(level, "type_mismatch", f"{key} should be {expected}, found {attr.type}", span=span, attribute=key)
        enum = rules["enums"].get(key)
        if enum is not None and attr.type == "string" and attr.value not in enum:
            if attr.value in rules["custom_enum_values"].get(key, []):
                out.add(
                    "information",
                    "custom_enum_variant",
                    f"{key}={attr.value!r} is an edgesdk custom value",
                    span=span,
                    attribute=key,
                )
            else:
                level = rules["enum_levels"].get(key, "information")
                out.add(
                    level,
                    "undefined_enum_variant",
                    f"{key}={attr.value!r} is not a defined value",
                    span=span,
                    attribute=key,
                )


def _expected_name(template: str, attrs: dict[str, Attr]) -> str:
    parts = []
    for token in template.split(" "):
        match = re.fullmatch(r"\{([^}]+)\}", token)
        if not match:
            parts.append(token)
            continue
        attr = attrs.get(match.group(1))
        if attr is not None and attr.value not in (None, ""):
            parts.append(str(attr.value))
    return " ".join(parts)


def _require_error_type(span: Span, failed: bool, when: str, out: _Collector) -> None:
    """A span that failed must say how: ``error.type`` (``when``: where the message says it is required)."""
    if failed and "error.type" not in span.attributes:
        out.add("violation", "missing_attribute", f"error.type is required {when}", span=span, attribute="error.type")


def _value(span: Span, key: str):
    attr = span.attributes.get(key)
    return None if attr is None else attr.value


def _check_tokens(span: Span, out: _Collector) -> None:
    numbers: dict[str, int] = {}
    for key, attr in span.attributes.items():
        # an "int" attribute's value is always an int (otlp_json); isinstance tells mypy so
        if (
            attr.type == "int"
            and isinstance(attr.value, int)
            and (key.startswith("gen_ai.usage.") or key.startswith("llm.usage."))
        ):
            numbers[key] = attr.value
            if attr.value < 0:
                out.add(
                    "violation", "token_count_negative", f"{key} is negative ({attr.value})", span=span, attribute=key
                )
    inp = numbers.get("gen_ai.usage.input_tokens", numbers.get("gen_ai.usage.prompt_tokens"))
    outp = numbers.get("gen_ai.usage.output_tokens", numbers.get("gen_ai.usage.completion_tokens"))
    checks = []
    reasoning = numbers.get("gen_ai.usage.reasoning.output_tokens")
    if reasoning is not None and outp is not None:
        checks.append(
            (
                reasoning > outp,
                "gen_ai.usage.reasoning.output_tokens",
                f"reasoning tokens ({reasoning}) exceed output tokens ({outp})",
            )
        )
    cached = (numbers.get("gen_ai.usage.cache_read.input_tokens") or 0) + (
        numbers.get("gen_ai.usage.cache_creation.input_tokens") or 0
    )
    if cached and inp is not None:
        checks.append(
            (cached > inp, "gen_ai.usage.input_tokens", f"cached input tokens ({cached}) exceed input tokens ({inp})")
        )
    max_tokens = _value(span, "gen_ai.request.max_tokens")
    if isinstance(max_tokens, int) and outp is not None and max_tokens > 0:
        checks.append(
            (
                outp > max_tokens,
                "gen_ai.usage.output_tokens",
                f"output tokens ({outp}) exceed gen_ai.request.max_tokens ({max_tokens})",
            )
        )
    for total_key in ("gen_ai.usage.total_tokens", "llm.usage.total_tokens"):
        total = numbers.get(total_key)
        if total is not None and inp is not None and outp is not None:
            checks.append((total != inp + outp, total_key, f"{total_key} ({total}) != input ({inp}) + output ({outp})"))
    ttfc = _value(span, "gen_ai.response.time_to_first_chunk")
    if isinstance(ttfc, float | int) and span.end_ns > span.start_ns:
        duration = (span.end_ns - span.start_ns) / 1e9
        checks.append(
            (
                ttfc < 0 or ttfc > duration * 1.001 + 1e-6,
                "gen_ai.response.time_to_first_chunk",
                f"time to first chunk ({ttfc:.6g} s) is outside the span (0..{duration:.6g} s)",
            )
        )
    for failed, key, message in checks:
        if failed:
            out.add(
                "violation",
                "token_count_inconsistent" if "token" in key else "value_inconsistent",
                message,
                span=span,
                attribute=key,
            )


def _check_genai_span(span: Span, rules: dict, out: _Collector) -> None:
    _check_attribute_names(span, rules, out)
    ours = rules["edgesdk_inference"]
    if span.scope == ours["scope"]:
        for key in ours["expected"]:
            if key not in span.attributes:
                out.add(
                    "improvement",
                    "edgesdk_convention",
                    f"edgesdk inference spans carry {key}",
                    span=span,
                    attribute=key,
                )
    for event in span.events:
        replacement = rules["deprecated_events"].get(event.name)
        if replacement:
            out.add(
                "violation",
                "deprecated",
                f"event {event.name} is deprecated; use {replacement}",
                span=span,
                attribute=event.name,
            )
    operation = _value(span, "gen_ai.operation.name")
    spec = rules["operations"].get(operation) if isinstance(operation, str) else None
    if operation is None:
        out.add(
            "violation",
            "missing_attribute",
            "gen_ai.operation.name is required on GenAI spans",
            span=span,
            attribute="gen_ai.operation.name",
        )
    if spec is None:
        # Unknown or missing operation: still hold the span to what every inference operation requires.
        if "gen_ai.provider.name" not in span.attributes:
            out.add(
                "violation",
                "missing_attribute",
                "gen_ai.provider.name is required on GenAI spans",
                span=span,
                attribute="gen_ai.provider.name",
            )
        allowed = sorted({kind for op in rules["operations"].values() for kind in op["kinds"]})
        if span.kind not in allowed:
            out.add(
                "violation",
                "span_kind_unexpected",
                f"GenAI spans should be {' or '.join(allowed)}, found {span.kind}",
                span=span,
            )
        _check_tokens(span, out)
        return
    for key in spec["required"]:
        if key not in span.attributes and key != "gen_ai.operation.name":
            out.add(
                "violation", "missing_attribute", f"{key} is required for {operation} spans", span=span, attribute=key
            )
    status_code = _value(span, "http.response.status_code")
    refused = isinstance(status_code, int) and status_code >= 400  # a server refused it: no usage to report
    for key in spec["recommended"]:
        if key not in span.attributes and not refused:
            out.add(
                "improvement",
                "recommended_attribute_missing",
                f"{key} is recommended for {operation}",
                span=span,
                attribute=key,
            )
    _require_error_type(span, span.status == "ERROR", "when the operation failed", out)
    if "server.address" in span.attributes and "server.port" not in span.attributes:
        out.add(
            "violation",
            "missing_attribute",
            "server.port is required when server.address is set",
            span=span,
            attribute="server.port",
        )
    if _value(span, "gen_ai.request.choice.count") == 1:
        out.add(
            "information",
            "conditional_attribute_unneeded",
            "gen_ai.request.choice.count is only required when != 1",
            span=span,
            attribute="gen_ai.request.choice.count",
        )
    expected = _expected_name(spec["name"], span.attributes)
    if span.name != expected:
        out.add("violation", "span_name_format", f"span name should be {expected!r} ({spec['name']})", span=span)
        if (
            " " in span.name
            and "gen_ai.request.model" not in span.attributes
            and "{gen_ai.request.model}" in spec["name"]
        ):
            out.add(
                "violation",
                "missing_attribute",
                "gen_ai.request.model is conditionally required (the model is known: it is in the span name)",
                span=span,
                attribute="gen_ai.request.model",
            )
    http = rules["http_server_span"]
    if span.kind == "SERVER" and http["marker"] in span.attributes:
        _check_http_server_span(span, http, out)
    elif span.kind not in spec["kinds"]:
        hint = (
            f" (a SERVER span must be an HTTP server span: {http['marker']} missing)" if span.kind == "SERVER" else ""
        )
        out.add(
            "violation",
            "span_kind_unexpected",
            f"{operation} spans should be {' or '.join(spec['kinds'])}, found {span.kind}{hint}",
            span=span,
        )
    _check_tokens(span, out)


def _check_http_server_span(span: Span, http: dict, out: _Collector) -> None:
    """A GenAI SERVER span is an HTTP server span too: its attributes and status by the HTTP conventions."""
    for key in http["required"]:
        if key not in span.attributes:
            out.add(
                "violation", "missing_attribute", f"{key} is required on HTTP server spans", span=span, attribute=key
            )
    for key in http["recommended"]:
        if key not in span.attributes and not (key == "http.response.status_code" and span.status == "ERROR"):
            out.add(
                "improvement",
                "recommended_attribute_missing",
                f"{key} is recommended on HTTP server spans",
                span=span,
                attribute=key,
            )
    for key, expected in http["attributes"].items():
        attr = span.attributes.get(key)
        if attr is not None and not _type_ok(expected, attr):
            out.add(
                "violation",
                "attribute_type_mismatch",
                f"{key} should be {expected}, found {attr.type}",
                span=span,
                attribute=key,
            )
    method = _value(span, "http.request.method")
    if isinstance(method, str) and method not in http["methods"]:
        out.add(
            "violation",
            "undefined_enum_variant",
            f"http.request.method={method!r} is not a known method (use _OTHER)",
            span=span,
            attribute="http.request.method",
        )
    status = _value(span, "http.response.status_code")
    if isinstance(status, int) and not 100 <= status <= 599:
        out.add(
            "violation",
            "value_inconsistent",
            f"http.response.status_code {status} is not an HTTP status",
            span=span,
            attribute="http.response.status_code",
        )
    elif (
        isinstance(status, int)
        and 400 <= status < 500
        and span.status == "ERROR"
        and _value(span, "error.type") in (None, str(status))
    ):
        out.add(
            "violation",
            "span_status",
            f"a SERVER span answering {status} must leave its status unset "
            "(HTTP conventions: 4xx is the client's error)",
            span=span,
            attribute="http.response.status_code",
        )
    elif isinstance(status, int) and status >= 500 and span.status != "ERROR":
        out.add(
            "improvement",
            "span_status",
            f"a SERVER span answering {status} should have status ERROR",
            span=span,
            attribute="http.response.status_code",
        )


def _check_build_span(
    span: Span, rules: dict, out: _Collector, stages: dict[str, _StageRef] | None, kept_as: str | None
) -> int:
    """Checks one span against the build conventions; a stage whose parent is to be checked goes to
    ``stages`` under ``kept_as`` (see :func:`_check_stage_parents`; None: not kept). Returns 1 for a build or
    stage span."""
    conv = rules["edgesdk_build"]
    for event in span.events:
        if event.name == conv["fallback_event"]:
            for key in conv["fallback_required"]:
                if key not in event.attributes:
                    out.add(
                        "violation", "build_convention", f"{event.name} event lacks {key}", span=span, attribute=key
                    )
    if span.name == conv["root_span"]:
        for key in conv["root_required"]:
            if key not in span.attributes:
                out.add("violation", "build_convention", f"build span lacks {key}", span=span, attribute=key)
        if span.parent_span_id:
            out.add(
                "violation", "build_convention", "a build span must be a trace root (one trace per build)", span=span
            )
        return 1
    if not span.name.startswith(conv["stage_prefix"]) or span.name.count(".") < 2:
        return 0
    stage = span.name[len(conv["stage_prefix"]) :]
    for key in conv["stage_required"]:
        if key not in span.attributes:
            out.add("violation", "build_convention", f"build stage span lacks {key}", span=span, attribute=key)
    if _value(span, "edgesdk.build.stage") not in (None, stage):
        out.add(
            "violation",
            "build_convention",
            f"edgesdk.build.stage does not match the span name ({stage})",
            span=span,
            attribute="edgesdk.build.stage",
        )
    if stage not in conv["stages"]:
        out.add("information", "build_stage_unknown", f"stage {stage!r} is not one of {conv['stages']}", span=span)
    outcome = _value(span, "edgesdk.build.stage.outcome")
    if outcome is not None and outcome not in conv["outcomes"]:
        out.add(
            "violation",
            "build_convention",
            f"outcome {outcome!r} is not one of {conv['outcomes']}",
            span=span,
            attribute="edgesdk.build.stage.outcome",
        )
    _require_error_type(span, outcome == "error", "on a failed stage", out)
    if not span.parent_span_id:
        out.add("violation", "build_convention", "a build stage span must have the build span as parent", span=span)
    elif stages is not None and kept_as is not None and kept_as not in stages:
        stages[kept_as] = _stage_ref(span)
    return 1


def _check_stage_parents(stages: dict[str, _StageRef], names: dict[str, str], rules: dict, out: _Collector) -> None:
    root = rules["edgesdk_build"]["root_span"]
    for ref in stages.values():
        parent = names.get(ref.parent_key)
        if parent is not None and parent != root:
            out.add(
                "violation", "build_convention", f"a build stage's parent should be {root}, found {parent!r}", span=ref
            )


def _check_inference_stage(
    span: Span, rules: dict, out: _Collector, stages: dict[str, _StageRef], kept_as: str | None
) -> None:
    conv = rules["edgesdk_inference_stage"]
    marker = conv["marker"]
    stage = _value(span, marker)

    def bad(message: str, attribute: str = "") -> None:
        out.add("violation", "inference_stage", message, span=span, attribute=attribute)

    if stage not in conv["stages"]:
        bad(f"{marker}={stage!r} is not a known stage ({', '.join(conv['stages'])})", marker)
    elif span.name != stage:
        bad(f"an inference-stage span is named after its stage ({stage!r}), found {span.name!r}", marker)
    if span.kind not in conv["kinds"]:
        bad(f"inference-stage spans are {' or '.join(conv['kinds'])}, found {span.kind}")
    for key in span.attributes:
        if key.startswith("gen_ai."):
            bad(
                f"{key} on an inference-stage span: stages are not GenAI operations (the request span "
                "carries the gen_ai.* attributes)",
                key,
            )
    tokens = _value(span, conv["tokens"])
    if isinstance(tokens, int | float) and tokens < 0:
        bad(f"{conv['tokens']} is negative ({tokens})", conv["tokens"])
    if span.end_ns < span.start_ns:
        bad(f"the stage ends before it starts ({(span.end_ns - span.start_ns) / 1e9:.6g} s)")
    _require_error_type(span, span.status == "ERROR", "when a stage failed", out)
    if not span.parent_span_id:
        bad("an inference-stage span must be a child of its request's GenAI span (it has no parent)")
        return
    if kept_as is not None and kept_as not in stages:
        stages[kept_as] = _stage_ref(span)


def _check_inference_stage_parents(
    stages: dict[str, _StageRef],
    genai: dict[str, int],
    names: dict[str, str],
    out: _Collector,
    *,
    partial: bool = False,
) -> None:
    for ref in stages.values():
        window = genai.get(ref.parent_key)
        if window is None:
            other = names.get(ref.parent_key)
            if other is None and partial:
                continue  # the parent may be one of the spans not kept
            message = (
                f"the parent of an inference-stage span must be a GenAI span, found {other!r}"
                if other is not None
                else f"the parent span {ref.parent_span_id} is not in trace {ref.trace_id} of this file "
                "(an inference stage needs its request's GenAI span)"
            )
            out.add("violation", "inference_stage", message, span=ref)
            continue
        start, end = window >> 64, window & _MASK64
        if ref.start_ns < start or ref.end_ns > end:
            out.add(
                "violation",
                "inference_stage",
                f"the stage runs outside its request's span ({(ref.start_ns - start) / 1e9:+.6g} s .. "
                f"{(ref.end_ns - end) / 1e9:+.6g} s relative to its start .. end)",
                span=ref,
            )


def _check_metrics(metrics: list[Metric], rules: dict, out: _Collector) -> None:
    known = rules["metrics"]
    for metric in metrics:
        if not metric.name.startswith("gen_ai."):
            continue
        spec = known.get(metric.name)
        if spec is None:
            out.add(
                "improvement",
                "not_in_registry",
                f"metric {metric.name} is not defined",
                name=metric.name,
                line=metric.line,
            )
            continue
        if metric.unit != spec["unit"]:
            out.add(
                "violation",
                "metric_unit_mismatch",
                f"unit should be {spec['unit']!r}, found {metric.unit!r}",
                name=metric.name,
                line=metric.line,
            )
        for point in metric.points:
            if point.bounds is not None and [round(b, 9) for b in point.bounds] != [
                round(float(b), 9) for b in spec["buckets"]
            ]:
                out.add(
                    "improvement",
                    "metric_buckets_not_advised",
                    "histogram buckets differ from the advised ones",
                    name=metric.name,
                    line=metric.line,
                )
            for key in rules["metric_required"] + spec.get("required", []):
                if key not in point.attributes:
                    out.add(
                        "violation",
                        "missing_attribute",
                        f"{key} is required on {metric.name}",
                        name=metric.name,
                        attribute=key,
                        line=metric.line,
                    )
            for key, attr in point.attributes.items():
                if key in rules["deprecated_attributes"]:
                    out.add(
                        "violation",
                        "deprecated",
                        f"{key} is deprecated; use {rules['deprecated_attributes'][key]}",
                        name=metric.name,
                        attribute=key,
                        line=metric.line,
                    )
                enum = rules["enums"].get(key)
                if enum is not None and attr.value not in enum + rules["custom_enum_values"].get(key, []):
                    out.add(
                        rules["enum_levels"].get(key, "information"),
                        "undefined_enum_variant",
                        f"{key}={attr.value!r} is not a defined value",
                        name=metric.name,
                        attribute=key,
                        line=metric.line,
                    )


@dataclass
class Report:
    path: str
    spans: int
    genai_spans: int
    build_spans: int
    metrics: int
    findings: list[Finding]
    stage_spans: int = 0  # inference-stage child spans (edgesdk.inference.stage)

    def count(self, level: str) -> int:
        return sum(f.count for f in self.findings if f.level == level)

    def fails(self, fail_on: str = "violation") -> bool:
        limit = LEVELS.index(fail_on)
        return any(LEVELS.index(f.level) <= limit for f in self.findings)

    def to_dict(self, fail_on: str = "violation") -> dict:
        return {
            "file": self.path,
            "semconv_version": load_rules()["semconv_version"],
            "conforming": not self.fails(fail_on),
            "fail_on": fail_on,
            "summary": {
                "spans": self.spans,
                "genai_spans": self.genai_spans,
                "build_spans": self.build_spans,
                "stage_spans": self.stage_spans,
                "metrics": self.metrics,
                **{level: self.count(level) for level in LEVELS},
            },
            "findings": [asdict(f) for f in self.findings],
        }


def _is_genai(span: Span, rules: dict) -> bool:
    if any(key.startswith("gen_ai.") for key in span.attributes):
        return True
    return any(event.name in rules["deprecated_events"] for event in span.events)


def check_telemetry(
    data: TelemetryFile | Iterable[TelemetryFile],
    path: str = "",
    *,
    max_tracked_spans: int = MAX_TRACKED_SPANS,
    max_finding_groups: int = MAX_FINDING_GROUPS,
) -> Report:
    """Check a parsed file, or the parts :func:`~edgesdk.tracecheck.otlp_json.iter_otlp_json` yields.

    Memory is bounded whatever the input: ``max_tracked_spans`` distinct spans kept for the parent
    checks, ``max_finding_groups`` distinct findings listed (see the module's docstring)."""
    rules = load_rules()
    out = _Collector(max_finding_groups)
    parts = [data] if isinstance(data, TelemetryFile) else data
    kept = _Spans(max_tracked_spans)
    marker = rules["edgesdk_inference_stage"]["marker"]
    spans = genai = builds = metrics = stage_spans = 0
    for part in parts:
        path = path or part.path
        for span in part.spans:
            spans += 1
            key = kept.keep(span)
            if marker in span.attributes:
                stage_spans += 1
                _check_inference_stage(span, rules, out, kept.inference_stages, key)
            elif _is_genai(span, rules):
                genai += 1
                if key is not None and key not in kept.genai:
                    kept.genai[key] = (max(span.start_ns, 0) << 64) | (max(span.end_ns, 0) & _MASK64)
                _check_genai_span(span, rules, out)
            builds += _check_build_span(span, rules, out, kept.build_stages, key)
        metrics += len(part.metrics)
        _check_metrics(part.metrics, rules, out)
    _check_stage_parents(kept.build_stages, kept.names, rules, out)
    _check_inference_stage_parents(kept.inference_stages, kept.genai, kept.names, out, partial=bool(kept.dropped))
    if kept.dropped:
        out.add(
            "information",
            "parent_checks_partial",
            f"more than {kept.limit:,} distinct spans: the parent checks (build stage -> build span, "
            f"inference stage -> GenAI span) covered the first {kept.limit:,}; {kept.dropped:,} spans were "
            "not kept for them",
        )
    if not genai and not builds:
        out.add("information", "no_genai_spans", "no GenAI or edgesdk build spans in the file")
    return Report(path, spans, genai, builds, metrics, out.findings(), stage_spans)


def check_trace_file(
    path: str | Path,
    *,
    max_bytes: int = MAX_BYTES,
    max_tracked_spans: int = MAX_TRACKED_SPANS,
    max_finding_groups: int = MAX_FINDING_GROUPS,
) -> Report:
    """Read and check one file as a stream, in bounded memory. Raises TraceFileError (exit 1) when it is
    not readable OTLP/JSON or holds more than ``max_bytes`` of (decompressed) text."""
    return check_telemetry(
        iter_otlp_json(path, max_bytes=max_bytes),
        str(path),
        max_tracked_spans=max_tracked_spans,
        max_finding_groups=max_finding_groups,
    )


def render_table(report: Report, fail_on: str = "violation") -> str:
    rows = [(f.level, f.rule, f.span or "-", f.attribute or "-", str(f.count), f.message) for f in report.findings]
    header = ("LEVEL", "RULE", "SPAN/METRIC", "ATTRIBUTE", "N", "MESSAGE")
    lines = []
    if rows:
        widths = [min(max(len(r[i]) for r in rows + [header]), 40) for i in range(5)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
        lines.append(fmt.format(*header))
        lines.extend(fmt.format(*(c[:40] for c in row[:5]), row[5]) for row in rows)
    verdict = "FAIL" if report.fails(fail_on) else "OK"
    lines.append(
        f"{verdict}: {report.path}: {report.spans} spans ({report.genai_spans} GenAI, "
        f"{report.build_spans} build"
        + (f", {report.stage_spans} inference-stage" if report.stage_spans else "")
        + f"), {report.metrics} metrics; "
        + ", ".join(f"{report.count(level)} {level}" for level in LEVELS)
    )
    return "\n".join(lines)
