# SPDX-License-Identifier: Apache-2.0
"""Summarise the H200 profiler run (tools/device/profiler_gpu.sh) into a markdown table.

Reads tools/bench/results/profiler_h200_torch.json and profiler_h200_gguf_{q4_k_m,f16}.json and writes
tools/bench/results/profiler_h200_summary.md: measured figures, the h200 prediction made with the
efficiency table as committed before the run (out-of-sample), its error, and what the measurement
implies for calibration (efficiency for encoders; launch cost per layer for llama.cpp decode).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def main() -> int:
    global RESULTS
    if len(sys.argv) > 1:  # another results folder (a dry run's)
        RESULTS = Path(sys.argv[1])
    lines = ["<!-- SPDX-License-Identifier: Apache-2.0 -->", "# Profiler on the H200 (issue 7)", ""]
    torch_run = _load("profiler_h200_torch.json")
    if torch_run:
        det = torch_run["detection"]
        lines += [
            f"Run {torch_run['created']}: detected **{det['best_match']}** (confidence {det['confidence']}); "
            f"evidence: {'; '.join(det['evidence'])}.",
            f"Versions: {json.dumps(torch_run['versions'])}. GPU copy bandwidth: "
            + (
                f"{bw['value_gbps']:.0f} GB/s ({bw['method']})."
                if (bw := torch_run.get("gpu_copy_bandwidth"))
                else "not measured (no GPU)."
            ),
            "",
            "## Torch CUDA eager, MiniLM-shaped BERT (random weights), batch 1, seq 128",
            "",
            "| dtype | p50 ms | p99 ms | CV % | profiler overhead % | device peak MB | h200 predicted ms "
            "| error % | efficiency used | implied efficiency |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for dt in ("fp32", "fp16"):
            r = torch_run.get(f"torch_eager_{dt}")
            if not r:
                continue
            lat, enc = r["latency_ms"], r["prediction"]["encoder"]
            lines.append(
                f"| {dt} | {lat['p50']:.3f} | {lat['p99']:.3f} | {lat['cv_pct']:.1f} | "
                f"{r['overhead']['overhead_pct']:+.2f} | {r['device_memory_peak_mb'] or float('nan'):.0f} | "
                f"{enc['latency_ms']:.3f} | {r['prediction_error_pct']:+.1f} | {enc['efficiency']} "
                f"({enc['efficiency_source']}) | {r['implied_efficiency']:.5f} |"
            )
        lines.append("")
    for quant in ("q4_k_m", "f16"):
        rep = _load(f"profiler_h200_gguf_{quant}.json")
        if not rep:
            lines += [f"GGUF {quant}: no report (the run did not produce one).", ""]
            continue
        llm, pred = rep["llm"], rep["prediction"]
        dec = pred.get("decode") or {}
        work = pred["work"]
        # The model's own per-token time (llama.cpp's eval timer) when the report has it: the roofline
        # models that, not the stream's Python around it.
        model_decode = llm.get("decode_tok_s_backend") or llm["decode_tok_s"]
        tpot_s = 1.0 / model_decode
        stream_s = dec["bytes_per_token"] / (pred["bandwidth_gbps"] * 1e9)
        implied_launch_us = (tpot_s - stream_s) / work["layers"] * 1e6
        lines += [
            f"## GGUF {quant.upper()}: {rep['bundle']['model']} (run {rep['created']})",
            "",
            f"{rep.get('model_note', '')}",
            "",
            f"Backend {rep['runtime']['backend']} on {rep['runtime']['device']}; fallbacks: "
            f"{rep['fallbacks'] or 'none'}; device memory {rep['memory']['device']}.",
            "",
            "| figure | measured | h200 predicted | error % | calibration used |",
            "|---|---|---|---|---|",
            f"| decode tok/s, model ({'llama.cpp eval timer' if llm.get('decode_tok_s_backend') else 'stream'})"
            f" | {model_decode:.0f} | {dec.get('tok_s') or 0:.0f} | "
            f"{(pred.get('error_pct') or {}).get('decode', float('nan')):+.1f} | "
            f"{dec.get('efficiency_source')} |",
            f"| decode tok/s, stream (1 / TPOT) | {llm['decode_tok_s']:.0f} | | | |",
            f"| prefill tok/s ({llm['prompt_tokens']} tokens, {llm.get('prefill_source', 'TTFT')}) | "
            f"{llm['prefill_tok_s']:.0f} | "
            f"{(pred.get('prefill') or {}).get('tok_s') or 0:.0f} | "
            f"{(pred.get('error_pct') or {}).get('prefill', float('nan')):+.1f} | "
            f"{(pred.get('prefill') or {}).get('efficiency_source')} |",
            f"| TTFT p50 ms ({llm.get('timing_source', 'text chunks')}) | {llm['ttft_ms']['p50']:.2f} | "
            f"{pred.get('ttft_ms') or 0:.2f} | | |",
            f"| TPOT p50 ms (IQR) | {llm['tpot_ms']['p50']:.3f} ({llm['tpot_ms']['iqr']:.3f}) | "
            f"{dec.get('tpot_ms') or 0:.3f} | | |",
            "",
            f"Implied by this run: decode launch cost {implied_launch_us:.1f} us/layer "
            f"(TPOT {tpot_s * 1e3:.3f} ms - {dec['bytes_per_token'] / 1e6:.0f} MB / "
            f"{pred['bandwidth_gbps']} GB/s = {stream_s * 1e3:.3f} ms streaming, over {work['layers']} "
            f"layers); prefill efficiency {(pred.get('implied_efficiency') or {}).get('prefill', 0):.4f}.",
            "",
        ]
    lines += [
        "Note: an earlier GGUF run (2026-12-02 10:07 UTC) timed text chunks instead of tokens; on this",
        "random-weight model most tokens yield no text, which made its decode rate (3826 tok/s) and TTFT",
        "(98 ms) artifacts. The predictions above use the calibration derived from that run (14.6 us/layer),",
        "replaced after this run by the launch costs implied here; see docs/benchmarks.md.",
        "",
    ]
    out = RESULTS / "profiler_h200_summary.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
