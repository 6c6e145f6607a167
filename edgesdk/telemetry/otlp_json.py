# SPDX-License-Identifier: Apache-2.0
"""Read OTLP/JSON traces and metrics written by us or by other tools.

Accepted layouts (plain or gzip-compressed, UTF-8 with or without BOM): JSON Lines (the Collector ``file`` exporter: one ``ExportTraceServiceRequest`` or
``ExportMetricsServiceRequest`` per line), or one JSON document (an export request, or a list of
them). Keys may be camelCase (OTLP/JSON) or snake_case (protobuf field names); ids hex or base64;
64-bit integers as strings or numbers; enums as integers or names; attribute values as the
``AnyValue`` union (string/bool/int/double/array/kvlist/bytes).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.errors import EdgeSDKError


class TraceFileError(EdgeSDKError):
    """The trace file cannot be read or is not OTLP/JSON (``edgesdk check traces`` exits 1)."""

    exit_code = 1


SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass
class Attr:
    value: object
    type: str  # string, int, double, boolean, string[], int[], double[], boolean[], any, empty


@dataclass
class Event:
    name: str
    attributes: dict[str, Attr]


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Attr]
    resource: dict[str, Attr]
    events: list[Event]
    status: str
    start_ns: int
    end_ns: int
    line: int
    scope: str = ""


@dataclass
class MetricPoint:
    attributes: dict[str, Attr]
    bounds: list[float] | None


@dataclass
class Metric:
    name: str
    unit: str
    data_kind: str
    points: list[MetricPoint]
    line: int


@dataclass
class TelemetryFile:
    path: str
    spans: list[Span] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    requests: int = 0


_SNAKE = re.compile(r"_([a-z0-9])")


def _camel(key: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), key) if "_" in key else key


def _normalise(node):
    if isinstance(node, dict):
        return {_camel(k): _normalise(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_normalise(v) for v in node]
    return node


def _int(value, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _enum(value, table: dict[int, str], prefix: str) -> str:
    if isinstance(value, int):
        return table.get(value, str(value))
    if isinstance(value, str):
        text = value.upper()
        if text.isdigit():
            return table.get(int(text), text)
        for candidate in (prefix, "SPANKIND.", "STATUSCODE."):
            if text.startswith(candidate):
                text = text[len(candidate):]
        return text
    return table[0]


def _any_value(value) -> Attr:
    if not isinstance(value, dict) or not value:
        return Attr(None, "empty")
    if "stringValue" in value:
        return Attr(value["stringValue"], "string")
    if "boolValue" in value:
        return Attr(bool(value["boolValue"]), "boolean")
    if "intValue" in value:
        return Attr(_int(value["intValue"]), "int")
    if "doubleValue" in value:
        raw = value["doubleValue"]
        try:
            return Attr(float(raw), "double")
        except (TypeError, ValueError):
            return Attr(raw, "double")
    if "arrayValue" in value:
        items = [_any_value(v) for v in (value["arrayValue"] or {}).get("values", [])]
        kinds = {item.type for item in items}
        if len(kinds) == 1 and next(iter(kinds)) in ("string", "int", "double", "boolean"):
            return Attr([item.value for item in items], next(iter(kinds)) + "[]")
        if not items:
            return Attr([], "[]")
        return Attr([item.value for item in items], "any")
    if "kvlistValue" in value:
        return Attr(_attributes((value["kvlistValue"] or {}).get("values", [])), "any")
    if "bytesValue" in value:
        return Attr(value["bytesValue"], "any")
    return Attr(None, "empty")


def _attributes(items) -> dict[str, Attr]:
    out = {}
    for item in items or []:
        if isinstance(item, dict) and "key" in item:
            out[str(item["key"])] = _any_value(item.get("value"))
    return out


def _read_spans(document: dict, line: int, result: TelemetryFile) -> None:
    for resource_spans in document.get("resourceSpans") or []:
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
        scopes = resource_spans.get("scopeSpans") or resource_spans.get("instrumentationLibrarySpans") or []
        for scope in scopes:
            scope_name = str((scope.get("scope") or scope.get("instrumentationLibrary") or {}).get("name", ""))
            for raw in scope.get("spans") or []:
                status = raw.get("status") or {}
                result.spans.append(Span(
                    name=str(raw.get("name", "")),
                    kind=_enum(raw.get("kind", 0), SPAN_KINDS, "SPAN_KIND_"),
                    trace_id=str(raw.get("traceId", "")), span_id=str(raw.get("spanId", "")),
                    parent_span_id=str(raw.get("parentSpanId", "") or ""),
                    attributes=_attributes(raw.get("attributes")), resource=resource,
                    events=[Event(str(e.get("name", "")), _attributes(e.get("attributes")))
                            for e in raw.get("events") or []],
                    status=_enum(status.get("code", 0), STATUS_CODES, "STATUS_CODE_"),
                    start_ns=_int(raw.get("startTimeUnixNano")), end_ns=_int(raw.get("endTimeUnixNano")),
                    line=line, scope=scope_name))


def _read_metrics(document: dict, line: int, result: TelemetryFile) -> None:
    for resource_metrics in document.get("resourceMetrics") or []:
        for scope in resource_metrics.get("scopeMetrics") or []:
            for raw in scope.get("metrics") or []:
                for data_kind in ("histogram", "sum", "gauge", "exponentialHistogram", "summary"):
                    if data_kind in raw:
                        break
                else:
                    data_kind = "unknown"
                points = []
                for point in (raw.get(data_kind) or {}).get("dataPoints") or []:
                    bounds = point.get("explicitBounds")
                    points.append(MetricPoint(_attributes(point.get("attributes")),
                                              [float(b) for b in bounds] if bounds is not None else None))
                result.metrics.append(Metric(str(raw.get("name", "")), str(raw.get("unit", "")),
                                             data_kind, points, line))


def _add_document(document, line: int, result: TelemetryFile) -> bool:
    if isinstance(document, list):
        found = False
        for item in document:
            found = _add_document(item, line, result) or found
        return found
    if not isinstance(document, dict):
        return False
    document = _normalise(document)
    if "resourceSpans" in document or "resourceMetrics" in document:
        result.requests += 1
        _read_spans(document, line, result)
        _read_metrics(document, line, result)
        return True
    return "resourceLogs" in document  # a logs line from the collector's file exporter: valid, not checked


def read_otlp_json(path: str | Path) -> TelemetryFile:
    """Parse a file; raises :class:`TraceFileError` (exit 1) if it is unreadable or not OTLP/JSON."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip (rotated collector files are often compressed)
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise TraceFileError(f"trace file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise TraceFileError(f"{path} is a directory, not a trace file") from exc
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise TraceFileError(f"cannot read trace file {path}: {exc}") from exc
    result = TelemetryFile(path=str(path))
    if not text.strip():
        raise TraceFileError(f"trace file is empty: {path}")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if whole is not None:
        if not _add_document(whole, 1, result):
            raise TraceFileError(f"{path} is JSON but not OTLP (no resourceSpans or resourceMetrics)")
        return result
    found = False
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFileError(f"{path}:{number}: not JSON ({exc.msg})",
                                 hint="expected OTLP/JSON lines or one OTLP/JSON document") from exc
        found = _add_document(document, number, result) or found
    if not found:
        raise TraceFileError(f"{path} is JSON but not OTLP (no resourceSpans or resourceMetrics)")
    return result
