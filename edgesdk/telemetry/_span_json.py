# SPDX-License-Identifier: Apache-2.0
"""SDK spans straight to the OTLP/JSON dict, without the protobuf round trip.

Going through the OTLP protobuf encoder and ``MessageToDict`` costs ~130 us per span on this CPU
(measured: encode 47 + to-dict 66 + dumps 18); the export thread competes with inference for the
GIL, so the file exporter uses this direct encoder. Output is identical to
``to_otlp_json(encode_spans(spans))`` — tests/test_telemetry_export.py compares the two — i.e. the
protobuf JSON mapping: default-valued fields omitted, 64-bit integers as strings, enums as
integers, ids as hex.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence

# SDK SpanKind (INTERNAL=0 ... CONSUMER=4) -> OTLP Span.SpanKind (UNSPECIFIED=0, INTERNAL=1 ...)
_KIND_OFFSET = 1
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200


def any_value(value) -> dict:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        values = [any_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    if isinstance(value, Mapping):
        pairs = [{"key": str(k), "value": any_value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": pairs} if pairs else {}}
    raise TypeError(f"unsupported attribute value type {type(value).__name__}")


def _attributes(attributes) -> list[dict]:
    return [{"key": key, "value": any_value(value)} for key, value in attributes.items()] if attributes else []


def _flags(context) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE


def _put(out: dict, key: str, value) -> None:
    if value:
        out[key] = value


def span_dict(span) -> dict:
    ctx = span.get_span_context()
    out: dict = {"traceId": format(ctx.trace_id, "032x"), "spanId": format(ctx.span_id, "016x")}
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if span.parent is not None:
        out["parentSpanId"] = format(span.parent.span_id, "016x")
    out["name"] = span.name
    out["kind"] = span.kind.value + _KIND_OFFSET
    _put(out, "startTimeUnixNano", str(span.start_time) if span.start_time else "")
    _put(out, "endTimeUnixNano", str(span.end_time) if span.end_time else "")
    _put(out, "attributes", _attributes(span.attributes))
    _put(out, "droppedAttributesCount", span.dropped_attributes)
    events = []
    for event in span.events:
        item: dict = {}
        _put(item, "timeUnixNano", str(event.timestamp) if event.timestamp else "")
        _put(item, "name", event.name)
        _put(item, "attributes", _attributes(event.attributes))
        _put(item, "droppedAttributesCount", event.dropped_attributes)
        events.append(item)
    _put(out, "events", events)
    _put(out, "droppedEventsCount", span.dropped_events)
    links = []
    for link in span.links:
        item = {"traceId": format(link.context.trace_id, "032x"), "spanId": format(link.context.span_id, "016x")}
        _put(item, "attributes", _attributes(link.attributes))
        _put(item, "droppedAttributesCount", link.dropped_attributes)
        item["flags"] = _flags(link.context)
        links.append(item)
    _put(out, "links", links)
    _put(out, "droppedLinksCount", span.dropped_links)
    status: dict = {}
    if span.status is not None:
        _put(status, "message", span.status.description)
        _put(status, "code", span.status.status_code.value)
    out["status"] = status
    out["flags"] = _flags(span.parent)
    return out


def _scope_dict(scope) -> dict:
    out: dict = {}
    if scope is None:
        return out
    _put(out, "name", scope.name)
    _put(out, "version", scope.version)
    _put(out, "attributes", _attributes(scope.attributes))
    return out


def export_request(spans) -> dict:
    """One ``ExportTraceServiceRequest`` in OTLP/JSON: spans grouped by resource, then by scope."""
    groups: dict = {}
    for span in spans:
        scopes = groups.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(span_dict(span))
    resource_spans = []
    for resource, scopes in groups.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            item: dict = {"scope": _scope_dict(scope), "spans": encoded}
            _put(item, "schemaUrl", scope.schema_url if scope is not None else "")
            scope_spans.append(item)
        resource_dict: dict = {}
        _put(resource_dict, "attributes", _attributes(resource.attributes))
        entry: dict = {"resource": resource_dict, "scopeSpans": scope_spans}
        _put(entry, "schemaUrl", resource.schema_url)
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans}


# --- the same, written straight to JSON text (the file exporter's path) ---------------------------
# Building the dict and then json.dumps costs twice what concatenating the text does; strings still
# go through the json module's C escaper, and anything unusual falls back to json.dumps.
_escape = json.encoder.encode_basestring_ascii


def _value_text(value) -> str:
    if value.__class__ is str:
        return '{"stringValue":' + _escape(value) + "}"
    if value.__class__ is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if value.__class__ is int:
        return '{"intValue":"' + str(value) + '"}'
    if value.__class__ is float and math.isfinite(value):
        return '{"doubleValue":' + repr(value) + "}"
    return json.dumps(any_value(value), separators=(",", ":"))


# Most attributes repeat on every span with the same value (model, provider, profile, request
# parameters, ...): the JSON text of each (key, str value) pair is made once and looked up by the
# ``(key, value)`` tuple that ``dict.items()`` yields anyway, in one C-level ``map``. Only str and
# tuple-of-str values are cached, so a lookup can never hit a different-typed equal value (1, 1.0
# and True are equal as dict keys). Bounded, so a stream of distinct values cannot grow it.
_PAIR_TEXTS: dict = {}
_CACHE_LIMIT = 4096
_INF = math.inf


def _pair_text(key: str, value) -> str:
    cls = value.__class__
    if cls is str:
        text = '{"key":' + _escape(key) + ',"value":{"stringValue":' + _escape(value) + "}}"
    elif cls is tuple and value and all(v.__class__ is str for v in value):
        text = '{"key":' + _escape(key) + ',"value":{"arrayValue":{"values":[' \
            + ",".join('{"stringValue":' + _escape(v) + "}" for v in value) + "]}}}"
    else:
        return '{"key":' + _escape(key) + ',"value":' + _value_text(value) + "}"
    if len(_PAIR_TEXTS) < _CACHE_LIMIT and len(text) <= 512:
        _PAIR_TEXTS[(key, value)] = text
    return text


_KEY_PREFIXES: dict = {}  # key -> '{"key":"...","value":' for the values not cached whole (numbers)


def _key_prefix(key: str) -> str:
    prefix = '{"key":' + _escape(key) + ',"value":'
    if len(_KEY_PREFIXES) < _CACHE_LIMIT:
        _KEY_PREFIXES[key] = prefix
    return prefix


def cached_pairs(cache: dict, attributes) -> tuple[list, list]:
    """``(items, encoded)``: each (key, value) item and its cached encoding, or None where not cached.

    One C-level ``map`` over the ``(key, value)`` tuples ``dict.items()`` yields anyway.
    """
    items = list(attributes.items())
    try:
        return items, list(map(cache.get, items))
    except TypeError:  # an unhashable value (a list on a span not made by the SDK)
        return items, [None] * len(items)


def _attributes_text(attributes) -> str:
    items, texts = cached_pairs(_PAIR_TEXTS, attributes)
    if None in texts:
        prefixes = _KEY_PREFIXES
        for i, text in enumerate(texts):
            if text is None:
                key, value = items[i]
                cls = value.__class__
                if cls is int:
                    texts[i] = (prefixes.get(key) or _key_prefix(key)) + '{"intValue":"' + str(value) + '"}}'
                elif cls is float and _INF > value > -_INF:
                    texts[i] = (prefixes.get(key) or _key_prefix(key)) + '{"doubleValue":' + repr(value) + "}}"
                else:
                    texts[i] = _pair_text(key, value)
    return ",".join(texts)


def span_attributes(span):
    """The span's attribute dict: the SDK's own when it is a plain dict inside (no copy, no lock
    needed: the span has ended, so its attributes are frozen), else the public mapping."""
    outer = getattr(span, "_attributes", None)
    if type(outer) is dict:  # made in one step (_direct_spans)
        return outer
    inner = getattr(outer, "_dict", None)
    return inner if isinstance(inner, dict) else span.attributes


def _span_text(span) -> str:
    if rare_shape(span):
        return json.dumps(span_dict(span), separators=(",", ":"))  # rare shapes: the dict path
    ctx = span.get_span_context()
    parts = ['{"traceId":"', format(ctx.trace_id, "032x"), '","spanId":"', format(ctx.span_id, "016x"), '"']
    if span.parent is not None:
        parts += [',"parentSpanId":"', format(span.parent.span_id, "016x"), '"']
    parts += [',"name":', _escape(span.name), ',"kind":', str(span.kind.value + _KIND_OFFSET)]
    if span.start_time:
        parts += [',"startTimeUnixNano":"', str(span.start_time), '"']
    if span.end_time:
        parts += [',"endTimeUnixNano":"', str(span.end_time), '"']
    attributes = span_attributes(span)
    if attributes:
        parts += [',"attributes":[', _attributes_text(attributes), "]"]
    status = span.status
    status_parts = []
    if status is not None and status.description:
        status_parts.append('"message":' + _escape(status.description))
    if status is not None and status.status_code.value:
        status_parts.append('"code":' + str(status.status_code.value))
    parts += [',"status":{', ",".join(status_parts), '},"flags":', str(_flags(span.parent)), "}"]
    return "".join(parts)


_SPANS_PER_PIECE = 32


def group_spans(spans) -> dict:
    """``{resource: {scope or None: [spans]}}`` in first-seen order, as the SDK's encoders group them.

    Grouped by identity first: ``Resource.__hash__`` JSON-dumps its attributes on every call, which
    cost as much as encoding the span itself. Spans of one provider share one Resource object;
    equal-but-distinct objects are merged afterwards, so the grouping is the SDK's.
    """
    by_id: dict = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        key = (id(resource), id(scope))
        group = by_id.get(key)
        if group is None:
            group = by_id[key] = (resource, scope or None, [])
        group[2].append(span)
    groups: dict = {}
    for resource, scope, members in by_id.values():
        groups.setdefault(resource, {}).setdefault(scope, []).extend(members)
    return groups


def rare_shape(span) -> bool:
    """Events, links, dropped counts or a trace state: encoded by the general (slower) path."""
    return bool(span.events or span.links or span.dropped_attributes or span.dropped_events or span.dropped_links
                or span.get_span_context().trace_state)


def export_request_parts(spans) -> list[str]:
    """:func:`export_request` as compact JSON text, in pieces of a few dozen spans.

    The pieces concatenate to one ``ExportTraceServiceRequest``. Writing them one after another
    instead of joining a 512-span batch into one string halves the export CPU here: each
    half-megabyte string is a fresh allocation the kernel has to fault in (measured: 16 -> 8 us per
    span, encode and write).
    """
    groups = group_spans(spans)
    parts = ['{"resourceSpans":[']
    for r, (resource, scopes) in enumerate(groups.items()):
        resource_dict: dict = {}
        _put(resource_dict, "attributes", _attributes(resource.attributes))
        parts.append(("," if r else "") + '{"resource":' + json.dumps(resource_dict, separators=(",", ":"))
                     + ',"scopeSpans":[')
        for i, (scope, members) in enumerate(scopes.items()):
            parts.append(("," if i else "") + '{"scope":' + json.dumps(_scope_dict(scope), separators=(",", ":"))
                         + ',"spans":[')
            for start in range(0, len(members), _SPANS_PER_PIECE):
                piece = ",".join([_span_text(s) for s in members[start:start + _SPANS_PER_PIECE]])
                parts.append("," + piece if start else piece)
            tail = ',"schemaUrl":' + _escape(scope.schema_url) if scope is not None and scope.schema_url else ""
            parts.append("]" + tail + "}")
        parts.append("]" + (',"schemaUrl":' + _escape(resource.schema_url) if resource.schema_url else "") + "}")
    parts.append("]}")
    return parts


def export_request_json(spans) -> str:
    """:func:`export_request` as one compact JSON text (``export_request_parts`` joined)."""
    return "".join(export_request_parts(spans))
