# SPDX-License-Identifier: Apache-2.0
"""``edgesdk check traces`` keeps bounded state whatever the file (issue 25, "also open": a gzip bomb).

A bomb of one endless line and a huge single document are refused early (tests/test_reliability_r2_inputs.py).
A bomb of *valid* lines is read to its end, so what the checker keeps per span must be bounded: a span
seen again under the same ids is kept once, at most ``max_tracked_spans`` distinct spans are kept for
the parent checks, at most ``max_finding_groups`` distinct findings are listed, and over-long names and
ids are not kept whole.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
from cli_fixtures import check_traces_peak_rss_mb

from edgesdk.tracecheck import check_trace_file

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _span(
    name: str, span_id: str, attrs: dict, *, parent: str = "", trace: str = TRACE, start: int = 100, end: int = 200
) -> dict:
    return {
        "traceId": trace,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [
            {"key": k, "value": {"stringValue": v} if isinstance(v, str) else {"intValue": str(v)}}
            for k, v in attrs.items()
        ],
    }


def _line(spans: list[dict]) -> str:
    return (
        json.dumps(
            {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]},
            separators=(",", ":"),
        )
        + "\n"
    )


BUILD_STAGE = {"edgesdk.build.stage": "convert", "edgesdk.build.stage.outcome": "ok"}
GENAI = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "llama.cpp", "gen_ai.request.model": "m"}


@pytest.mark.slow
def test_gzip_bomb_of_repeated_valid_lines_is_checked_in_bounded_memory(tmp_path):
    """300 identical lines of 1,000 identical build-stage spans (a ~0.4 MB gzip, 60 MB of text). Before,
    every stage span was kept whole for the parent check (~1.2 KB each: peak RSS +365 MB here, a MemoryError long
    before the 16 GiB read limit); now a span seen again is the same span."""
    bomb = tmp_path / "bomb.jsonl.gz"
    line = _line([_span("edgesdk.build.convert", "00f067aa0ba902b7", BUILD_STAGE, parent="00000000000000aa")] * 1000)
    with gzip.open(bomb, "wt", compresslevel=9) as out:
        for _ in range(300):
            out.write(line)
    assert bomb.stat().st_size < 1 << 20
    small = tmp_path / "small.jsonl"
    small.write_text(line)
    base, _ = check_traces_peak_rss_mb(small)
    peak, res = check_traces_peak_rss_mb(bomb)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "300000 spans (0 GenAI, 300000 build)" in res.stdout, res.stdout[-2000:]
    assert peak - base < 60, (peak, base)  # measured: +365 MB before, +1.6 MB after


def _stage_file(path: Path, n: int) -> Path:
    """``n`` build-stage spans with distinct ids, each a child of the build span at the end of the file."""
    with open(path, "w") as out:
        for start in range(0, n, 1000):
            out.write(
                _line(
                    [
                        _span("edgesdk.build.convert", f"{i + 1:016x}", BUILD_STAGE, parent="ffffffffffffff00")
                        for i in range(start, min(n, start + 1000))
                    ]
                )
            )
        out.write(
            _line(
                [
                    _span(
                        "edgesdk.build",
                        "ffffffffffffff00",
                        {"edgesdk.build.model": "m", "edgesdk.device.profile": "orin", "edgesdk.build.outcome": "ok"},
                    )
                ]
            )
        )
    return path


def _traced_peak(path: Path, **limits) -> tuple[int, object]:
    tracemalloc.start()
    try:
        report = check_trace_file(path, **limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, report


@pytest.mark.slow
def test_distinct_spans_kept_for_parent_checks_are_capped(tmp_path):
    """30,000 distinct stage spans: with the cap at 2,000 the checker's memory stays a fraction of what
    keeping all of them takes, every span is still checked, and the report says the parent checks were
    partial instead of calling the parents it did not keep missing."""
    path = _stage_file(tmp_path / "stages.jsonl", 30_000)
    full_peak, full = _traced_peak(path)
    capped_peak, capped = _traced_peak(path, max_tracked_spans=2_000)
    assert full.spans == capped.spans == 30_001 and full.build_spans == capped.build_spans == 30_001
    assert not full.fails() and not capped.fails(), capped.findings
    assert not [f for f in full.findings if f.rule == "parent_checks_partial"]
    partial = [f for f in capped.findings if f.rule == "parent_checks_partial"]
    assert len(partial) == 1 and partial[0].level == "information"
    assert "covered the first 2,000; 28,001 spans were not kept" in partial[0].message
    assert capped_peak < full_peak / 2, (capped_peak, full_peak)  # measured: 6.8 vs 21.6 MiB


def test_inference_stage_whose_parent_was_not_kept_is_not_called_missing(tmp_path):
    """A stage span kept before the cap whose GenAI parent comes after it: no false 'not in this file';
    a stage whose parent really is missing is still a violation when everything was kept."""
    stages = [
        _span(
            "decode",
            f"{i + 1:016x}",
            {"edgesdk.inference.stage": "decode"},
            parent="00000000000000aa",
            start=120,
            end=180,
        )
        for i in range(10)
    ]
    parent = _span("chat m", "00000000000000aa", GENAI, start=100, end=200)
    path = tmp_path / "t.jsonl"
    path.write_text(_line(stages) + _line([parent]))
    assert not check_trace_file(path).fails()
    capped = check_trace_file(path, max_tracked_spans=5)
    assert not capped.fails(), capped.findings
    assert [f.rule for f in capped.findings if f.level == "information"].count("parent_checks_partial") == 1
    path.write_text(_line(stages))  # no parent at all, all kept: the violation stands
    missing = check_trace_file(path)
    assert missing.fails() and any("is not in trace" in f.message for f in missing.findings)


def test_distinct_findings_are_capped_and_counted(tmp_path):
    """5,000 spans each with its own finding (an unknown stage value quoted in the message): with 100
    groups listed, the rest are counted under their level and rule; the totals and verdict are kept."""
    spans = [
        _span(f"stage-{i}", f"{i + 1:016x}", {"edgesdk.inference.stage": f"s{i}"}, parent="ffffffffffffff00")
        for i in range(5_000)
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(_line(spans[i : i + 500]) for i in range(0, len(spans), 500)))
    full = check_trace_file(path)
    capped = check_trace_file(path, max_finding_groups=100)
    assert len(full.findings) > 5_000
    assert len(capped.findings) <= 100 + 5
    assert capped.count("violation") == full.count("violation") and capped.fails()
    folded = [f for f in capped.findings if f.message.startswith("further distinct inference_stage findings")]
    assert len(folded) == 1 and folded[0].count > 4_000


def test_over_long_names_and_ids_are_not_kept_whole(tmp_path):
    """Ids and names of 100,000 characters: the parent check still pairs a stage with its build span
    (same long trace id), and findings carry shortened names and ids."""
    trace = "f" * 100_000
    root = _span(
        "edgesdk.build",
        "00000000000000aa",
        {"edgesdk.build.model": "m", "edgesdk.device.profile": "o", "edgesdk.build.outcome": "ok"},
        trace=trace,
    )
    other = _span("x" * 100_000, "00000000000000bb", {}, trace=trace)
    good = _span("edgesdk.build.convert", "0000000000000001", BUILD_STAGE, parent="00000000000000aa", trace=trace)
    bad = _span("edgesdk.build.convert", "0000000000000002", BUILD_STAGE, parent="00000000000000bb", trace=trace)
    path = tmp_path / "t.jsonl"
    path.write_text(_line([good, bad, root, other]))
    report = check_trace_file(path)
    wrong = [f for f in report.findings if "parent should be" in f.message]
    assert len(wrong) == 1 and wrong[0].count == 1, report.findings
    assert len(wrong[0].message) < 1100 and len(wrong[0].trace_id) <= 64
    assert all(len(f.span) <= 128 for f in report.findings)
