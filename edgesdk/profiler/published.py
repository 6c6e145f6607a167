# SPDX-License-Identifier: Apache-2.0
"""The roofline's LLM decode predictions for the Orin profiles, checked against published measurements.

What ``profiler predict`` does for a GGUF bundle (``roofline.predict``: bytes read per token over the profile's
memory bandwidth, an efficiency and a per-layer launch cost from a calibration entry) is done here for models
that were measured and published on Orin boards by other runtimes: MLC (Jetson AI Lab) and TensorRT Edge-LLM.

- **Shapes** come from each model's published ``config.json`` (:data:`ARCHITECTURES`) and are turned into the
  predictor's :class:`~edgesdk.profiler.roofline.WorkFacts` by :func:`config_work`: the predictor needs only
  sizes (bytes read per token, KV bytes per position, layers, parameters), so no weight file is built for the
  full-size models. ``tests/test_profiler_published.py`` checks :func:`config_work` against
  :func:`~edgesdk.profiler.roofline.gguf_work` on random-weight GGUF files of the same architectures (dimensions
  cut down), i.e. against what ``profiler predict`` reads from a real bundle.
- **Bytes per weight** per runtime's INT4 format: :data:`SCHEMES`, each with its source.
- **Published figures**: :data:`PUBLISHED`, each with its page, table and row; ``role`` says whether it is
  used to calibrate (``calibration``) or only compared (``held-out``).
- **Calibration**: :data:`CALIBRATION`, one entry per runtime class; :func:`calibrate` fits the entry's
  efficiency (and, where there are enough figures, its per-layer launch cost) to the ``calibration`` figures
  named there and nothing else, as an entry of the efficiency table ``roofline.predict`` reads.
- **Facts the profiles lack**: :data:`MODE_BANDWIDTH` (the Orin Nano's memory bandwidth in its Super modes).

``python -m edgesdk.profiler.published`` prints the comparison table of docs/profiler.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgesdk.profiler import roofline


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape, as its ``config.json`` gives it."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # tie_word_embeddings: the output projection is the input embedding table
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head (head_dim weights each)
    attention_bias: bool = False  # Qwen2/2.5: biases on q, k, v
    source: str = ""


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture(
            "Llama-3.2-3B", 3072, 28, 24, 8, 128, 8192, 128256, tied=True,
            source="https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json",
        ),
        Architecture(
            "Llama-3.1-8B", 4096, 32, 32, 8, 128, 14336, 128256, tied=False,
            source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
        ),
        Architecture(
            "Qwen2.5-7B", 3584, 28, 28, 4, 128, 18944, 152064, tied=False, attention_bias=True,
            source="https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json",
        ),
        Architecture(
            "Qwen3-0.6B", 1024, 28, 16, 8, 128, 3072, 151936, tied=True, qk_norm=True,
            source="https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json",
        ),
        Architecture(
            "Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936, tied=True, qk_norm=True,
            source="https://huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json",
        ),
        Architecture(
            "Qwen3-4B-Instruct-2507", 2560, 36, 32, 8, 128, 9728, 151936, tied=True, qk_norm=True,
            source="https://huggingface.co/Qwen/Qwen3-4B-Instruct-2507/blob/main/config.json",
        ),
        Architecture(
            "Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936, tied=False, qk_norm=True,
            source="https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class Scheme:
    """Storage of one runtime's weights: bits per weight of the transformer's matrices and of the output
    projection (scales included), bytes per element of vectors (norms, biases), bytes per cached K/V element."""

    name: str
    body_bits: float
    head_bits: float
    vector_bytes: int
    kv_bytes: int
    source: str


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "mlc-q4f16_ft",
            # INT4 per output channel (one FP16 scale per row: < 0.01 bit per weight, not counted); the output
            # projection and the embedding fall back to group quantization, INT4 with an FP16 scale per 32.
            body_bits=4.0,
            head_bits=4.0 + 16 / 32,
            vector_bytes=2,
            kv_bytes=2,
            source="QUANTIZATION default q4f16_ft in https://github.com/dusty-nv/jetson-containers/blob/master/packages/llm/"
            "mlc/benchmark.sh (the script the Jetson AI Lab page names); FTQuantize in https://github.com/mlc-ai/"
            "mlc-llm/blob/main/python/mlc_llm/quantization/ft_quantization.py: "
            "per-channel INT4 for nn.Linear, GroupQuantize (group 32) for the final FC and nn.Embedding",
        ),
        Scheme(
            "trt-edgellm-int4-awq",
            # AWQ INT4 with an FP16 scale per group of 128; the LM head stays FP16 unless quantized on purpose.
            body_bits=4.0 + 16 / 128,
            head_bits=16.0,
            vector_bytes=2,
            kv_bytes=2,
            source="TensorRT Edge-LLM docs, https://github.com/NVIDIA/TensorRT-Edge-LLM/blob/main/docs/source/user_guide/"
            "features/quantization.md: the backbone's int4_awq and the LM head's "
            "quantization are separate options (--lm_head_quantization), the benchmark rows name only INT4 AWQ; "
            "AWQ group size 128 (TensorRT Model Optimizer INT4_AWQ_CFG block size); FP16 KV cache",
        ),
        Scheme(
            "gguf-f16",  # what edgesdk's converter writes for F16: matrices F16, vectors F32 (the cross-check)
            body_bits=16.0,
            head_bits=16.0,
            vector_bytes=4,
            kv_bytes=2,
            source="GGUF F16 file type: 2-D tensors F16, 1-D tensors F32; llama.cpp's default F16 KV cache",
        ),
    )
}


def config_work(arch: Architecture, scheme: Scheme) -> roofline.WorkFacts:
    """What one decode step reads, counted the way :func:`roofline.gguf_work` counts a GGUF file: every matrix
    and vector of the layers, the final norm and the output projection (the embedding table when tied); an
    untied input embedding is a row lookup and is not counted."""
    h, hd = arch.hidden, arch.head_dim
    q, kv = arch.heads * hd, arch.kv_heads * hd
    layer_matrix = h * q + 2 * h * kv + q * h + 3 * h * arch.intermediate
    layer_vector = 2 * h + (2 * hd if arch.qk_norm else 0) + (q + 2 * kv if arch.attention_bias else 0)
    head = arch.vocab * h
    matrix_params = arch.layers * layer_matrix
    vector_params = arch.layers * layer_vector + h
    weight_bytes = (
        matrix_params * scheme.body_bits / 8 + head * scheme.head_bits / 8 + vector_params * scheme.vector_bytes
    )
    params = matrix_params + vector_params + head * (1 if arch.tied else 2)
    facts = roofline.WorkFacts(
        kind="llm",
        format="config",
        precision=scheme.name,
        params=params,
        weight_bytes=int(round(weight_bytes)),
        kv_bytes_per_position=arch.layers * kv * 2 * scheme.kv_bytes,
        layers=arch.layers,
        d_model=h,
    )
    facts.flops = 2.0 * (params - (0 if arch.tied else head))
    facts.notes.append(f"{arch.name} from its config.json ({arch.source}); weights as {scheme.name}")
    return facts


# Facts a profile lacks, kept here with their source (profiles/ is not edited from here).
MODE_BANDWIDTH: dict[tuple[str, str], tuple[float, str]] = {
    ("orin-nano-8gb", "MAXN_SUPER"): (
        102.0,
        "NVIDIA Technical Blog, 'NVIDIA Jetson Orin Nano Developer Kit Gets a Super Boost' (2024-12-17): memory "
        "bandwidth 68 GB/s -> 102 GB/s in the Super modes (docs/devices.md: '68 GB/s (Super 102)')",
    ),
}

JETSON_AI_LAB = (
    "Jetson AI Lab, Benchmarks, 'Jetson Orin Nano Super' > 'LLM / SLM' table "
    "(https://www.jetson-ai-lab.com/benchmarks.html; page source "
    "https://github.com/NVIDIA-AI-IOT/jetson-generative-ai-playground/blob/main/docs/benchmarks.md): MLC, INT4"
)
TRT_EDGE_LLM = (
    "TensorRT Edge-LLM, Performance Benchmarks, 'v0.9.0 Results' > 'Runtime Performance Dashboard', one table per "
    "device, Vanilla decoding, INT4 AWQ, batch 1, MTBench prompts "
    "(https://nvidia.github.io/TensorRT-Edge-LLM/0.10.0/user_guide/performance/performance-benchmarks.html; "
    "source https://github.com/NVIDIA/TensorRT-Edge-LLM/blob/main/docs/source/user_guide/performance/"
    "performance-benchmarks.md)"
)


@dataclass(frozen=True)
class Published:
    """One published decode rate (tokens/s, batch 1) and how it is predicted."""

    key: str
    runtime: str  # calibration class: "mlc" | "tensorrt-edge-llm"
    model: str  # ARCHITECTURES key
    scheme: str  # SCHEMES key
    profile: str  # edgesdk profile the device matches
    mode: str | None  # a power mode whose bandwidth MODE_BANDWIDTH gives, else None: the profile's figure
    device: str  # as the source names it
    tok_s: float
    context: int  # cached positions the prediction assumes (the source's prompt length)
    role: str  # "calibration" | "held-out"
    source: str
    row: str  # which row/column of the source


PUBLISHED: list[Published] = [
    # MLC (Jetson AI Lab). Prompt: PROMPT=/data/prompts/completion_16.json in benchmark.sh -> 16 positions.
    Published("mlc-llama3.2-3b-nano", "mlc", "Llama-3.2-3B", "mlc-q4f16_ft", "orin-nano-8gb", None,
              "Jetson Orin Nano (original)", 27.7, 16, "calibration", JETSON_AI_LAB, "Llama 3.2 3B, original column"),
    Published("mlc-llama3.2-3b-nano-super", "mlc", "Llama-3.2-3B", "mlc-q4f16_ft", "orin-nano-8gb", "MAXN_SUPER",
              "Jetson Orin Nano Super", 43.07, 16, "held-out", JETSON_AI_LAB, "Llama 3.2 3B, Super column"),
    Published("mlc-llama3.1-8b-nano", "mlc", "Llama-3.1-8B", "mlc-q4f16_ft", "orin-nano-8gb", None,
              "Jetson Orin Nano (original)", 14.0, 16, "held-out", JETSON_AI_LAB, "Llama 3.1 8B, original column"),
    Published("mlc-llama3.1-8b-nano-super", "mlc", "Llama-3.1-8B", "mlc-q4f16_ft", "orin-nano-8gb", "MAXN_SUPER",
              "Jetson Orin Nano Super", 19.14, 16, "held-out", JETSON_AI_LAB, "Llama 3.1 8B, Super column"),
    Published("mlc-qwen2.5-7b-nano", "mlc", "Qwen2.5-7B", "mlc-q4f16_ft", "orin-nano-8gb", None,
              "Jetson Orin Nano (original)", 14.2, 16, "held-out", JETSON_AI_LAB, "Qwen2.5 7B, original column"),
    Published("mlc-qwen2.5-7b-nano-super", "mlc", "Qwen2.5-7B", "mlc-q4f16_ft", "orin-nano-8gb", "MAXN_SUPER",
              "Jetson Orin Nano Super", 21.75, 16, "held-out", JETSON_AI_LAB, "Qwen2.5 7B, Super column"),
    # TensorRT Edge-LLM v0.9.0 (JetPack 7.2). Prefill Seq Len column: 61 (57 for Qwen3-4B-Instruct-2507).
    Published("trt-qwen3-1.7b-agx", "tensorrt-edge-llm", "Qwen3-1.7B", "trt-edgellm-int4-awq", "orin-agx-64gb", None,
              "Jetson AGX Orin (64GB)", 98.6, 61, "calibration", TRT_EDGE_LLM, "Qwen3-1.7B, Decode (tok/s)"),
    Published("trt-qwen3-1.7b-nx", "tensorrt-edge-llm", "Qwen3-1.7B", "trt-edgellm-int4-awq", "orin-nx-16gb", None,
              "Jetson Orin NX (16GB)", 60.4, 61, "calibration", TRT_EDGE_LLM, "Qwen3-1.7B, Decode (tok/s)"),
    Published("trt-qwen3-1.7b-nano", "tensorrt-edge-llm", "Qwen3-1.7B", "trt-edgellm-int4-awq", "orin-nano-8gb",
              None, "Jetson Orin Nano (8GB)", 37.4, 61, "calibration", TRT_EDGE_LLM, "Qwen3-1.7B, Decode (tok/s)"),
    Published("trt-qwen3-0.6b-agx", "tensorrt-edge-llm", "Qwen3-0.6B", "trt-edgellm-int4-awq", "orin-agx-64gb", None,
              "Jetson AGX Orin (64GB)", 186.4, 61, "held-out", TRT_EDGE_LLM, "Qwen3-0.6B, Decode (tok/s)"),
    Published("trt-qwen3-0.6b-nx", "tensorrt-edge-llm", "Qwen3-0.6B", "trt-edgellm-int4-awq", "orin-nx-16gb", None,
              "Jetson Orin NX (16GB)", 117.4, 61, "held-out", TRT_EDGE_LLM, "Qwen3-0.6B, Decode (tok/s)"),
    Published("trt-qwen3-0.6b-nano", "tensorrt-edge-llm", "Qwen3-0.6B", "trt-edgellm-int4-awq", "orin-nano-8gb",
              None, "Jetson Orin Nano (8GB)", 72.8, 61, "held-out", TRT_EDGE_LLM, "Qwen3-0.6B, Decode (tok/s)"),
    Published("trt-qwen3-4b-agx", "tensorrt-edge-llm", "Qwen3-4B-Instruct-2507", "trt-edgellm-int4-awq",
              "orin-agx-64gb", None, "Jetson AGX Orin (64GB)", 53.1, 57, "held-out", TRT_EDGE_LLM,
              "Qwen3-4B-Instruct-2507, Decode (tok/s)"),
    Published("trt-qwen3-4b-nx", "tensorrt-edge-llm", "Qwen3-4B-Instruct-2507", "trt-edgellm-int4-awq",
              "orin-nx-16gb", None, "Jetson Orin NX (16GB)", 31.6, 57, "held-out", TRT_EDGE_LLM,
              "Qwen3-4B-Instruct-2507, Decode (tok/s)"),
    Published("trt-qwen3-8b-agx", "tensorrt-edge-llm", "Qwen3-8B", "trt-edgellm-int4-awq", "orin-agx-64gb", None,
              "Jetson AGX Orin (64GB)", 32.5, 61, "held-out", TRT_EDGE_LLM, "Qwen3-8B, Decode (tok/s)"),
    Published("trt-qwen3-8b-nx", "tensorrt-edge-llm", "Qwen3-8B", "trt-edgellm-int4-awq", "orin-nx-16gb", None,
              "Jetson Orin NX (16GB)", 19.0, 61, "held-out", TRT_EDGE_LLM, "Qwen3-8B, Decode (tok/s)"),
]  # fmt: skip

# One entry per runtime/quantization class: the figures it is fitted to (role "calibration" in PUBLISHED) and the
# model it fits. "efficiency": one bandwidth efficiency (one figure cannot separate it from a launch cost).
# "efficiency+launch": time per token = bytes / (bandwidth x efficiency) + layers x launch cost, least squares in
# relative error; an efficiency above 1 is clipped to 1 and the launch cost refitted.
CALIBRATION: dict[str, dict[str, Any]] = {
    "mlc": {
        "quant": "int4",
        "fit": "efficiency",
        "figures": ["mlc-llama3.2-3b-nano"],
        "source": "published: " + JETSON_AI_LAB,
    },
    "tensorrt-edge-llm": {
        "quant": "int4",
        "fit": "efficiency+launch",
        "figures": ["trt-qwen3-1.7b-agx", "trt-qwen3-1.7b-nx", "trt-qwen3-1.7b-nano"],
        "source": "published: " + TRT_EDGE_LLM,
    },
}

TOLERANCE_PCT = 25.0  # issue 38's goal for every figure of the comparison


def profile_for(fig: Published):
    """The figure's profile; in a mode of :data:`MODE_BANDWIDTH`, a copy with that memory bandwidth."""
    from edgesdk.profiles import resolve_profile

    profile = resolve_profile(fig.profile)
    if fig.mode is None:
        return profile
    gbps, source = MODE_BANDWIDTH[(fig.profile, fig.mode)]
    return profile.with_figure("device.memory.bandwidth_gbps", gbps, source, name=f"{profile.name}@{fig.mode}")


