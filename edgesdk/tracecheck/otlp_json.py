# SPDX-License-Identifier: Apache-2.0
"""Read OTLP/JSON traces and metrics written by us or by other tools.

Accepted layouts (plain or gzip-compressed, UTF-8 with or without BOM): JSON Lines (the Collector
``file`` exporter: one ``ExportTraceServiceRequest`` or ``ExportMetricsServiceRequest`` per line),
or one JSON document (an export request, or a list of them).

JSON Lines are read as a stream, one line at a time (:func:`iter_otlp_json`): memory follows the
longest line, not the file. A gzip file is decompressed as it is read, and reading stops with an
error past ``max_bytes`` of decompressed text (a gzip bomb cannot fill the disk or the memory). A
line longer than ``MAX_LINE_BYTES`` is refused before it is held whole (a bomb of one endless line),
and so is a file that is one multi-line JSON document of more than ``MAX_DOCUMENT_BYTES``: such a
document must be parsed whole, and Python's JSON objects take ~13x the text (a 200 MiB document took
2.6 GB), so it is refused with a pointer to JSON Lines rather than allowed to exhaust memory. Keys may be
camelCase (OTLP/JSON) or snake_case (protobuf field names); ids hex or base64;
64-bit integers as strings or numbers; enums as integers or names; attribute values as the
``AnyValue`` union (string/bool/int/double/array/kvlist/bytes).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.errors import EdgeSDKError


class TraceFileError(EdgeSDKError):
    """The trace file cannot be read or is not OTLP/JSON (``edgesdk check traces`` exits 1)."""

    exit_code = 1


# Decompressed text read from one file at most (every layout), and the size of a file that is one
# multi-line JSON document (that layout must be parsed whole).
MAX_BYTES = 16 * 1024**3
MAX_DOCUMENT_BYTES = 64 * 1024**2
# One line (one export request) at most; the Collector's file exporter writes batches far smaller.
MAX_LINE_BYTES = 64 * 1024**2
# Non-empty lines read without finding any OTLP payload before the file is called "not OTLP" (a file of
# millions of '{}' or blank lines would otherwise be read to the end of its 16 GiB).
MAX_LINES_WITHOUT_OTLP = 10_000

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
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
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
                text = text[len(candidate) :]
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
                result.spans.append(
                    Span(
                        name=str(raw.get("name", "")),
                        kind=_enum(raw.get("kind", 0), SPAN_KINDS, "SPAN_KIND_"),
                        trace_id=str(raw.get("traceId", "")),
                        span_id=str(raw.get("spanId", "")),
                        parent_span_id=str(raw.get("parentSpanId", "") or ""),
                        attributes=_attributes(raw.get("attributes")),
                        resource=resource,
                        events=[
                            Event(str(e.get("name", "")), _attributes(e.get("attributes")))
                            for e in raw.get("events") or []
                        ],
                        status=_enum(status.get("code", 0), STATUS_CODES, "STATUS_CODE_"),
                        start_ns=_int(raw.get("startTimeUnixNano")),
                        end_ns=_int(raw.get("endTimeUnixNano")),
                        line=line,
                        scope=scope_name,
                    )
                )


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
                    points.append(
                        MetricPoint(
                            _attributes(point.get("attributes")),
                            [float(b) for b in bounds] if bounds is not None else None,
                        )
                    )
                result.metrics.append(
                    Metric(str(raw.get("name", "")), str(raw.get("unit", "")), data_kind, points, line)
                )


def _add_document(document, line: int, result: TelemetryFile) -> bool:
    if isinstance(document, list):
        found = False
        for item in document:
            found = _add_document(item, line, result) or found
        return found
    if not isinstance(document, dict):
        return False
    try:
        document = _normalise(document)
        if "resourceSpans" in document or "resourceMetrics" in document:
            result.requests += 1
            _read_spans(document, line, result)
            _read_metrics(document, line, result)
            return True
    except (AttributeError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        # A field of the wrong JSON type (a span that is null, attributes that are a string, ...)
        raise TraceFileError(
            f"{result.path}:{line}: not OTLP/JSON ({type(exc).__name__}: {str(exc)[:80]})",
            hint="expected OTLP/JSON lines or one OTLP/JSON document",
        ) from exc
    return "resourceLogs" in document  # a logs line from the collector's file exporter: valid, not checked


class _Bounded(io.RawIOBase):
    """A read-only stream that fails past ``limit`` bytes (counts what the decompressor produced)."""

    def __init__(self, inner, limit: int, path: Path):
        self._inner, self._left, self._limit, self._path = inner, limit, limit, path

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._inner.readinto(buffer)
        self._left -= n
        if self._left < 0:
            raise TraceFileError(
                f"{self._path} is larger than {self._limit} bytes uncompressed", hint="split it, or raise max_bytes"
            )
        return n


def _open_text(path: Path, limit: int) -> io.TextIOWrapper:
    raw = path.open("rb")
    magic = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    stream = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw  # rotated collector files
    return io.TextIOWrapper(io.BufferedReader(_Bounded(stream, limit, path), 1 << 20), encoding="utf-8-sig")


@contextlib.contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    """Turn I/O and decoding failures into one-line TraceFileErrors."""
    try:
        yield
    except FileNotFoundError as exc:
        raise TraceFileError(f"trace file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise TraceFileError(f"{path} is a directory, not a trace file") from exc
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise TraceFileError(f"cannot read trace file {path}: {exc}") from exc


def iter_otlp_json(path: str | Path, *, max_bytes: int = MAX_BYTES) -> Iterator[TelemetryFile]:
    """Yield the file's content one export request (line) at a time, each as a small TelemetryFile.

    Raises :class:`TraceFileError` (exit 1) when the file is unreadable or not OTLP/JSON, at the
    point where that shows (a bad line 1000 is found after 999 good ones were yielded).
    """
    path = Path(path)
    found, empty = False, True
    blank = 0
    with _read_errors(path), _open_text(path, max_bytes) as text:
        number = 0
        while True:
            line = text.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith("\n"):
                what = "one JSON document or line" if empty else f"line {number}"
                raise TraceFileError(
                    f"{path}: {what} is longer than {MAX_LINE_BYTES >> 20} MiB; not read whole (memory)",
                    hint="write OTLP/JSON lines, one export request per line",
                )
            if not line.strip():
                blank += 1
                if blank > MAX_LINES_WITHOUT_OTLP and not found and empty:
                    raise TraceFileError(f"{path}: {blank} blank lines and no JSON: not a trace file")
                continue
            if not found and number - blank > MAX_LINES_WITHOUT_OTLP:
                raise TraceFileError(
                    f"{path} is JSON but not OTLP (no resourceSpans or resourceMetrics in its "
                    f"first {MAX_LINES_WITHOUT_OTLP} lines)"
                )
            try:
                document = json.loads(line)
            except RecursionError as exc:
                raise TraceFileError(f"{path}:{number}: JSON nested too deeply to be OTLP") from exc
            except json.JSONDecodeError as exc:
                if empty:  # line 1 is not a whole document: maybe the file is one multi-line document
                    yield _whole_document(path, max_bytes, number, exc)
                    return
                raise TraceFileError(
                    f"{path}:{number}: not JSON ({exc.msg})", hint="expected OTLP/JSON lines or one OTLP/JSON document"
                ) from exc
            empty = False
            part = TelemetryFile(path=str(path))
            if _add_document(document, number, part):
                found = True
                yield part
    if empty:
        raise TraceFileError(f"trace file is empty: {path}")
    if not found:
        raise TraceFileError(f"{path} is JSON but not OTLP (no resourceSpans or resourceMetrics)")


def _whole_document(path: Path, max_bytes: int, number: int, line_error: json.JSONDecodeError) -> TelemetryFile:
    limit = MAX_DOCUMENT_BYTES
    with _read_errors(path), _open_text(path, max_bytes) as text:
        raw = text.read(limit + 1)  # characters: never more than the limit held, whatever the file's size
        if len(raw) > limit:
            raise TraceFileError(
                f"{path} is one JSON document of more than {limit >> 20} MiB: parsing it whole "
                "would take ~13x that in memory",
                hint="write OTLP/JSON lines (one export request per line), which are read as a stream",
            )
        try:
            document = json.loads(raw)
        except RecursionError as exc:
            raise TraceFileError(f"{path}: JSON nested too deeply to be OTLP") from exc
        except json.JSONDecodeError:
            raise TraceFileError(
                f"{path}:{number}: not JSON ({line_error.msg})",
                hint="expected OTLP/JSON lines or one OTLP/JSON document",
            ) from line_error
    result = TelemetryFile(path=str(path))
    if not _add_document(document, number, result):
        raise TraceFileError(f"{path} is JSON but not OTLP (no resourceSpans or resourceMetrics)")
    return result


def read_otlp_json(path: str | Path, *, max_bytes: int = MAX_BYTES) -> TelemetryFile:
    """Parse a whole file into memory (small files, tests); :func:`iter_otlp_json` streams."""
    result = TelemetryFile(path=str(path))
    for part in iter_otlp_json(path, max_bytes=max_bytes):
        result.spans.extend(part.spans)
        result.metrics.extend(part.metrics)
        result.requests += part.requests
    return result
