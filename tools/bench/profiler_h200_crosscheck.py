# SPDX-License-Identifier: Apache-2.0
"""Leave-one-out check of the h200 decode/prefill calibration against the H200 measurements in docs/devices.md.

The H200 measurements available to this project (docs/devices.md, an earlier session; random-weight
TinyLlama-1.1B-shaped llama, llama.cpp CUDA, flash-attention on, batch 1): decode 724 tok/s F16 and
810 tok/s Q4_K_M, prefill 6.7k and 17.8k tok/s. Each calibration entry is fitted to one of them; here
each measurement is predicted from the table WITHOUT its own entry (so the error is out-of-sample),
for the launch-bound model the table uses and for a single bandwidth efficiency (the naive model).

Bytes and FLOPs come from real GGUF headers of that shape (same recipe: tools/bench/bench_p4_h200.py
make_model, edgesdk's converter, llama.cpp Q4_K_M), made on a CPU host with random weights.

Usage: python tools/bench/profiler_h200_crosscheck.py F16.gguf Q4_K_M.gguf
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

FACTS_H200 = {"F16": {"decode": 724.0, "prefill": 6700.0}, "Q4_K_M": {"decode": 810.0, "prefill": 17800.0}}
CONTEXT = 80  # P4-style decode: 16-token prompt + 128 generated: mean cached context ~80 positions


def main() -> int:
    from edgesdk.profiler import roofline
    from edgesdk.profiles import resolve_profile

    f16_path, q4_path = Path(sys.argv[1]), Path(sys.argv[2])
    h200 = resolve_profile("h200")
    table = roofline.load_efficiency_table()
    own = {
        "F16": lambda e: "F16 724" in e["source"] or "F16 prefill 6.7k" in e["source"],
        "Q4_K_M": lambda e: "Q4_K_M 810" in e["source"] or "Q4_K_M prefill 17.8k" in e["source"],
    }
    rows = []
    for label, path in (("F16", f16_path), ("Q4_K_M", q4_path)):
        facts = roofline.gguf_work(path)
        held_out = [e for e in table if not own[label](e)]
        pred = roofline.predict(facts, h200, backend="llama.cpp", prompt_tokens=512, context=CONTEXT, table=held_out)
        other = "Q4_K_M" if label == "F16" else "F16"
        other_facts = roofline.gguf_work(q4_path if label == "F16" else f16_path)
        # Naive model: one bandwidth efficiency, taken from the other measurement.
        other_bound = roofline.predict(other_facts, h200, backend="llama.cpp", context=CONTEXT, table=[])["decode"][
            "bound_tok_s"
        ]
        naive_eff = FACTS_H200[other]["decode"] / other_bound
        naive = pred["decode"]["bound_tok_s"] * naive_eff
        measured = FACTS_H200[label]
        rows.append(
            {
                "held_out": label,
                "weight_bytes_per_token": facts.weight_bytes,
                "layers": facts.layers,
                "decode": {
                    "measured_tok_s": measured["decode"],
                    "predicted_tok_s": pred["decode"]["tok_s"],
                    "error_pct": roofline.prediction_error(pred["decode"]["tok_s"], measured["decode"]),
                    "calibration_used": pred["decode"]["efficiency_source"],
                    "launch_us_per_layer": pred["decode"]["launch_us_per_layer"],
                    "bound_tok_s": pred["decode"]["bound_tok_s"],
                    "naive_single_efficiency": {
                        "efficiency": naive_eff,
                        "predicted_tok_s": naive,
                        "error_pct": roofline.prediction_error(naive, measured["decode"]),
                    },
                },
                "prefill_512": {
                    "measured_tok_s": measured["prefill"],
                    "predicted_tok_s": pred["prefill"]["tok_s"],
                    "error_pct": roofline.prediction_error(pred["prefill"]["tok_s"], measured["prefill"]),
                    "calibration_used": pred["prefill"]["efficiency_source"],
                },
            }
        )
    out = {
        "check": "h200 calibration, leave-one-out against docs/devices.md H200 measurements",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": __doc__,
        "context_positions": CONTEXT,
        "rows": rows,
    }
    dest = REPO / "tools/bench/results/profiler_h200_crosscheck.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        d, p = r["decode"], r["prefill_512"]
        print(
            f"{r['held_out']}: decode measured {d['measured_tok_s']:.0f}, predicted {d['predicted_tok_s']:.0f} tok/s "
            f"({d['error_pct']:+.0f}%; naive single efficiency "
            f"{d['naive_single_efficiency']['predicted_tok_s']:.0f}, "
            f"{d['naive_single_efficiency']['error_pct']:+.0f}%); prefill measured {p['measured_tok_s']:.0f}, "
            f"predicted {p['predicted_tok_s']:.0f} ({p['error_pct']:+.0f}%)"
        )
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
