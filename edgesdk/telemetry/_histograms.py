# SPDX-License-Identifier: Apache-2.0
"""Many histogram records with one attribute set, at a fraction of ``Histogram.record``'s cost.

Why: ``gen_ai.client.operation.time_per_output_chunk`` is recorded once per streamed chunk (the
convention says so), and in the OTel Python SDK 1.45.2 one ``Histogram.record`` costs 5-9 us on
this CPU — more than the 5 us per token that telemetry may cost in total (benchmark P6). Most of
that is per-call work that does not depend on the value: cleaning the attribute dict, hashing it,
walking reader storages and views. A request's records all share one attribute set, so
:class:`HistogramRecorder` does that work once per (instrument, attribute set) and then hands each
value to the SDK's own aggregation objects — the ones ``Histogram.record`` would reach — so views
(attribute-key filters, custom aggregations), temporality, cardinality limits and exemplar
filters keep working and the exported data points are identical (``tests/test_telemetry_histograms``
checks that against the public API, value by value, for cumulative and delta readers).

The shortcut uses SDK internals. It is taken only for the pinned SDK's classes; anything
unexpected (another SDK version, an attribute missing) turns it off for the process, before any
value of that batch is recorded, and every value goes through the public ``Histogram.record``
instead. Instruments that are not the SDK's (a no-op or proxy meter) simply take the public path.
``telemetry.stats()["metrics_fast_path"]`` says which path is in use, and why not when it is off.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from time import time_ns

from opentelemetry.context import get_current

try:  # the SDK internals the shortcut needs; absent or moved -> public API only
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes
    from opentelemetry.sdk.metrics._internal.aggregation import _ExplicitBucketHistogramAggregation
    from opentelemetry.sdk.metrics._internal.exemplar.exemplar_filter import (
        AlwaysOffExemplarFilter,
        AlwaysOnExemplarFilter,
        TraceBasedExemplarFilter,
    )
    from opentelemetry.sdk.metrics._internal.instrument import _Histogram as _SdkHistogram
    from opentelemetry.sdk.metrics._internal.measurement import Measurement
    from opentelemetry.sdk.metrics._internal.measurement_consumer import SynchronousMeasurementConsumer

    _IMPORTED = True
except ImportError:  # pragma: no cover - exercised only on an SDK without these modules
    _IMPORTED = False

# Exemplar filters whose decision does not depend on the value: decided once per batch.
_VALUE_INDEPENDENT_FILTERS = (AlwaysOffExemplarFilter, AlwaysOnExemplarFilter, TraceBasedExemplarFilter) \
    if _IMPORTED else ()
_CACHE_LIMIT = 1024
_new = object.__new__
_set = object.__setattr__


def _measurement(value, now, histogram, context, attributes):
    """A Measurement without re-running its attribute cleaning (the recorder's attributes are clean)."""
    m = _new(Measurement)
    _set(m, "value", value)
    _set(m, "time_unix_nano", now)
    _set(m, "instrument", histogram)
    _set(m, "context", context)
    _set(m, "attributes", attributes)
    return m


_INF = math.inf
_NO_ATTRIBUTES: dict = {}


def _fold_explicit(aggregation, values) -> None:
    """``aggregation.aggregate(m, False)`` for each value, in one lock hold.

    The same steps in the same order as the SDK's explicit-bucket ``aggregate`` (so the float sum
    is bit-identical), for the default aggregation of every GenAI histogram. Every SDK attribute is
    read before the first write, so a changed SDK fails before anything is counted.
    """
    with aggregation._lock:
        counts = aggregation._value
        if counts is None:
            counts = aggregation._get_empty_bucket_counts()
        bounds = aggregation._boundaries
        total = aggregation._sum
        min_max = aggregation._record_min_max
        low, high = aggregation._min, aggregation._max
        aggregation._value = counts
        for value in values:
            total += value
            counts[bisect_left(bounds, value)] += 1
        aggregation._sum = total
        if min_max:
            aggregation._min = min(low, min(values))
            aggregation._max = max(high, max(values))


class HistogramRecorder:
    """Histogram records with :meth:`record_points`: ``[(histogram, attributes, values), ...]``.

    One call takes all of a request's records; the clock, context and exemplar decision are taken
    once for them. Attribute values must already be valid OTel attribute values (str, bool, int,
    float or sequences of one of those): the recorder builds them itself, so they are not cleaned
    again. Values ``Histogram.record`` would drop (negative, NaN, infinite) are dropped here too.
    """

    def __init__(self, *, check: bool = True):
        self.fast = _IMPORTED
        self.fallback_reason = None if _IMPORTED else "SDK internals not importable"
        if self.fast and check:
            reason = self_check()
            if reason is not None:
                self.fast, self.fallback_reason = False, reason
        self._routes = {}
        self._attribute_ids = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _new_attribute_id(self, items) -> int:
        with self._lock:
            if len(self._attribute_ids) >= _CACHE_LIMIT:
                self._attribute_ids, self._routes = {}, {}
            # Never reused (a counter, not the dict size): a route stored under an old id by another
            # thread during a reset can never be found for a different attribute set.
            return self._attribute_ids.setdefault(items, next(self._ids))

    def record_points(self, points) -> None:
        rest = points
        if self.fast:
            try:
                rest = self._record_fast(points)
            except (AttributeError, TypeError, KeyError) as exc:  # SDK internals not as expected
                self._disable(f"{type(exc).__name__}: {exc}")
                rest = points  # redone publicly: see _record_fast for why nothing counts twice
        for histogram, attributes, values in rest:
            record = histogram.record
            for value in values:
                record(value, attributes)

    def _disable(self, reason: str) -> None:
        self.fast = False
        self.fallback_reason = reason
        self._routes, self._attribute_ids = {}, {}

    def _resolve(self, histogram, attributes, attributes_key):
        """The route of one (instrument, attribute set): (reader storages, [(view match, aggregation
        key, view-filtered attributes)], exemplar filter); None when the instrument is not the SDK's."""
        if type(histogram) is not _SdkHistogram:
            return None  # a proxy/no-op meter (telemetry off, or the global provider not set yet)
        consumer = histogram._measurement_consumer
        if type(consumer) is not SynchronousMeasurementConsumer:
            return None
        storages = consumer._reader_storages
        matches = []
        for storage in storages.values():
            for match in storage._get_or_init_view_instrument_match(histogram):
                keys = match._view._attribute_keys
                kept = dict(attributes) if keys is None else {k: v for k, v in attributes.items() if k in keys}
                matches.append((match, _hash_attributes(kept), kept))
        route = (storages, matches, consumer._sdk_config.exemplar_filter)
        with self._lock:
            if len(self._routes) >= _CACHE_LIMIT:
                self._routes = {}
            self._routes[(histogram, attributes_key)] = route
        return route

    def _record_fast(self, points) -> list:
        """Record what can take the shortcut; return the points that must take the public path.

        Every route is resolved before the first value is aggregated, and the first aggregation
        touched reads every SDK attribute it needs before its first write; so an SDK of another
        shape raises before anything is recorded and the caller redoes the batch publicly. (The
        once-per-process :func:`self_check` normally turns the shortcut off before that.)
        """
        rest, work = [], {}
        routes = self._routes
        attribute_keys: dict = {}
        for point in points:
            histogram, attributes, values = point
            if attributes is None:
                attributes = _NO_ATTRIBUTES
            attributes_key = attribute_keys.get(id(attributes))
            if attributes_key is None:
                # A small int per distinct attribute set: route keys then hash in constant time.
                items = tuple(attributes.items())
                attributes_key = self._attribute_ids.get(items)
                if attributes_key is None:
                    attributes_key = self._new_attribute_id(items)
                attribute_keys[id(attributes)] = attributes_key
            route = routes.get((histogram, attributes_key))
            # Reader storages are replaced (never mutated) when a reader is added or removed.
            if route is None or route[0] is not histogram._measurement_consumer._reader_storages:
                route = self._resolve(histogram, attributes, attributes_key)
                if route is None:
                    rest.append(point)
                    continue
            if not histogram._is_enabled():
                continue  # the public record() drops these too
            # Points of one instrument and attribute set are merged, in order: the aggregation sees
            # the same values in the same sequence as one record() per value would give it.
            group = work.get((histogram, attributes_key))
            if group is None:
                group = work[(histogram, attributes_key)] = (route, histogram, attributes, [])
            if len(values) == 1:
                if 0 <= values[0] < _INF:  # record() drops negative, NaN and infinite values
                    group[3].append(values[0])
            else:
                group[3].extend([v for v in values if 0 <= v < _INF])
        if not work:
            return rest
        now = time_ns()
        context = get_current()
        decided_filter = decision = None
        for (_storages, matches, exemplar_filter), histogram, attributes, values in work.values():
            if not values:
                continue
            if exemplar_filter is not decided_filter:
                if isinstance(exemplar_filter, _VALUE_INDEPENDENT_FILTERS):
                    decided_filter, decision = exemplar_filter, exemplar_filter.should_sample(
                        values[0], now, attributes, context)
                    samples = [decision] * len(values) if decision else None
                else:
                    samples = [exemplar_filter.should_sample(v, now, attributes, context) for v in values]
                    samples = samples if any(samples) else None
            else:
                samples = [decision] * len(values) if decision else None
            for match, aggr_key, kept in matches:
                # Looked up every time (a dict get): delta readers swap the aggregation dict on collect.
                # Held under the match's lock as the SDK does for delta readers, so no value lands in
                # a collected-and-discarded aggregation.
                with match._lock:
                    aggregation = match._attributes_aggregation.get(aggr_key)
                    if aggregation is None:
                        aggregation = match._get_or_create_aggregation(aggr_key, kept)
                    if samples is None:
                        if type(aggregation) is _ExplicitBucketHistogramAggregation:
                            _fold_explicit(aggregation, values)
                            continue
                        # Aggregations only read ``.value`` when not sampling: one object, value updated.
                        shared = _measurement(values[0], now, histogram, context, attributes)
                        aggregate = aggregation.aggregate
                        for value in values:
                            _set(shared, "value", value)
                            aggregate(shared, False)
                    else:
                        # An exemplar reservoir may keep the measurement: one object per value, as
                        # record() makes.
                        aggregate = aggregation.aggregate
                        for value, sample in zip(values, samples):
                            aggregate(_measurement(value, now, histogram, context, attributes), sample)
        return rest


_SELF_CHECK: list = []  # [result] once run: None (shortcut agrees with the SDK) or why not


def self_check() -> str | None:
    """Once per process: the shortcut and the public ``record()`` must give the same data point.

    Runs on a private meter provider (a few milliseconds, at the first ``telemetry.configure``).
    Returns None when they agree, else why the shortcut must stay off.
    """
    if _SELF_CHECK:
        return _SELF_CHECK[0]
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        values = [0.0, 0.003, 0.5, 2.0, 7.25, 1e-9, 0.1]
        attributes = {"gen_ai.operation.name": "chat", "n": 1}

        def point(shortcut: bool):
            reader = InMemoryMetricReader()
            provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
            hist = provider.get_meter("edgesdk.self_check").create_histogram(
                "h", unit="s", explicit_bucket_boundaries_advisory=[0.001, 0.1, 1.0, 5.0])
            if shortcut:
                if HistogramRecorder(check=False)._record_fast([(hist, attributes, values)]):
                    return "declined an SDK instrument"
            else:
                for value in values:
                    hist.record(value, attributes)
            p = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
            provider.shutdown()
            return (p.count, p.sum, tuple(p.bucket_counts), tuple(p.explicit_bounds), p.min, p.max,
                    dict(p.attributes))

        fast, public = point(True), point(False)
        result = None if fast == public else f"self-check: shortcut gave {fast}, record() gave {public}"
    except Exception as exc:  # noqa: BLE001 - any failure means: use the public path
        result = f"self-check failed: {type(exc).__name__}: {exc}"
    _SELF_CHECK.append(result)
    return result
