# SPDX-License-Identifier: Apache-2.0
"""The batched histogram recorder must give exactly the data points of one public record() per value."""

from __future__ import annotations

import math
import random
import threading

import pytest
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics._internal.exemplar import AlwaysOnExemplarFilter
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

from edgesdk.telemetry import _histograms
from edgesdk.telemetry._histograms import HistogramRecorder

BUCKETS = [0.01 * 2**i for i in range(14)]
ATTRS = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "llama.cpp", "gen_ai.request.model": "m"}
OTHER = {**ATTRS, "gen_ai.token.type": "output"}


def _provider(temporality=None, views=(), exemplar_filter=None):
    kwargs = {}
    if temporality is not None:
        kwargs["preferred_temporality"] = {HistogramInstrument: temporality}
    reader = InMemoryMetricReader(**kwargs)
    extra = {"exemplar_filter": exemplar_filter} if exemplar_filter is not None else {}
    provider = MeterProvider(metric_readers=[reader], views=list(views), **extra)
    meter = provider.get_meter("test")
    hists = [meter.create_histogram(name, unit="s", explicit_bucket_boundaries_advisory=BUCKETS)
             for name in ("a", "b")]
    return provider, reader, hists


def _points(reader) -> dict:
    """{(metric, attributes): comparable summary} of everything the reader collects now."""
    out = {}
    data = reader.get_metrics_data()
    for rm in (data.resource_metrics if data else []):
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    key = (metric.name, tuple(sorted(p.attributes.items())))
                    summary = {"count": p.count, "sum": round(p.sum, 9), "min": p.min, "max": p.max,
                               "exemplars": sorted(round(e.value, 9) for e in (p.exemplars or []))}
                    for field in ("bucket_counts", "explicit_bounds", "scale", "zero_count"):
                        if hasattr(p, field):
                            summary[field] = list(getattr(p, field)) if field != "scale" and \
                                field != "zero_count" else getattr(p, field)
                    if hasattr(p, "positive"):
                        summary["positive"] = (p.positive.offset, list(p.positive.bucket_counts))
                    out[key] = summary
    return out


