# SPDX-License-Identifier: Apache-2.0
"""SDK spans straight to OTLP protobuf bytes (``ExportTraceServiceRequest``), for the OTLP exporters.

The SDK's ``encode_spans`` builds one Python protobuf object per span, attribute and value: about
49 us per GenAI span on this CPU, twice everything else telemetry does per request (benchmark P6).
This encoder writes the wire format directly — the same fields the SDK's encoder sets, with the
same presence rules. The gRPC exporter parses the bytes back into the request message in C
(``FromString``); the HTTP exporter posts them as they are. Either way the SDK's transport (retries,
headers, TLS, compression, ``OTEL_*`` settings) is used unchanged. Spans of rare shapes (events, links, trace state, dropped counts)
are encoded by the SDK itself and spliced in. ``tests/test_telemetry_export.py`` checks the result
equals ``encode_spans`` byte for byte after re-serialisation, over every value type.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence

from edgesdk.telemetry._span_json import cached_pairs, group_spans, rare_shape, span_attributes

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
_CACHE_LIMIT = 4096
_logger = logging.getLogger(__name__)


_SMALL = [bytes((i,)) for i in range(0x80)]  # one-byte varints: most lengths and token counts


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (_SMALL[n] if n < 0x80 else _varint(n)) + payload


def _any_value(value) -> bytes | None:
    """AnyValue payload; None when the SDK's encoder would fail on it (and drop the attribute)."""
    if value is None:
        return b""
    cls = value.__class__
    if cls is str:
        return _len_field(b"\x0a", value.encode("utf-8"))
    if cls is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if cls is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            return None
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if cls is float:
        return b"\x21" + _pack_double(value)
    if isinstance(value, bool):  # subclasses, in the SDK's order of isinstance checks
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _len_field(b"\x0a", str(value).encode("utf-8"))
    if isinstance(value, int):
        return _any_value(int(value))
    if isinstance(value, float):
        return _any_value(float(value))
    if isinstance(value, bytes):
        return _len_field(b"\x3a", bytes(value))
    if isinstance(value, Sequence):
        items = [_any_value(v) for v in value]
        if any(item is None for item in items):
            return None
        return _len_field(b"\x2a", b"".join(_len_field(b"\x0a", item) for item in items))
    if isinstance(value, Mapping):
        pairs = [_key_value(str(k), v) for k, v in value.items()]
        if any(pair is None for pair in pairs):
            return None
        return _len_field(b"\x32", b"".join(_len_field(b"\x0a", pair) for pair in pairs))
    return None


def _key_value(key: str, value) -> bytes | None:
    payload = _any_value(value)
    if payload is None:
        return None
    return _len_field(b"\x0a", key.encode("utf-8")) + _len_field(b"\x12", payload)


# (key, value) -> the encoded repeated-KeyValue field, for str and tuple-of-str values only (so
# equal values of other types — 1, 1.0, True — can never share an entry). See _span_json.
_PAIRS: dict = {}


def _attribute_field(tag: bytes, key: str, value) -> bytes:
    pair = _key_value(key, value)
    if pair is None:
        return b""  # dropped, as the SDK's encoder drops a value it cannot encode
    field = _len_field(tag, pair)
    cls = value.__class__
    if len(_PAIRS) < _CACHE_LIMIT and len(field) <= 512 and (
            cls is str or (cls is tuple and all(v.__class__ is str for v in value))):
        _PAIRS[(key, value)] = field
    return field


def _attributes(tag: bytes, attributes) -> bytes:
    """Repeated KeyValue field ``tag`` for every attribute (span: 0x4a; resource: 0x0a; scope: 0x1a)."""
    if not attributes:
        return b""
    if tag != b"\x4a":  # resource and scope: once per batch, no cache
        pairs = [_key_value(key, value) for key, value in attributes.items()]
        return b"".join(_len_field(tag, pair) for pair in pairs if pair is not None)
    items, fields = cached_pairs(_PAIRS, attributes)
    if None in fields:
        keys = _KEYS
        for i, field in enumerate(fields):
            if field is None:
                key, value = items[i]
                cls = value.__class__
                if cls is int and 0 <= value < 0x80:
                    any_value = b"\x18" + _SMALL[value]
                elif cls is int and _INT64_MIN <= value <= _INT64_MAX:
                    any_value = b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
                elif cls is float:
                    any_value = b"\x21" + _pack_double(value)
                elif cls is bool:
                    any_value = b"\x10\x01" if value else b"\x10\x00"
                else:
                    fields[i] = _attribute_field(tag, key, value)
                    continue
                pair = (keys.get(key) or _key_bytes(key)) + b"\x12" + _SMALL[len(any_value)] + any_value
                fields[i] = _len_field(b"\x4a", pair)
    return b"".join(fields)


_KEYS: dict = {}  # key -> its encoded KeyValue.key field


def _key_bytes(key: str) -> bytes:
    encoded = _len_field(b"\x0a", key.encode("utf-8"))
    if len(_KEYS) < _CACHE_LIMIT:
        _KEYS[key] = encoded
    return encoded


_FLAGS_LOCAL = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _pack_fixed32(_HAS_IS_REMOTE | _IS_REMOTE)
_STATUS_UNSET = b"\x7a\x00"  # the SDK's encoder always sets status, empty when unset
_NAMES: dict = {}  # span name -> its encoded name field (names repeat: "chat <model>")