def work_for(fig: Published) -> roofline.WorkFacts:
    return config_work(ARCHITECTURES[fig.model], SCHEMES[fig.scheme])


def _figure(key: str) -> Published:
    return next(f for f in PUBLISHED if f.key == key)


def calibrate(runtime: str) -> dict:
    """The efficiency-table entry of ``runtime``, fitted to its calibration figures only."""
    spec = CALIBRATION[runtime]
    figs = [_figure(k) for k in spec["figures"]]
    if any(f.role != "calibration" or f.runtime != runtime for f in figs):
        raise ValueError(f"{runtime}: a calibration figure is not marked role=calibration of this runtime")
    # Per figure: measured time per token t and streaming time at full bandwidth m (the roofline's own bound).
    t = [1.0 / f.tok_s for f in figs]
    bounds = [
        roofline.predict(work_for(f), profile_for(f), backend=runtime, context=f.context, table=[])["decode"]
        for f in figs
    ]
    m = [1.0 / d["bound_tok_s"] for d in bounds]
    layers = work_for(figs[0]).layers or 0
    # Model t = a*m + b (a = 1/efficiency, b = layers x launch cost), minimising sum(((a*m + b) - t) / t)^2.
    x = [mi / ti for mi, ti in zip(m, t)]
    y = [1.0 / ti for ti in t]
    if spec["fit"] == "efficiency" or len(figs) < 2:
        a, b = sum(x) / sum(xi * xi for xi in x), 0.0
    else:
        sxx, sxy, syy = sum(v * v for v in x), sum(u * v for u, v in zip(x, y)), sum(v * v for v in y)
        sx, sy = sum(x), sum(y)
        det = sxx * syy - sxy * sxy
        a, b = (sx * syy - sy * sxy) / det, (sxx * sy - sxy * sx) / det
        if a < 1.0:  # efficiency above 1: clip and refit the launch cost alone
            a = 1.0
            b = sum(yi * (1.0 - xi) for xi, yi in zip(x, y)) / syy
        if b < 0.0:
            a, b = sum(x) / sum(xi * xi for xi in x), 0.0
    entry = {
        "device_class": "jetson",
        "workload": "decode",
        "backend": runtime,
        "params": work_for(figs[0]).params,
        "quant": spec["quant"],
        "efficiency": 1.0 / a,
        "source": f"{spec['source']}; fitted ({spec['fit']}) on " + ", ".join(f"{f.key} {f.tok_s:g}" for f in figs),
        "calibrated_on": [f.key for f in figs],
    }
    if b > 0.0:
        entry["launch_us_per_layer"] = b / layers * 1e6
    return entry