def _batches(seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(40):
        values = [rng.expovariate(30.0) for _ in range(rng.randint(1, 50))]
        out.append(values)
    return out


def _record_both(fast_hists, public_hists, batches):
    recorder = HistogramRecorder()
    for i, values in enumerate(batches):
        attrs = ATTRS if i % 3 else OTHER
        fh, ph = fast_hists[i % 2], public_hists[i % 2]
        recorder.record_points([(fh, attrs, values), (fast_hists[1 - i % 2], ATTRS, values[:1])])
        for v in values:
            ph.record(v, attrs)
        public_hists[1 - i % 2].record(values[0], ATTRS)
    return recorder


@pytest.mark.parametrize("temporality", [None, AggregationTemporality.DELTA])
def test_same_points_as_public_record(temporality):
    _, fast_reader, fast_hists = _provider(temporality)
    _, public_reader, public_hists = _provider(temporality)
    recorder = _record_both(fast_hists, public_hists, _batches())
    assert recorder.fast, recorder.fallback_reason
    fast, public = _points(fast_reader), _points(public_reader)
    assert fast and fast == public
    # A second interval: delta readers start from zero, cumulative ones keep adding.
    _record_both(fast_hists, public_hists, _batches(1))
    assert _points(fast_reader) == _points(public_reader)


def test_views_attribute_filter_and_other_aggregation():
    views = [View(instrument_name="a", attribute_keys={"gen_ai.operation.name"}),
             View(instrument_name="b", aggregation=ExponentialBucketHistogramAggregation())]
    _, fast_reader, fast_hists = _provider(views=views)
    _, public_reader, public_hists = _provider(views=views)
    _record_both(fast_hists, public_hists, _batches(2))
    fast = _points(fast_reader)
    assert fast == _points(public_reader)
    assert {attrs for name, attrs in fast if name == "a"} == {(("gen_ai.operation.name", "chat"),)}
    assert any("positive" in summary for summary in fast.values())  # the exponential view applied


def test_exemplars_offered_like_public_record():
    _, fast_reader, fast_hists = _provider(exemplar_filter=AlwaysOnExemplarFilter())
    _, public_reader, public_hists = _provider(exemplar_filter=AlwaysOnExemplarFilter())
    values = [0.001 * (i + 1) for i in range(5)]
    HistogramRecorder().record_points([(fast_hists[0], ATTRS, values)])
    for v in values:
        public_hists[0].record(v, ATTRS)
    fast, public = _points(fast_reader), _points(public_reader)
    assert fast == public
    assert next(iter(fast.values()))["exemplars"]  # the always-on filter kept some


def test_drops_what_public_record_drops():
    _, reader, (hist, _) = _provider()
    HistogramRecorder().record_points([(hist, ATTRS, [-1.0, math.nan, math.inf, 0.0, 0.5])])
    (summary,) = _points(reader).values()
    assert summary["count"] == 2 and summary["sum"] == 0.5


def test_noop_and_proxy_meters_take_the_public_path():
    from opentelemetry.metrics import NoOpMeterProvider

    hist = NoOpMeterProvider().get_meter("x").create_histogram("h")
    recorder = HistogramRecorder()
    recorder.record_points([(hist, ATTRS, [0.1, 0.2])])  # must not raise
    assert recorder.fast  # not a reason to give up the shortcut for SDK instruments


def test_unexpected_sdk_shape_falls_back_for_good(monkeypatch):
    _, reader, (hist, _) = _provider()

    def broken(_attributes):
        raise TypeError("internals changed")

    monkeypatch.setattr(_histograms, "_hash_attributes", broken)
    recorder = HistogramRecorder()
    recorder.record_points([(hist, ATTRS, [0.1, 0.2, 0.3])])
    assert not recorder.fast and "internals changed" in recorder.fallback_reason
    (summary,) = _points(reader).values()
    assert summary["count"] == 3  # nothing lost, nothing counted twice
    recorder.record_points([(hist, ATTRS, [0.4])])
    assert next(iter(_points(reader).values()))["count"] == 4


def test_concurrent_records_and_delta_collects_lose_nothing():
    _, reader, (hist, _) = _provider(AggregationTemporality.DELTA)
    recorder = HistogramRecorder()
    per_thread, batch = 200, 25
    collected = []
    stop = threading.Event()

    def collect_loop():
        while not stop.is_set():
            collected.extend(_points(reader).values())

    def worker():
        for _ in range(per_thread):
            recorder.record_points([(hist, ATTRS, [0.01] * batch)])

    collector = threading.Thread(target=collect_loop)
    collector.start()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    collector.join()
    collected.extend(_points(reader).values())
    assert sum(s["count"] for s in collected) == 4 * per_thread * batch


def test_one_batch_of_many_requests_matches_sequential_records():
    """The finishing worker hands over hundreds of requests' points at once, interleaved."""
    _, fast_reader, fast_hists = _provider()
    _, public_reader, public_hists = _provider()
    rng = random.Random(3)
    points, sequence = [], []
    for i in range(300):
        attrs = dict(ATTRS) if i % 4 else {**OTHER}  # fresh dicts per request, as the recorder makes
        which = rng.randrange(2)
        values = [rng.uniform(0, 2) for _ in range(rng.choice([1, 1, 7]))]
        points.append((fast_hists[which], attrs, values))
        sequence.append((public_hists[which], attrs, values))
    HistogramRecorder().record_points(points)
    for hist, attrs, values in sequence:
        for v in values:
            hist.record(v, attrs)
    fast = _points(fast_reader)
    assert len(fast) == 4 and fast == _points(public_reader)


def test_stats_say_which_path_the_histogram_values_take(clean_env):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader as Reader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edgesdk import telemetry

    telemetry.configure(span_exporter=InMemorySpanExporter(), metric_reader=Reader())
    assert telemetry.stats()["metrics_fast_path"] is True


def test_self_check_turns_the_shortcut_off_when_it_disagrees_with_the_sdk(monkeypatch):
    assert _histograms.self_check() is None  # the pinned SDK: they agree

    def wrong_fold(aggregation, values):  # forgets min/max, as a changed SDK might make us do
        with aggregation._lock:
            counts = aggregation._value or aggregation._get_empty_bucket_counts()
            aggregation._value = counts
            for v in values:
                aggregation._sum += v
                counts[_histograms.bisect_left(aggregation._boundaries, v)] += 1

    monkeypatch.setattr(_histograms, "_fold_explicit", wrong_fold)
    monkeypatch.setattr(_histograms, "_SELF_CHECK", [])
    recorder = HistogramRecorder()
    assert not recorder.fast and "self-check" in recorder.fallback_reason
    _, reader, (hist, _) = _provider()
    recorder.record_points([(hist, ATTRS, [0.1, 0.2])])
    (summary,) = _points(reader).values()
    assert summary["count"] == 2 and summary["min"] == 0.1 and summary["max"] == 0.2