def _span_flags(parent) -> bytes:
    return _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL


def _name_field(name: str) -> bytes:
    field = _NAMES.get(name)
    if field is None:
        field = _len_field(b"\x2a", name.encode("utf-8"))
        if len(_NAMES) < _CACHE_LIMIT:
            _NAMES[name] = field
    return field


def _sdk_span_bytes(span) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans([span]).resource_spans[0].scope_spans[0].spans[0].SerializeToString()


def span_bytes(span) -> bytes:
    """One ``Span`` message."""
    if rare_shape(span):
        return _sdk_span_bytes(span)  # rare shapes: the SDK's own encoder
    ctx = span.get_span_context()
    parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
    parent = span.parent
    if parent is not None:
        parts += [b"\x22\x08", parent.span_id.to_bytes(8, "big")]
    if span.name:
        parts.append(_name_field(span.name))
    parts += [b"\x30", _SMALL[span.kind.value + 1]]
    if span.start_time:
        parts += [b"\x39", _pack_fixed64(span.start_time)]
    if span.end_time:
        parts += [b"\x41", _pack_fixed64(span.end_time)]
    parts.append(_attributes(b"\x4a", span_attributes(span)))
    status = span.status
    if status is not None and not status.description and not status.status_code.value:
        parts.append(_STATUS_UNSET)
    elif status is not None:
        body = b""
        if status.description:
            body += _len_field(b"\x12", status.description.encode("utf-8"))
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
        parts.append(_len_field(b"\x7a", body))
    parts.append(_span_flags(parent))
    return b"".join(parts)


def _scope_bytes(scope) -> bytes:
    if scope is None:
        return b""
    body = b""
    if scope.name:
        body += _len_field(b"\x0a", scope.name.encode("utf-8"))
    if scope.version:
        body += _len_field(b"\x12", scope.version.encode("utf-8"))
    body += _attributes(b"\x1a", scope.attributes)
    return body


def export_request_bytes(spans) -> bytes:
    """A serialized ``ExportTraceServiceRequest``: spans grouped by resource, then scope (as the SDK does)."""
    groups = group_spans(spans)
    out = []
    for resource, scopes in groups.items():
        body = [_len_field(b"\x0a", _attributes(b"\x0a", resource.attributes))]
        for scope, members in scopes.items():
            scope_body = [_len_field(b"\x0a", _scope_bytes(scope))]
            scope_body += [_len_field(b"\x12", span_bytes(s)) for s in members]
            if scope is not None and scope.schema_url:
                scope_body.append(_len_field(b"\x1a", scope.schema_url.encode("utf-8")))
            body.append(_len_field(b"\x12", b"".join(scope_body)))
        if resource.schema_url:
            body.append(_len_field(b"\x1a", resource.schema_url.encode("utf-8")))
        out.append(_len_field(b"\x0a", b"".join(body)))
    return b"".join(out)


def grpc_span_exporter_class():
    """The SDK's OTLP/gRPC span exporter, its request built by :func:`export_request_bytes`.

    ``_translate_data`` is the SDK exporter's hook for turning spans into the request message;
    everything else (channel, retries, timeouts, headers, compression) stays the SDK's.
    """
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class FastOTLPSpanExporter(OTLPSpanExporter):
        def _translate_data(self, data):
            return ExportTraceServiceRequest.FromString(export_request_bytes(data))

    return FastOTLPSpanExporter


_HTTP_PARTS = ("_client", "_metrics", "_max_request_size", "_shutdown")


def http_span_exporter_class():
    """The SDK's OTLP/HTTP span exporter, posting :func:`export_request_bytes` instead of ``encode_spans``.

    The HTTP exporter has no encoding hook: its ``export()`` encodes, checks the size and hands the
    bytes to its HTTP client, which does the retries, timeouts, headers and compression. This
    ``export()`` is the same three steps with our bytes; if the SDK's exporter is not shaped as
    expected (another version), it is the SDK's ``export()`` that runs.
    """
    from opentelemetry.exporter.otlp.proto.http import _common
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    too_large = getattr(_common, "_is_request_too_large", None)
    too_large_error = getattr(_common, "RequestPayloadTooLargeError", None)

    class FastOTLPSpanExporter(OTLPSpanExporter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fast_path = (too_large is not None and too_large_error is not None
                              and all(hasattr(self, name) for name in _HTTP_PARTS)
                              and callable(getattr(self._client, "export", None))
                              and callable(getattr(self._metrics, "export_operation", None)))

        def export(self, spans):
            if not self.fast_path or self._shutdown:
                return super().export(spans)
            with self._metrics.export_operation(len(spans)) as result:
                try:
                    data = export_request_bytes(spans)
                except Exception as error:  # noqa: BLE001 - as the SDK: a batch that cannot be encoded fails
                    _logger.error("Failed to encode span batch: %s", error)
                    result.error = error
                    return SpanExportResult.FAILURE
                if too_large(data, self._max_request_size):
                    _logger.warning(
                        "Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                        len(data), self._max_request_size)
                    result.error = too_large_error(f"Serialized span request size {len(data)} bytes exceeds "
                                                   f"max_request_size {self._max_request_size} bytes.")
                    return SpanExportResult.FAILURE
                sent = self._client.export(data)
                if not sent.success:
                    result.error = sent.error
                    if sent.status_code is not None:
                        result.error_attrs = {"http.response.status_code": sent.status_code}
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return FastOTLPSpanExporter