def compare() -> list[dict]:
    """Every published figure against the prediction with its runtime's calibration entry."""
    entries = {runtime: calibrate(runtime) for runtime in CALIBRATION}
    rows = []
    for fig in PUBLISHED:
        pred = roofline.predict(
            work_for(fig), profile_for(fig), backend=fig.runtime, context=fig.context, table=[entries[fig.runtime]]
        )
        tok_s = pred["decode"]["tok_s"]
        rows.append(
            {
                "key": fig.key,
                "runtime": fig.runtime,
                "model": fig.model,
                "device": fig.device,
                "profile": pred["profile"],
                "bandwidth_gbps": pred["bandwidth_gbps"],
                "published_tok_s": fig.tok_s,
                "predicted_tok_s": tok_s,
                "bound_tok_s": pred["decode"]["bound_tok_s"],
                "bytes_per_token": pred["decode"]["bytes_per_token"],
                "error_pct": roofline.prediction_error(tok_s, fig.tok_s),
                "role": fig.role,
                "source": fig.source,
                "row": fig.row,
            }
        )
    return rows


RUNTIME_NAMES = {"mlc": "MLC INT4", "tensorrt-edge-llm": "TensorRT Edge-LLM INT4 AWQ"}


def markdown_table(rows: list[dict] | None = None) -> str:
    """The comparison table of docs/profiler.md, as the code computes it."""
    rows = compare() if rows is None else rows
    lines = [
        "| runtime | model | device (as published) | profile | GB/s | published tok/s | predicted tok/s | error "
        "| role |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {RUNTIME_NAMES[r['runtime']]} | {r['model']} | {r['device']} | {r['profile']} | "
            f"{r['bandwidth_gbps']:g} | {r['published_tok_s']:g} | {r['predicted_tok_s']:.1f} | "
            f"{r['error_pct']:+.1f} % | {r['role']} |"
        )
    return "\n".join(lines)


def calibration_lines() -> list[str]:
    """One line per calibration entry: the fitted figures and what they were fitted on."""
    out = []
    for runtime in CALIBRATION:
        e = calibrate(runtime)
        launch = e.get("launch_us_per_layer")
        out.append(
            f"- {RUNTIME_NAMES[runtime]}: efficiency {e['efficiency']:.3f}"
            + (f", launch cost {launch:.1f} µs per layer" if launch else "")
            + f"; calibrated on {', '.join(e['calibrated_on'])}"
        )
    return out


def max_abs_error_pct(rows: list[dict] | None = None) -> float:
    rows = compare() if rows is None else rows
    return max(abs(r["error_pct"]) for r in rows if not math.isnan(r["error_pct"]))


if __name__ == "__main__":
    print(markdown_table())
    print()
    print("\n".join(calibration_lines()))
