# SPDX-License-Identifier: Apache-2.0
"""Figures quoted in the docs agree with the results files they cite (tools/bench/results/*.json).

One row per figure: (doc, regex whose group 1 is the number as the doc prints it, results file, key path).
The first match in the doc must equal the file's value rounded to the digits the doc shows. A regex that no longer
matches fails too: when a doc is reworded or a benchmark re-run, update the doc from the file and this
table with it. Rows whose results file does not exist are skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "tools" / "bench" / "results"

N = r"([0-9]+(?:\.[0-9]+)?)"  # a figure as printed

# (doc, regex with the figure as group 1, results file, key path in the JSON; "-key" negates)
FIGURES: list[tuple[str, str, str, str]] = [
    # the CPU serving curve at stop 44
    ("docs/benchmarks.md", rf"\| tok/s \(stop 44\) \| {N} \|", "serve_curve_cpu_stop44.json", "curve.edgesdk.0.tok_s"),
    (
        "docs/benchmarks.md",
        rf"\| tok/s \(stop 44\) \| [0-9.]+ \| {N} \|",
        "serve_curve_cpu_stop44.json",
        "curve.edgesdk.1.tok_s",
    ),
    (
        "docs/benchmarks.md",
        rf"first short one admitted got its first token in\s+\*\*{N} ms",
        "serve_curve_cpu_stop44.json",
        "mixed.edgesdk.short_behind_long_ttft_ms.3",
    ),
    # the CPU serving curve at stop 45 (after the thread rule)
    (
        "docs/benchmarks.md",
        rf"\| tok/s \(stop 45\) \| [0-9.]+ \| {N} \|",
        "serve_curve_cpu_stop45.json",
        "curve.edgesdk.1.tok_s",
    ),
    (
        "docs/benchmarks.md",
        rf"the first short one behind the three 1,120-token prompts got its first token in\s+\*\*{N} ms",
        "serve_curve_cpu_stop45.json",
        "mixed.edgesdk.short_behind_long_ttft_ms.0",
    ),
    # the GPU smoke of e840620 (H100): curve, mixed load, prompt lookup
    (
        "docs/benchmarks.md",
        rf"\| tok/s \(H100, `e840620`\) \| [0-9.,]+ \| {N} \|",
        "serve_curve_h100_smoke_e840620.json",
        "curve.edgesdk.1.tok_s",
    ),
    (
        "docs/benchmarks.md",
        rf"behind the long ones p50 {N} ms",
        "serve_curve_h100_smoke_e840620.json",
        "mixed.edgesdk.short_behind_long_ttft_p50_ms",
    ),
    (
        "docs/benchmarks.md",
        rf"\| input-grounded \(10\) \| [0-9.]+ tok/s \| [0-9.]+ \([0-9.]+×\) \| [0-9.]+ \({N}×\)",
        "speculative_h100_smoke_e840620.json",
        "sets.grounded.auto.ratio_vs_off",
    ),
    # P1: INT8 MiniLM vs FP32 ORT
    (
        "docs/benchmarks.md",
        rf"\| \*\*P1\*\* \|[^\n]*?\| \*\*{N}×\*\*",
        "p1_int8.json",
        "results.ours_unfused.ratio_vs_fp32",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P1\*\* \|[^\n]*?\(paired {N}×\)",
        "p1_int8.json",
        "results.ours_unfused.paired_ratio_vs_fp32",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P1\*\* \|[^\n]*?at \*\*min cosine {N}\*\*",
        "p1_int8.json",
        "results.ours_unfused.min_cosine",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P1\*\* \|[^\n]*?preset in the same run: {N}×",
        "p1_int8.json",
        "results.optimum_avx512_vnni.ratio_vs_fp32",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P1\*\* \|[^\n]*?preset in the same run: [\d.]+× at {N}",
        "p1_int8.json",
        "results.optimum_avx512_vnni.min_cosine",
    ),
    ("docs/benchmarks.md", rf"the same models then measure {N} ms \(FP32\)", "p1_int8.json", "results.fp32.p50_ms"),
    (
        "docs/benchmarks.md",
        rf"the same models then measure [\d.]+ ms \(FP32\) and {N} ms \(INT8\)",
        "p1_int8.json",
        "results.ours_unfused.p50_ms",
    ),
    ("README.md", rf"\| P1 [^\n]*?\| {N}×", "p1_int8.json", "results.ours_unfused.ratio_vs_fp32"),
    ("README.md", rf"\| P1 [^\n]*?\| [\d.]+× at min cosine {N}", "p1_int8.json", "results.ours_unfused.min_cosine"),
    ("README.md", rf"\| P1 [^\n]*?optimum preset: {N}×", "p1_int8.json", "results.optimum_avx512_vnni.ratio_vs_fp32"),
    (
        "README.md",
        rf"\| P1 [^\n]*?optimum preset: [\d.]+× at {N}",
        "p1_int8.json",
        "results.optimum_avx512_vnni.min_cosine",
    ),
    ("docs/int8.md", rf"\*\*edgesdk INT8\*\*[^\n]*?\| {N} \|", "p1_int8.json", "results.ours_unfused.p50_ms"),
    (
        "docs/int8.md",
        rf"\*\*edgesdk INT8\*\*[^\n]*?\| [\d.]+ \| \*\*{N}\*\*",
        "p1_int8.json",
        "results.ours_unfused.ratio_vs_fp32",
    ),
    (
        "docs/int8.md",
        rf"\*\*edgesdk INT8\*\*[^\n]*?\| [\d.]+ \| \*\*[\d.]+\*\* \| {N} \|",
        "p1_int8.json",
        "results.ours_unfused.paired_ratio_vs_fp32",
    ),
    (
        "docs/int8.md",
        rf"\*\*edgesdk INT8\*\*[^\n]*?\|[^\n]*?\|[^\n]*?\|[^\n]*?\| \*\*{N}\*\*",
        "p1_int8.json",
        "results.ours_unfused.min_cosine",
    ),
    ("docs/int8.md", rf"\| FP32, optimum export \| {N} \| 1\.000", "p1_int8.json", "results.fp32.p50_ms"),
    # P2: runtime overhead, ONNX and GGUF
    ("docs/benchmarks.md", rf"\| \*\*P2\*\* \(ONNX\) \|[^\n]*?\| \*\*{N}×\*\*", "p2_onnx.json", "ratio"),
    ("docs/benchmarks.md", rf"\| \*\*P2\*\* \(ONNX\) \|[^\n]*?\(p50 {N} vs", "p2_onnx.json", "edgesdk_p50_ms"),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P2\*\* \(ONNX\) \|[^\n]*?\(p50 [\d.]+ vs {N} ms",
        "p2_onnx.json",
        "bare_ort_p50_ms",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P2\*\* \(GGUF\) \|[^\n]*?\| \*\*{N}×\*\*",
        "p2_gguf_engine.json",
        "ratio_vs_anchor",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P2\*\* \(GGUF\) \|[^\n]*?per generated token through the one engine \({N} interleaved rounds",
        "p2_gguf_engine.json",
        "rounds",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P2\*\* \(GGUF\) \|[^\n]*?own `Llama.generate` loop, \*\*{N}×\*\* \(",
        "p2_gguf.json",
        "ratio_vs_anchor",
    ),
    ("README.md", rf"\| P2 [^\n]*?\| ONNX {N}×", "p2_onnx.json", "ratio"),
    ("README.md", rf"\| P2 [^\n]*?GGUF \(telemetry on\) {N}×", "p2_gguf.json", "ratio_vs_anchor"),
    (
        "docs/gguf.md",
        rf"\*\*P2 \(GGUF half\)\*\*.*?\*\*{N}× the faster bare variant\*\*",
        "p2_gguf.json",
        "ratio_vs_anchor",
    ),
    (
        "docs/gguf.md",
        rf"\*\*P2 \(GGUF half\)\*\*.*?OTLP-JSON lines {N} ms/token",
        "p2_gguf.json",
        "median_ms_per_token.edgesdk",
    ),
    (
        "docs/gguf.md",
        rf"\*\*P2 \(GGUF half\)\*\*.*?bare `create_completion`\s+{N}",
        "p2_gguf.json",
        "median_ms_per_token.bare_completion",
    ),
    (
        "docs/gguf.md",
        rf"\*\*P2 \(GGUF half\)\*\*.*?bare\s+`Llama.generate` loop {N}",
        "p2_gguf.json",
        "median_ms_per_token.bare_generate",
    ),
    ("docs/gguf.md", rf"\*\*P2 \(GGUF half\)\*\*.*?per request, {N} interleaved rounds", "p2_gguf.json", "rounds"),
    # P3: build wall / RSS vs optimum
    ("docs/benchmarks.md", rf"\| \*\*P3\*\* \|[^\n]*?\| \*\*{N}× wall\*\*", "p3_build.json", "wall_ratio"),
    ("docs/benchmarks.md", rf"\| \*\*P3\*\* \|[^\n]*?wall\*\* \({N} vs", "p3_build.json", "edgesdk.wall_s"),
    ("docs/benchmarks.md", rf"\| \*\*P3\*\* \|[^\n]*?wall\*\* \([\d.]+ vs {N} s\)", "p3_build.json", "optimum.wall_s"),
    ("docs/benchmarks.md", rf"\| \*\*P3\*\* \|[^\n]*?\*\*{N}× peak RSS\*\*", "p3_build.json", "rss_ratio"),
    ("docs/benchmarks.md", rf"\| \*\*P3\*\* \|[^\n]*?peak RSS\*\* \({N} vs", "p3_build.json", "edgesdk.peak_rss_gb"),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P3\*\* \|[^\n]*?peak RSS\*\* \([\d.]+ vs {N} GB\)",
        "p3_build.json",
        "optimum.peak_rss_gb",
    ),
    ("README.md", rf"\| P3 [^\n]*?\| {N}× wall", "p3_build.json", "wall_ratio"),
    ("README.md", rf"\| P3 [^\n]*?\| [\d.]+× wall, {N}× peak RSS", "p3_build.json", "rss_ratio"),
    # P4: planner vs the best bare setting of a sweep on the H200 (medians, token ids in)
    (
        "docs/benchmarks.md",
        rf"\| \*\*P4\*\* \|[^\n]*?F16 \(2026-12-03, `9527537`\): prefill \*\*{N}×\*\*",
        "p4_h200_sweep_l16_f16_v2.json",
        "shapes.l16.results.F16.ratios.prefill_ids",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P4\*\* \|[^\n]*?1,536-token prefill \*\*{N}×\*\*",
        "p4_h200_sweep_l16_f16_v2.json",
        "shapes.l16.results.F16.ratios.long_prefill_ids",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P4\*\* \|[^\n]*?decode \*\*{N}×\*\* \(804 tok/s\)",
        "p4_h200_sweep_l16_f16_v2.json",
        "shapes.l16.results.F16.ratios.decode_ids",
    ),
    (
        "README.md",
        rf"\| P4 [^\n]*?\| prefill {N}×",
        "p4_h200_sweep_l16_f16_v2.json",
        "shapes.l16.results.F16.ratios.prefill_ids",
    ),
    (
        "README.md",
        rf"\| P4 [^\n]*?, decode {N}×",
        "p4_h200_sweep_l16_f16_v2.json",
        "shapes.l16.results.F16.ratios.decode_ids",
    ),
    # P5: license check vs ScanCode
    (
        "docs/benchmarks.md",
        rf"\| \*\*P5\*\* \|[^\n]*?\| \*\*{N} s\*\* \(median of 3\)",
        "p5_licenses.json",
        "ours.median_wall_s",
    ),
    ("docs/benchmarks.md", rf"\| \*\*P5\*\* \|[^\n]*?\(median of 3\) vs {N} s", "p5_licenses.json", "scancode.wall_s"),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P5\*\* \|[^\n]*?MiniLM bundle \+ {N} installed distributions",
        "p5_licenses.json",
        "inputs.distributions",
    ),
    ("README.md", rf"\| P5 [^\n]*?\| {N} s vs", "p5_licenses.json", "ours.median_wall_s"),
    ("README.md", rf"\| P5 [^\n]*?\| [\d.]+ s vs {N} s", "p5_licenses.json", "scancode.wall_s"),
    # the profiler on the H200
    (
        "docs/profiler.md",
        rf"Torch\s+eager, batch 1, seq 128: FP32 p50 {N} ms",
        "profiler_h200_torch.json",
        "torch_eager_fp32.latency_ms.p50",
    ),
    (
        "docs/profiler.md",
        rf"Torch\s+eager, batch 1, seq 128: FP32 p50 [\d.]+ ms, FP16 {N} ms",
        "profiler_h200_torch.json",
        "torch_eager_fp16.latency_ms.p50",
    ),
    (
        "docs/profiler.md",
        rf"profiler overhead −{N} %",
        "profiler_h200_torch.json",
        "-torch_eager_fp32.overhead.overhead_pct",
    ),
    (
        "docs/profiler.md",
        rf"profiler overhead −[\d.]+ % / −{N} %",
        "profiler_h200_torch.json",
        "-torch_eager_fp16.overhead.overhead_pct",
    ),
    # profiler overhead, eager fallback
    ("docs/benchmarks.md", rf"\| profiler \|[^\n]*?\| \*\*\+{N} %\*\*", "profiler_overhead.json", "overhead_pct"),
    (
        "docs/profiler.md",
        rf"profiler_overhead\.json`: profiler overhead.*?\+{N} %",
        "profiler_overhead.json",
        "overhead_pct",
    ),
    (
        "docs/benchmarks.md",
        rf"\| eager \|[^\n]*?\| \*\*{N}×\*\* slower",
        "eager_fallback.json",
        "ratio_eager_vs_anchor_p50",
    ),
    ("docs/benchmarks.md", rf"\| eager \|[^\n]*?slower \({N} vs", "eager_fallback.json", "torch_export_eager_ms.p50"),
    (
        "docs/benchmarks.md",
        rf"\| eager \|[^\n]*?slower \([\d.]+ vs {N} ms",
        "eager_fallback.json",
        "anchor_ort_cpu_ms.p50",
    ),
    # VLM (issue 15): the summary row of docs/benchmarks.md
    (
        "docs/benchmarks.md",
        rf"\| \*\*VLM\*\* \|[^\n]*?end to end \*\*{N}×\*\* all-4-bit",
        "vlm_cpu.json",
        "ratios.mixed_over_all_4bit_e2e",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*VLM\*\* \|[^\n]*?encoder min cosine \*\*{N}\*\*",
        "vlm_cpu.json",
        "ratios.encoder_cosine_mixed_vs_pytorch",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*VLM\*\* \|[^\n]*?\(all-4-bit {N}\)",
        "vlm_cpu.json",
        "ratios.encoder_cosine_all_4bit_vs_pytorch",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*VLM\*\* \|[^\n]*?TTFT reuse \*\*{N}×\*\*",
        "vlm_cpu.json",
        "ratios.ttft_reuse_mixed_q1_over_q2n",
    ),
    # embed() memory (issue 14)
    ("docs/benchmarks.md", rf"grouped by length\) \| {N} MiB", "embed_memory.json", "runs.0.embed_peak_above_load_mib"),
    (
        "docs/benchmarks.md",
        rf"unchunked call costs\) \| {N} MiB",
        "embed_memory.json",
        "runs.1.embed_peak_above_load_mib",
    ),
    # P6 (issue 11): telemetry overhead, quiet run
    (
        "docs/benchmarks.md",
        rf"\| \*\*P6\*\* \|[^\n]*?file exporter: \*\*{N} µs",
        "p6_telemetry.json",
        "embed.telemetry_process_cpu_us",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P6\*\* \|[^\n]*?SDK recording alone {N} µs",
        "p6_telemetry_null.json",
        "embed.telemetry_process_cpu_us",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*P6\*\* \|[^\n]*?streaming \*\*{N} µs/token",
        "p6_telemetry.json",
        "stream.per_token_beyond_sdk_us",
    ),
    (
        "docs/telemetry.md",
        rf"\| file \(OTLP-JSON lines\) \| [\d.]+ µs wall, [\d.]+ µs CPU \| {N} µs",
        "p6_telemetry.json",
        "embed.telemetry_process_cpu_us",
    ),
    (
        "docs/telemetry.md",
        rf"\| null \(SDK recording only\) \| [\d.]+ µs wall, [\d.]+ µs CPU \| {N} µs",
        "p6_telemetry_null.json",
        "embed.telemetry_process_cpu_us",
    ),
    ("README.md", rf"\| P6 telemetry \|[^\n]*?: {N} µs = ", "p6_telemetry.json", "embed.telemetry_process_cpu_us"),
    # issue 21: Gemma-3 vision on the CPU (results.1 = gemma3, results.0 = LLaVA-SigLIP in the same run)
    (
        "docs/benchmarks.md",
        rf"\| Gemma-3 \| mmproj[^\n]*?\| {N} / [\d.]+ \| [\d.]+ / [\d.]+ \|",
        "vlm_families_gemma3_cpu.json",
        "results.1.ttft_ms_median",
    ),
    (
        "docs/benchmarks.md",
        rf"\| Gemma-3 \| mmproj[^\n]*?\| [\d.]+ / [\d.]+ \| {N} / [\d.]+ \|",
        "vlm_families_gemma3_cpu.json",
        "results.1.decode_tok_s_median",
    ),
    (
        "docs/benchmarks.md",
        rf"\| LLaVA, SigLIP \(same run\) \|[^\n]*?\| {N} / [\d.]+ \| [\d.]+ / [\d.]+ \|",
        "vlm_families_gemma3_cpu.json",
        "results.0.ttft_ms_median",
    ),
    # serving on the H200 (issue 20)
    (
        "docs/benchmarks.md",
        rf"\| \*\*serve\*\* \|[^\n]*?steady load \*\*{N}×\*\*",
        "serve_load_h200.json",
        "ratio_16_vs_1_client",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*serve\*\* \|[^\n]*?TTFT p50 {N}× one client",
        "serve_load_h200.json",
        "ttft_ratio_16_vs_1_client",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*serve\*\* \|[^\n]*?\*\*{N}×\*\* at 16 clients",
        "serve_llm_h200_vs_llama_server.json",
        "throughput.16.ratio_vs_llama_server",
    ),
    (
        "docs/benchmarks.md",
        rf"\| \*\*serve\*\* \|[^\n]*?at 16 clients, {N}× at 1",
        "serve_llm_h200_vs_llama_server.json",
        "throughput.1.ratio_vs_llama_server",
    ),
    ("docs/benchmarks.md", rf"\| 16 \| 3,813\.1 \| \*\*{N}×\*\*", "serve_load_h200.json", "ratio_16_vs_1_client"),
    (
        "docs/benchmarks.md",
        rf"\| 16 \| [\d,.]+ \| \*\*[\d.]+×\*\* \| {N} ms",
        "serve_load_h200.json",
        "rows.1.ttft_p50_ms",
    ),
    (
        "docs/benchmarks.md",
        rf"the GPU default since `e413068`\) \| [\d,.]+ \| \*\*{N}×\*\*",
        "batching_h200_mixed.json",
        "results.1.ratio",
    ),
    ("docs/benchmarks.md", rf"the CPU default;[^\n]*?\| [\d,.]+ \| {N}×", "batching_h200_pps1.json", "results.1.ratio"),
    (
        "docs/benchmarks.md",
        rf"one unified KV stream \(`kv_unified`\) \| [\d,.]+ \| {N}×",
        "batching_h200_mixed_kvu.json",
        "results.1.ratio",
    ),
    (
        "docs/benchmarks.md",
        rf"in a decode of their own \| [\d,.]+ \| {N}×",
        "batching_h200_pps16.json",
        "results.1.ratio",
    ),
    (
        "docs/benchmarks.md",
        rf"\| 16 \| 2,824\.8 tok/s \|[^\n]*?\| \*\*{N}×\*\*",
        "serve_llm_h200_vs_llama_server.json",
        "throughput.16.ratio_vs_llama_server",
    ),
    (
        "docs/vlm.md",
        rf"image features, min cosine per image token \(max abs\) \| {N} \(",
        "vlm_gemma3_parity_f16.json",
        "builds.transformers4.encoder_min_cosine",
    ),
    (
        "docs/vlm.md",
        rf"image features, min cosine per image token \(max abs\) \| [\d.]+ \([\d.]+\) \| {N} \(",
        "vlm_gemma3_parity_f16.json",
        "builds.transformers5.encoder_min_cosine",
    ),
    # VLM image chats through the one engine (issue 35)
    (
        "docs/benchmarks.md",
        rf"\| 4 \| {N} \| [\d.]+× \| [\d.]+ \| [\d.]+× \| [\d.]+ \|",
        "vlm_concurrency_cpu.json",
        "concurrency.2.tok_s",
    ),
    (
        "docs/benchmarks.md",
        rf"\| 4 \| [\d.]+ \| [\d.]+× \| [\d.]+ \| [\d.]+× \| [\d.]+ \| {N}×",
        "vlm_concurrency_cpu.json",
        "concurrency.8.ratio_vs_1_client",
    ),
    (
        "docs/benchmarks.md",
        rf"alternating rounds: \*\*[\d.]+ ms vs {N} ms",
        "vlm_concurrency_cpu.json",
        "ttft.cold_ms_median",
    ),
    (
        "docs/benchmarks.md",
        rf"\*\*[\d.]+ ms vs [\d.]+ ms, {N}× lower\*\*",
        "vlm_concurrency_cpu.json",
        "ttft.cold_over_repeated",
    ),
]


def _value(data, path: str):
    """The number at ``a.b.0.c``; a leading ``-`` negates it (the doc prints the sign as text: "−6.6 %")."""
    if path.startswith("-"):
        return -_value(data, path[1:])
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


@pytest.mark.parametrize("doc,pattern,results,key", FIGURES, ids=[f"{d}:{r}:{k}" for d, _, r, k in FIGURES])
def test_doc_figure_matches_results_file(doc: str, pattern: str, results: str, key: str):
    path = RESULTS / results
    if not path.exists():
        pytest.skip(f"{results} is not in tools/bench/results")
    text = (REPO / doc).read_text(encoding="utf-8")
    match = re.search(pattern, text, flags=re.S)
    assert match, (
        f"{doc} no longer quotes this figure ({pattern!r}): update the doc from {results} "
        "and this row of tests/test_docs_figures.py"
    )
    value = float(_value(json.loads(path.read_text()), key))
    shown = match.group(1)
    digits = len(shown.partition(".")[2])
    assert abs(float(shown) - value) <= 0.5 * 10**-digits + 1e-9, (
        f"{doc} says {shown}, {results} {key} = {value} (would print {value:.{digits}f})"
    )


def test_every_cited_results_file_exists():
    """A doc that names tools/bench/results/X cites a file that is there."""
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for name in re.findall(r"tools/bench/results/([\w.-]+\.(?:json|md))", doc.read_text(encoding="utf-8")):
            if not (RESULTS / name).exists():
                missing.append(f"{doc.relative_to(REPO)}: {name}")
    assert not missing, missing
