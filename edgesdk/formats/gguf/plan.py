# SPDX-License-Identifier: Apache-2.0
"""The GGUF plan: the memory-driven quantization type, context, offload, flash attention, batch sizes,
KV cache type and threads.

``plan_gguf`` picks the first type in the profile's ``policy.llm.quant_order`` whose weights plus
KV cache at the planned context plus the compute buffer (sized by the planned ``n_ubatch``) fit the
profile's memory budget, else a shorter context (down to ``min_context_length``), else
:class:`ResourceError` with the numbers. Every reason string shows the arithmetic (``edgesdk build
--explain`` prints it). Pure: it reads the facts and the profile only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from edgesdk.contracts.gguf_types import BPW, DEFAULT_KV_TYPE, FTYPES, KV_TYPE_BYTES, kv_bytes
from edgesdk.errors import InputError, ModelError, ResourceError
from edgesdk.formats.gguf.draft import DraftChoice, DraftSource
from edgesdk.types import BuildOptions, Decision, JSONable, JSONValue, ModelFacts, PlanSection

if TYPE_CHECKING:
    from edgesdk.profiles import KernelSupport, Profile

# Perplexity of the quantized file / perplexity of its reference (F16, or the source GGUF) on the
# built-in text must stay under these. Set a little looser than the PPL increases llama.cpp's
# quantize tool lists for Llama-class models (Q8_0 ~+0.0004, Q6_K ~+0.004, Q5_K_M ~+0.014,
# Q4_K_M ~+0.05, Q3_K_M ~+0.24, Q2_K ~+0.87 on PPL ~6), because our text is short (~1k tokens).
PPL_RATIO_MAX = {
    "F16": 1.005,
    "BF16": 1.005,
    "Q8_0": 1.01,
    "Q6_K": 1.02,
    "Q5_K_M": 1.03,
    "Q5_K_S": 1.035,
    "Q5_0": 1.04,
    "Q5_1": 1.04,
    "Q4_K_M": 1.06,
    "Q4_K_S": 1.07,
    "Q4_0": 1.10,
    "Q4_1": 1.09,
    "Q3_K_L": 1.12,
    "Q3_K_M": 1.15,
    "Q3_K_S": 1.2,
    "Q2_K": 1.4,
}
# HF (float32) vs F16 GGUF logits on the sample prompts.
LOGITS_MIN_COSINE = 0.999
LOGITS_MIN_TOP1 = 0.95
KV_BYTES_PER_ELEMENT = 2  # llama.cpp's default KV cache type is F16
# Bytes per cached K/V element for the cache types llama.cpp accepts (`--cache-type-k/-v`, common/arg.cpp:
# f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1), from the ggml block layouts (q8_0: 34 B / 32).
# llama-cpp-python's Llama() defaults (n_batch 512, n_ubatch 512; llama.cpp's own CLI defaults are
# n_batch 2048, n_ubatch 512): the micro-batch that sizes the compute buffer where the plan does not
# raise it, and the figure callers get from compute_bytes() without one.
N_UBATCH = 512
N_UBATCH_GPU = 2048  # GPU, all layers offloaded, flash attention on (H200 sweep, see _batch_rule)
# llama.cpp's own words for the two batch sizes: `common/arg.cpp` help texts of -b / -ub, and the
# comments on llama_context_params in include/llama.h.
BATCH_SOURCE = (
    "llama.cpp: -b/--batch-size = 'logical maximum batch size' (the most tokens one "
    "llama_decode call takes), -ub/--ubatch-size = 'physical maximum batch size' (the tokens one "
    "graph evaluation takes; it sizes the compute buffer) (common/arg.cpp, include/llama.h)"
)
BATCH_MEASUREMENT = (
    "H200 sweep, 2026-12-03 device log: hidden random-weight 16-layer 2048-wide F16 llama, all "
    "layers on the GPU, llama-cpp-python 0.3.36 CUDA: best bare prefill of a 512-token prompt "
    "was flash attention on with n_batch = n_ubatch = 2048 (63.3k tok/s); edgesdk with "
    "llama-cpp-python's 512/512 defaults reached 46.8k (0.74x, text input incl. tokenising)"
)
GB = 1e9


# ---------------------------------------------------------------------------------------------
# Plan


def _gb(n_bytes: float) -> str:
    if n_bytes < 0.1 * GB:
        return f"{n_bytes / 1e6:.2f} MB"
    return f"{n_bytes / GB:.2f} GB"


def compute_bytes(info: Mapping[str, Any], weight_bytes: float, n_ubatch: int = N_UBATCH) -> float:
    """Compute-buffer estimate: one micro-batch of the widest activations in F32
    (n_ubatch x (n_vocab + ffn + 4 x hidden) x 4 B) plus 5 % of the weights for allocator slack."""
    width = (
        int(info.get("n_vocab") or 32000)
        + int(info.get("ffn") or 4 * (info.get("hidden") or 0))
        + 4 * int(info.get("hidden") or 0)
    )
    return n_ubatch * width * 4 + 0.05 * weight_bytes


class _DraftNeed(NamedTuple):
    """What the bundle's draft model (``--draft``) adds to the memory arithmetic at one model type: its weights and
    compute buffer, its KV cache per token of context (the draft context holds a slot's text as the model's does;
    llama.cpp's default F16 cache), and the arithmetic as text."""

    fixed: float
    per_token: float
    why: str


def _draft_need(draft: DraftSource | None, quant: str, n_ubatch: int) -> _DraftNeed:
    if draft is None:
        return _DraftNeed(0.0, 0.0, "")
    w = draft.weight_bytes(quant)
    comp = compute_bytes(draft.shape, w, n_ubatch)
    sized = all(draft.shape.get(k) for k in ("layers", "kv_heads", "head_dim"))
    per_tok = float(kv_bytes(draft.shape, 1)) if sized else 0.0
    kept = draft.kept_type(quant)[0]
    return _DraftNeed(
        w + comp,
        per_tok,
        f"draft {draft.path.name} ({kept}): {_gb(w)} weights + {_gb(comp)} compute"
        + (f" + {_gb(per_tok * 1024)} KV per 1024 ctx (F16)" if sized else " (its KV cache unsized: no layer shape)"),
    )


def _check_shape(facts: ModelFacts) -> dict[str, Any]:
    from edgesdk.formats.gguf.convert import supported_list

    info = facts.extra
    if facts.kind == "hf":
        if not info.get("gguf_supported"):
            raise ModelError(
                f"architecture {info.get('architecture')} not supported for GGUF conversion "
                f"(supported: {supported_list()})"
            )
        if not info.get("tokenizer_files"):
            raise ModelError(
                f"{facts.source}: tokenizer missing (expected tokenizer.json or tokenizer.model)",
                hint="save the tokenizer next to the weights with tokenizer.save_pretrained()",
            )
    missing = [k for k in ("layers", "kv_heads", "head_dim") if not info.get(k)]
    if missing or not facts.params:
        raise ModelError(f"{facts.source}: cannot size the model (missing {', '.join(missing) or 'params'})")
    return info


def _candidate_types(facts: ModelFacts, profile: Profile, options: BuildOptions) -> tuple[list[str], str]:
    order = list(profile.llm.quant_order or ["Q8_0", "Q4_K_M"])
    source_type = facts.extra.get("file_type") if facts.kind == "gguf" else None
    if options.quant_type:
        q = options.quant_type.upper()
        if q not in FTYPES or q not in BPW:
            raise InputError(
                f"unknown GGUF quantization type {options.quant_type!r} "
                f"(known: {', '.join(t for t in BPW if t in FTYPES)})"
            )
        order, why = [q], f"requested with --quant-type {q}"
    else:
        why = f"profile {profile.name} quant_order {order}"
    if source_type in BPW and source_type not in ("F32", "F16", "BF16"):
        higher = [q for q in order if BPW[q] > BPW[source_type]]
        if options.quant_type and higher:
            raise ModelError(
                f"cannot requantize an already-quantized {source_type} file to the higher-precision "
                f"type {higher[0]}: the lost precision cannot be restored",
                hint=f"pick {source_type} or a smaller type, or start from the F16/HF model",
            )
        if higher:
            why += (
                f"; source is already {source_type}, so higher-precision types ({', '.join(higher)}) are "
                "skipped (requantizing up cannot restore precision)"
            )
        order = [q for q in order if q not in higher] or [source_type]
    return order, why


def _weight_bytes(facts: ModelFacts, quant: str) -> tuple[float, str]:
    """Weight bytes at ``quant``: the file's own tensor bytes when the GGUF source already is that type
    (mixes keep embeddings/output at larger types, so bpw x params underestimates), else params x bpw."""
    if facts.kind == "gguf" and facts.extra.get("file_type") == quant and facts.extra.get("tensor_bytes"):
        return float(facts.extra["tensor_bytes"]), "tensor bytes of the source file"
    params = facts.params or 0  # _check_shape refused a model without a parameter count
    return params * BPW[quant] / 8, f"{int(params):,} params x {BPW[quant]} bpw / 8"


class _Fit(NamedTuple):
    """The memory arithmetic's outcome at one (KV type, n_ubatch): the type, the context and the reason."""

    quant: str
    n_ctx: int
    why: str
    shortened: bool
    rank: int  # index of ``quant`` in the candidate order (0 = the profile's first choice)


def _fit_memory(
    facts: ModelFacts,
    profile: Profile,
    info: dict[str, Any],
    order: list[str],
    n_ctx: int,
    min_ctx: int,
    kv_type: str,
    n_ubatch: int,
    draft: DraftSource | None = None,
) -> _Fit:
    """First type of ``order`` whose weights + KV (``kv_type``) + compute (``n_ubatch``) fit the budget at
    ``n_ctx``, else the smallest type at the longest context that fits (>= ``min_ctx``), else ResourceError.
    ``draft``: the bundle's draft model, whose weights, compute buffer and KV cache count in every total."""
    budget_gb = profile.memory_budget_gb()
    kv = kv_bytes(info, n_ctx, kv_type)
    kv_why = (
        f"KV cache = 2 x {info['layers']} layers x {info['kv_heads']} kv heads x {info['head_dim']} head dim "
        f"x {n_ctx} ctx x {KV_TYPE_BYTES[kv_type]:g} B ({kv_type}) = {_gb(kv)}; compute buffer sized for "
        f"n_ubatch {n_ubatch}"
    )
    if budget_gb is None:
        w, w_why = _weight_bytes(facts, order[0])
        return _Fit(
            order[0],
            n_ctx,
            f"profile {profile.name} has no memory figure (host-dependent; `edgesdk "
            f"profiles detect --write` records it): took the first type; {order[0]} weights = {w_why} = "
            f"{_gb(w)}, {kv_why}",
            False,
            0,
        )
    budget = budget_gb * GB
    head = (
        f"budget {budget_gb} GB (profile {profile.name}: usable memory minus "
        f"{profile.memory_headroom_fraction:.0%} headroom)"
    )
    tried = []
    for rank, q in enumerate(order):
        w, w_why = _weight_bytes(facts, q)
        comp = compute_bytes(info, w, n_ubatch)
        need = _draft_need(draft, q, n_ubatch)
        extra = need.fixed + need.per_token * n_ctx
        total = w + kv + comp + extra
        tried.append(
            f"{q}: {w_why} = {_gb(w)} weights + {_gb(kv)} KV + {_gb(comp)} compute"
            + (f" + {_gb(extra)} draft at {n_ctx} ctx [{need.why}]" if draft is not None else "")
            + f" = {_gb(total)}"
        )
        if total <= budget:
            why = f"{tried[-1]} <= {head}; {kv_why}"
            if len(tried) > 1:
                why += "; larger types did not fit: " + "; ".join(f"{t} > budget" for t in tried[:-1])
            return _Fit(q, n_ctx, why, False, rank)
    q = order[-1]
    w = _weight_bytes(facts, q)[0]
    comp = compute_bytes(info, w, n_ubatch)
    need = _draft_need(draft, q, n_ubatch)
    spare = budget - w - comp - need.fixed
    per_tok = kv_bytes(info, 1, kv_type) + need.per_token
    fit_ctx = min(int(spare // per_tok) // 256 * 256 if spare > 0 else 0, n_ctx)
    with_draft = " (the draft model's included)" if draft is not None else ""
    if fit_ctx < min_ctx:
        least = w + comp + need.fixed + per_tok * min_ctx
        raise ResourceError(
            f"{facts.name} does not fit profile {profile.name}: smallest allowed type {q} needs "
            f"{_gb(least)} at the minimum context "
            f"{min_ctx} ({_gb(w)} weights + {_gb(kv_bytes(info, min_ctx, kv_type))} KV"
            + (f" + {_gb(need.fixed + need.per_token * min_ctx)} draft model" if draft is not None else "")
            + f"), budget is {budget_gb} GB"
        )
    why = (
        f"no type fits at {n_ctx} ctx ({'; '.join(t + ' > budget' for t in tried)}); {q} leaves "
        f"{_gb(spare)} of {head}{with_draft} for KV at {_gb(per_tok)}/token{with_draft} -> {fit_ctx} ctx "
        f"(rounded down to 256, >= min {min_ctx})"
    )
    return _Fit(q, fit_ctx, why, True, len(order) - 1)


def _kv_type(profile: Profile, use_fa: bool) -> tuple[str, str]:
    """The K/V cache type: the profile's ``policy.llm.kv_type`` when it names one and flash attention is on,
    else llama.cpp's default f16."""
    asked = profile.llm.kv_type
    if asked is None or str(asked).lower() == DEFAULT_KV_TYPE:
        return DEFAULT_KV_TYPE, (
            f"llama.cpp's default K and V cache type (f16); profile {profile.name} sets no other policy.llm.kv_type"
        )
    name = str(asked).lower()
    if name not in KV_TYPE_BYTES:
        raise InputError(
            f"profile {profile.name}: policy.llm.kv_type {asked!r} is not a llama.cpp KV cache type "
            f"(known: {', '.join(KV_TYPE_BYTES)})"
        )
    if not use_fa:
        return DEFAULT_KV_TYPE, (
            f"profile {profile.name} asks for {name}, but flash attention is off: llama.cpp "
            "refuses a quantized V cache without it ('V cache quantization requires "
            "flash_attn', src/llama-context.cpp), so the cache stays f16"
        )
    return name, (
        f"profile {profile.name} policy.llm.kv_type {name} with flash attention on: K and V cached as "
        f"{name} ({KV_TYPE_BYTES[name]:g} B per element vs 2 for f16; llama.cpp --cache-type-k/-v)"
    )


def _batch_target(profile: Profile, use_fa: bool) -> tuple[int, str]:
    """The micro-batch the plan aims for before the memory arithmetic (``policy.llm.n_ubatch`` overrides)."""
    asked = profile.llm.n_ubatch
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked, f"profile {profile.name} policy.llm.n_ubatch {asked}"
    if profile.is_gpu and use_fa:
        return N_UBATCH_GPU, (
            f"GPU profile with every layer offloaded and flash attention on: {N_UBATCH_GPU} ({BATCH_MEASUREMENT})"
        )
    if profile.is_gpu:
        return N_UBATCH, (
            f"GPU profile without flash attention: llama-cpp-python's default {N_UBATCH} (without "
            "flash attention the attention scores of a micro-batch are materialised, n_ubatch x "
            "context per head, so a larger micro-batch costs memory; the H200 gain was measured "
            "with flash attention on)"
        )
    return N_UBATCH, (
        f"CPU profile: llama-cpp-python's default {N_UBATCH}; a larger micro-batch does not speed a "
        "CPU up and costs compute-buffer memory"
    )


# ---------------------------------------------------------------------------------------------
# Serving: the engine's slot count and prefill chunk (edgesdk serve; issue 35 item 2)

# The most slots planned on a GPU: on an H100 the aggregate rate of `edgesdk serve` rose with every added client
# up to 16, the most slots measured (F16 4,108.5 tok/s = 6.70x one client; Q4_K_M 4.48x), docs/benchmarks.md
# "The load curve" (tools/bench/results/serve_curve_h100_f16.json, serve_curve_h100_q4.json).
SLOTS_GPU = 16
# The CPU: on the 2-core host 2 clients gave 1.35x / 1.60x one client and 4 clients 1.27x / 1.74x with 4 slots
# (serve_curve_cpu_engine.json, serve_curve_cpu_engine_full.json), and 4 clients 1.85x --parallel 1 against
# llama-server (serve_llm_cpu_vs_llama_server.json): 4 slots on 2 cores, 2 per core where a profile lists cores.
SLOTS_CPU_CORES = 2
SLOTS_PER_CPU_CORE = 2
SLOTS_MAX = 256  # serve --parallel's range
# The slots' KV cache may take this share of what the budget leaves after weights and compute buffer: the
# shares `edgesdk serve` applies at start-up (serve/batch_worker.py decide_parallel: half the free memory of a
# discrete GPU, a quarter of the available memory of a CPU or a unified-memory Jetson).
KV_SHARE_DISCRETE = 0.5
KV_SHARE_UNIFIED = 0.25
# llama.cpp prefill on the H200 as a fraction of the FP16 peak (edgesdk/data/profiler/efficiency.yaml, from
# tools/bench/results/p4_h200.json: TinyLlama-1.1B-shaped, 512-token prompts, 98.1k tok/s F16, 44.4k tok/s
# Q4_K_M): how fast matrix products of many tokens run, for prompt chunks and for a decode step of many slots.
# Smaller models on big GPUs are launch-bound and land below it (0.019 at 246M): there a step grows less than
# its tokens, so estimates from these figures err toward fewer slots and smaller chunks.
MATMUL_EFFICIENCY = {"float": 0.218, "quantized": 0.099}
# A step that carries a prompt chunk delays every generating stream's next token by the chunk's time. Target:
# the CPU's measured step, which met the mixed-load goal (issue 35): 128 prompt tokens of Gemma-3-270M
# (268,098,176 params) Q4_K_M on 2 cores in 211 ms (331 ms measured minus 2 x 60 ms, docs/benchmarks.md "The
# CPU curve and mixed load with the one engine").
PREFILL_STEP_S = 0.2
# From the ridge on (the sequences at which a decode step's matrix products take as long as reading the weights)
# a step is compute-bound and each added sequence slows the others; the aggregate still grows, more slowly: on the
# H100, Q4_K_M (ridge estimated at ~8.9 from the figures below) gained 1.27x from 8 to 16 clients (2,575.9 ->
# 3,268.8 tok/s), F16 (ridge ~64) 1.56x (docs/benchmarks.md, The load curve). Slots go up to twice the ridge.
RIDGE_FACTOR = 2
CPU_CHUNK_TOKENS, CPU_CHUNK_PARAMS, CPU_CHUNK_CORES = 128, 268_098_176, 2
PREFILL_CHUNK_MAX = 512  # the chunk of the H100 load curve (PREFILL_BUDGET_GPU in runtime/batching.py then)
PREFILL_CHUNK_MIN = 32  # and the smallest: a 4,096-token prompt then takes 128 steps
CHUNK_STEP = 32  # chunks are multiples of this


def _matmul_efficiency(quant: str) -> tuple[float, str]:
    if quant in ("F32", "F16", "BF16"):
        return MATMUL_EFFICIENCY["float"], f"{MATMUL_EFFICIENCY['float']} (H200 llama.cpp F16 prefill)"
    return MATMUL_EFFICIENCY["quantized"], f"{MATMUL_EFFICIENCY['quantized']} (H200 llama.cpp Q4_K_M prefill)"


def _slots(
    facts: ModelFacts,
    profile: Profile,
    quant: str,
    n_ctx: int,
    kv_type: str,
    n_ubatch: int,
    draft: DraftSource | None = None,
) -> tuple[int, str]:
    info = facts.extra
    params = float(facts.params or 0)
    w = _weight_bytes(facts, quant)[0]
    cores = profile.cpu_cores
    if profile.is_gpu:
        base = SLOTS_GPU
        why = [
            f"GPU profile: at most {SLOTS_GPU} (on an H100 the aggregate rate of edgesdk serve rose with every "
            f"added client up to {SLOTS_GPU}, the most slots measured: 6.70x one client F16, 4.48x Q4_K_M; "
            "docs/benchmarks.md, The load curve)"
        ]
    elif cores:
        base = min(SLOTS_MAX, SLOTS_PER_CPU_CORE * cores)
        why = [
            f"CPU profile with {cores} cores: {SLOTS_PER_CPU_CORE} per core = {base} (the 2-core host's curve: "
            "2 clients 1.35-1.60x one client, 4 clients 1.27-1.85x with 4 slots; docs/benchmarks.md)"
        ]
    else:
        base = SLOTS_PER_CPU_CORE * SLOTS_CPU_CORES
        why = [
            f"CPU profile without a core count: {base}, the measured 2-core host's best (2 clients 1.35-1.60x one "
            "client, 4 clients 1.27-1.85x with 4 slots; docs/benchmarks.md, The CPU curve and mixed load)"
        ]
    slots = base
    peak, bw = profile.figure("device.peak.fp16_tflops"), profile.figure("device.memory.bandwidth_gbps")
    if profile.is_gpu and peak and bw and params:
        eff, eff_why = _matmul_efficiency(quant)
        per_weight = w / params
        ridge = float(peak) * 1e12 * eff * per_weight / (2 * float(bw) * 1e9)
        ridge_slots = max(1, int(RIDGE_FACTOR * ridge))
        why.append(
            f"a decode step stays bound by reading the weights up to ~{ridge:.1f} sequences = peak "
            f"{peak:g} TFLOPS x efficiency {eff_why} x {per_weight:.3f} B per weight ({quant}) / (2 FLOP per weight "
            f"x {bw:g} GB/s) (profile figures); past it each added slot slows the others and the aggregate grows "
            f"more slowly (H100 Q4_K_M: 1.27x from 8 to 16 clients past a ridge of ~8.9), so at most "
            f"{RIDGE_FACTOR} x the ridge = {ridge_slots}"
        )
        if ridge_slots < slots:
            slots = ridge_slots
    else:
        why.append("no peak/bandwidth figures in the profile: no compute limit applied")
    budget_gb = profile.memory_budget_gb()
    need = _draft_need(draft, quant, n_ubatch)
    per_slot = kv_bytes(info, n_ctx, kv_type) + need.per_token * n_ctx
    if budget_gb is not None and per_slot:
        unified = not profile.is_gpu or bool(profile.unified_memory)
        share = KV_SHARE_UNIFIED if unified else KV_SHARE_DISCRETE
        comp = compute_bytes(info, w, n_ubatch)
        left = max(0.0, budget_gb * GB - w - comp - need.fixed)
        fit = max(1, int(share * left // per_slot))
        where = "unified memory" if unified else "discrete GPU memory"
        drafted = f" and the draft model's (its KV per slot, {_gb(need.fixed)} weights and compute)" if draft else ""
        why.append(
            f"KV cache per slot {_gb(per_slot)} ({n_ctx} ctx, {kv_type}{drafted}); {share:g} of what the budget "
            f"{budget_gb} GB leaves after {_gb(w)} weights and {_gb(comp)} compute ({where}, the share edgesdk "
            f"serve applies at start-up) holds {fit}"
        )
        if fit < slots:
            slots = fit
    else:
        why.append("no memory figure in the profile: the slots' KV cache is sized at start-up")
    slots = max(1, min(slots, SLOTS_MAX))
    total = slots * n_ctx
    return slots, f"{slots}: " + "; ".join(why) + f"; context budget {slots} x {n_ctx} = {total:,} tokens"


def _prefill_chunk(facts: ModelFacts, profile: Profile, quant: str, n_batch: int) -> tuple[int, str]:
    params = float(facts.params or 0)
    cap = min(PREFILL_CHUNK_MAX, n_batch)
    peak = profile.figure("device.peak.fp16_tflops")
    if profile.is_gpu and peak and params:
        eff, eff_why = _matmul_efficiency(quant)
        raw = PREFILL_STEP_S * float(peak) * 1e12 * eff / (2 * params)
        how = (
            f"{raw:,.0f} prompt tokens take {PREFILL_STEP_S} s = {PREFILL_STEP_S} s x peak {peak:g} TFLOPS "
            f"(profile) x efficiency {eff_why} / (2 x {int(params):,} params)"
        )
    elif profile.is_gpu:
        raw = float(cap)
        how = "the profile has no FP16 peak figure: the load curve's chunk"
    else:
        cores = profile.cpu_cores or CPU_CHUNK_CORES
        raw = CPU_CHUNK_TOKENS * (CPU_CHUNK_PARAMS / params if params else 1.0) * (cores / CPU_CHUNK_CORES)
        how = (
            f"{raw:,.0f} prompt tokens take about {PREFILL_STEP_S} s: the measured 2-core step (128 tokens of "
            f"Gemma-3-270M, {CPU_CHUNK_PARAMS:,} params, in 211 ms) scaled by {int(params):,} params and "
            f"{cores} cores" + ("" if profile.cpu_cores else " (no core count in the profile: the measured host's)")
        )
    chunk = int(raw) // CHUNK_STEP * CHUNK_STEP
    chunk = max(min(PREFILL_CHUNK_MIN, cap), min(chunk, cap))
    return chunk, (
        f"{chunk} prompt tokens per engine step: a step that carries a prompt chunk delays every generating "
        f"stream's next token by the chunk's time, aimed at {PREFILL_STEP_S} s (the CPU step that met the "
        f"mixed-load goal, docs/benchmarks.md); {how}; a multiple of {CHUNK_STEP} in [{PREFILL_CHUNK_MIN}, "
        f"{cap}] (at most {PREFILL_CHUNK_MAX}, the H100 load curve's chunk, and n_batch {n_batch})"
    )


def serving_decisions(
    facts: ModelFacts,
    profile: Profile,
    quant: str,
    n_ctx: int,
    kv_type: str,
    n_batch: int,
    draft: DraftSource | None = None,
) -> list[Decision]:
    """``serving.slots`` (``edgesdk serve``'s default ``--parallel``) and ``serving.prefill_chunk`` (prompt tokens
    per engine step) for ``quant`` at ``n_ctx`` (docs/gguf.md, "Serving"); ``draft``: the bundle's draft model,
    whose context holds a sequence per slot too."""
    slots, slots_why = _slots(facts, profile, quant, n_ctx, kv_type, n_batch, draft)
    chunk, chunk_why = _prefill_chunk(facts, profile, quant, n_batch)
    return [Decision("serving.slots", slots, slots_why), Decision("serving.prefill_chunk", chunk, chunk_why)]


@dataclass
class QuantCandidate(JSONable):
    """One type a parity miss falls back to (``gguf.parity_fallback``); ``ppl_ratio_max`` None: repackaged."""

    quant_type: str
    ppl_ratio_max: float | None

    def to_json(self) -> JSONValue:
        return {"quant_type": self.quant_type, "ppl_ratio_max": self.ppl_ratio_max}


def _candidates(value: JSONValue) -> list[QuantCandidate]:
    assert isinstance(value, list)
    out = []
    for entry in value:
        assert isinstance(entry, dict)
        limit = entry.get("ppl_ratio_max")
        out.append(QuantCandidate(str(entry["quant_type"]), float(limit) if isinstance(limit, int | float) else None))
    return out


@dataclass
class ChatTemplateChoice(JSONable):
    """The chat template a GGUF build bundles (``gguf.chat_template``): ``template`` a shipped name or the path
    of a Jinja file given with ``--chat-template``, None when none is bundled (the GGUF's own is used, or there
    is none); ``source``: ``requested`` | ``gguf`` | ``architecture`` | ``none`` (chat_templates.plan_decision)."""

    template: str | None
    source: str

    def to_json(self) -> JSONValue:
        return {"template": self.template, "source": self.source}

    @classmethod
    def from_json(cls, value: JSONValue) -> ChatTemplateChoice:
        assert isinstance(value, dict)
        template = value.get("template")
        return cls(str(template) if template is not None else None, str(value.get("source")))


@dataclass
class GgufPlan(PlanSection):
    """The GGUF format's decisions (llama.cpp): what the build converts/quantizes to and what the runtime gets."""

    source: str = ""  # gguf.source: convert / requantize / repackage, as the build does it
    quant_type: str = ""
    context_length: int = 0
    n_gpu_layers: int | str = 0  # "all" or 0
    flash_attn: bool = False
    threads: int | str = "auto"  # profile core count or "auto"
    n_ubatch: int | None = None  # None: a plan without the batch decisions (llama-cpp-python's defaults)
    n_batch: int | None = None
    kv_type: str | None = None
    slots: int | None = None  # serving.slots; None: a plan without the decision (the runtime's defaults)
    prefill_chunk: int | None = None  # serving.prefill_chunk; None: as slots
    parity: dict[str, JSONValue] = field(default_factory=dict)  # perplexity-ratio / logits limits ({}: repackaged)
    parity_fallback: list[QuantCandidate] = field(default_factory=list)  # tried in order on a parity miss
    chat_template: ChatTemplateChoice | None = None  # None: a plan without the decision (nothing bundled)
    draft: DraftChoice | None = None  # gguf.draft: the draft model (--draft); None: none packed

    FIELDS: ClassVar[dict[str, str]] = {
        "gguf.source": "source",
        "gguf.quant_type": "quant_type",
        "gguf.context_length": "context_length",
        "gguf.n_gpu_layers": "n_gpu_layers",
        "gguf.flash_attn": "flash_attn",
        "gguf.threads": "threads",
        "gguf.n_ubatch": "n_ubatch",
        "gguf.n_batch": "n_batch",
        "gguf.kv_type": "kv_type",
        "serving.slots": "slots",
        "serving.prefill_chunk": "prefill_chunk",
        "parity": "parity",
        "gguf.parity_fallback": "parity_fallback",
        "gguf.chat_template": "chat_template",
        "gguf.draft": "draft",
    }
    PARSE: ClassVar[dict[str, object]] = {
        "parity_fallback": _candidates,
        "chat_template": ChatTemplateChoice.from_json,
        "draft": DraftChoice.from_json,
    }


def gguf_section(section: PlanSection) -> GgufPlan:
    """``section`` as a :class:`GgufPlan` (a VLM plan is one; a plan made elsewhere is typed here)."""
    return section if isinstance(section, GgufPlan) else GgufPlan.from_decisions(section.decisions())


def plan_gguf(facts: ModelFacts, profile: Profile, options: BuildOptions, draft: DraftSource | None = None) -> GgufPlan:
    """Quant type, context, offload, flash attention, batch sizes, KV type and threads for ``profile``
    (see module docstring). ``draft``: the draft model ``--draft`` packs (read by the format's ``plan``), counted
    in the memory arithmetic (weights, compute buffer, its KV cache per slot) beside the model."""
    info = _check_shape(facts)
    llm = profile.llm
    ctx_train = int(info.get("ctx_train") or 4096)
    if options.context_length is not None and (
        isinstance(options.context_length, bool)
        or not isinstance(options.context_length, int)
        or options.context_length < 1
    ):
        raise InputError(f"context length must be a positive integer, got {options.context_length!r}")
    want_ctx = int(options.context_length or llm.context_length or 4096)
    n_ctx = min(want_ctx, ctx_train)
    min_ctx = min(int(llm.min_context_length or 512), n_ctx)
    ctx_note = f" (capped at the model's trained context {ctx_train})" if want_ctx > ctx_train else ""
    order, order_why = _candidate_types(facts, profile, options)
    fa = profile.kernel("flash_attention")
    use_fa = bool(profile.is_gpu and fa.supported)
    kv_type, kv_why = _kv_type(profile, use_fa)
    target, batch_why = _batch_target(profile, use_fa)
    try:
        fit = _fit_memory(facts, profile, info, order, n_ctx, min_ctx, kv_type, target, draft)
    except ResourceError:
        if target <= N_UBATCH:
            raise
        fit = None
    if target > N_UBATCH and (fit is None or fit.rank > 0 or fit.shortened):
        # The larger micro-batch must not cost quality: keep it only if the default one fits no better.
        small = _fit_memory(facts, profile, info, order, n_ctx, min_ctx, kv_type, N_UBATCH, draft)
        if fit is None or (small.rank, -small.n_ctx) < (fit.rank, -fit.n_ctx):
            lost = "leave no type that fits" if fit is None else f"push the plan to {fit.quant} at {fit.n_ctx} ctx"
            batch_why += (
                f"; but its compute buffer would {lost} where n_ubatch {N_UBATCH} keeps {small.quant} at "
                f"{small.n_ctx} ctx, so {N_UBATCH}"
            )
            fit, target = small, N_UBATCH
    assert fit is not None
    chosen, mem_why = fit.quant, fit.why
    if fit.shortened:
        n_ctx, ctx_note = fit.n_ctx, " (shortened to fit the memory budget)"
    source_type = info.get("file_type") if facts.kind == "gguf" else None
    if facts.kind == "hf":
        action = (
            f"convert HF -> F16 GGUF (gguf-py), then llama.cpp quantize -> {chosen}"
            if chosen != "F16"
            else "convert HF -> F16 GGUF (gguf-py)"
        )
    elif source_type == chosen:
        action = f"repackage: source is already {chosen}"
    else:
        action = f"requantize {source_type} -> {chosen} with llama.cpp quantize"
    source_desc = (
        "a HF " + str(info.get("architecture")) + " directory"
        if facts.kind == "hf"
        else "a " + str(source_type) + " GGUF file"
    )
    out: list[Decision] = []
    out.append(Decision("gguf.source", action, f"source is {source_desc}"))
    out.append(Decision("gguf.quant_type", chosen, f"{order_why}; {mem_why}"))
    out.append(Decision("gguf.context_length", n_ctx, f"profile policy.llm.context_length {want_ctx}{ctx_note}"))
    out.extend(_runtime_decisions(profile, info, use_fa=use_fa, fa_entry=fa))
    n_ubatch = min(target, n_ctx)
    cap = f", capped at the context {n_ctx}" if n_ubatch < target else ""
    w = _weight_bytes(facts, chosen)[0]
    comp = compute_bytes(info, w, n_ubatch)
    out.append(
        Decision(
            "gguf.n_ubatch",
            n_ubatch,
            f"{batch_why}{cap}; compute buffer at {n_ubatch} = "
            f"{n_ubatch} x (n_vocab + ffn + 4 x hidden) x 4 B + 5 % of weights = {_gb(comp)}, "
            f"counted in the memory arithmetic; {BATCH_SOURCE}",
        )
    )
    out.append(
        Decision(
            "gguf.n_batch",
            n_ubatch,
            f"= n_ubatch: llama-cpp-python evaluates a prompt in chunks of "
            f"n_batch tokens (Llama.eval) and caps n_ubatch at n_batch, so a prompt of up to {n_ubatch} "
            "tokens is one llama_decode call of one micro-batch",
        )
    )
    out.append(Decision("gguf.kv_type", kv_type, kv_why))
    out.extend(serving_decisions(facts, profile, chosen, n_ctx, kv_type, n_ubatch, draft))
    ref = "F16 conversion" if facts.kind == "hf" else "source GGUF"
    parity = {"ppl_ratio_max": ppl_limit(profile, chosen)}
    why = f"perplexity of the {chosen} file on the built-in text / that of the {ref} <= {parity['ppl_ratio_max']}"
    if facts.kind == "gguf" and source_type == chosen:
        parity, why = {}, "repackaged: the bytes are the source's (sha256 in the manifest); nothing to compare"
    if facts.kind == "hf":
        parity.update(logits_min_cosine=LOGITS_MIN_COSINE, logits_min_top1=LOGITS_MIN_TOP1)
        why += (
            f"; HF (fp32) vs F16 GGUF logits on sample prompts: min cosine >= {LOGITS_MIN_COSINE}, "
            f"top-1 agreement >= {LOGITS_MIN_TOP1}"
        )
    out.append(Decision("parity", parity, why))
    return GgufPlan.from_decisions(out)


def ppl_limit(profile: Profile, quant: str) -> float:
    """The perplexity-ratio limit of ``quant``: the profile's ``policy.parity.<type>.ppl_ratio_max`` when it
    sets one, else :data:`PPL_RATIO_MAX` (1.1 for a type without a figure)."""
    table = profile.parity_overrides(quant)
    value = table.get("ppl_ratio_max") if isinstance(table, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return PPL_RATIO_MAX.get(quant, 1.1)


def parity_fallback_decision(facts: ModelFacts, profile: Profile, options: BuildOptions, plan: GgufPlan) -> Decision:
    """What a parity miss of the chosen type leads to (``--on-parity-fail``).

    With ``fallback``: the types of the profile's quant order with more bits per weight than the chosen
    one, next-better first (e.g. Q4_K_M -> Q5_K_M -> Q8_0 -> F16), that fit the memory budget at the
    planned context; a quantized GGUF source adds its own type (repackaged unchanged) and drops types above
    it (requantizing up cannot restore precision). Value: ``[{"quant_type", "ppl_ratio_max"}, ...]``, tried
    in that order; empty with ``error`` (the default), where a miss fails the build (exit 5)."""
    chosen, n_ctx = plan.quant_type, plan.context_length
    info = facts.extra
    order = list(profile.llm.quant_order or ["Q8_0", "Q4_K_M"])
    source_type = info.get("file_type") if facts.kind == "gguf" else None
    pool = [q for q in order if q in BPW]
    notes = []
    if source_type in BPW:
        if source_type not in pool:
            pool.append(source_type)
        above = [q for q in pool if BPW[q] > BPW[source_type]]
        if above:
            notes.append(
                f"above the source's {source_type} ({', '.join(above)}): requantizing up cannot restore precision"
            )
        pool = [q for q in pool if BPW[q] <= BPW[source_type]]
    higher = sorted({q for q in pool if BPW[q] > BPW[chosen]}, key=lambda q: BPW[q])
    budget_gb = profile.memory_budget_gb()
    kv_type = plan.kv_type or DEFAULT_KV_TYPE
    n_ubatch = plan.n_ubatch or N_UBATCH
    kv = kv_bytes(info, n_ctx, kv_type)
    fits: list[dict[str, Any]] = []
    shown = []
    for q in higher:
        w, _ = _weight_bytes(facts, q)
        total = w + kv + compute_bytes(info, w, n_ubatch)
        if budget_gb is not None and total > budget_gb * GB:
            notes.append(f"{q} needs {_gb(total)} at {n_ctx} ctx > budget {budget_gb} GB")
            continue
        repack = facts.kind == "gguf" and q == source_type
        fits.append({"quant_type": q, "ppl_ratio_max": None if repack else ppl_limit(profile, q)})
        detail = (
            "the source repackaged, nothing to compare"
            if repack
            else f"{_gb(total)}, ppl ratio <= {ppl_limit(profile, q)}"
        )
        shown.append(f"{q} ({detail})")
    listed = " -> ".join(shown) or "none"
    skipped = f"; not tried: {'; '.join(notes)}" if notes else ""
    if options.on_parity_fail != "fallback":
        return Decision(
            "gguf.parity_fallback",
            [],
            f"--on-parity-fail {options.on_parity_fail}: a parity miss of "
            f"{chosen} fails the build (exit 5); with --on-parity-fail fallback the build would try "
            f"{listed}{skipped}",
        )
    if not fits:
        return Decision(
            "gguf.parity_fallback",
            [],
            f"--on-parity-fail fallback, but no type of the quant order "
            f"{order} has more bits than {chosen} and fits: a miss still fails the build (exit 5)"
            f"{skipped}",
        )
    return Decision(
        "gguf.parity_fallback",
        fits,
        f"--on-parity-fail fallback: if {chosen} misses parity, try the "
        f"next type of the quant order {order} with more bits that fits the budget at {n_ctx} ctx, in "
        f"turn: {listed}; each attempt is recorded with its figures, and the build fails (exit 5) only "
        f"if none passes{skipped}",
    )


def _runtime_decisions(
    profile: Profile, info: dict[str, Any], *, use_fa: bool, fa_entry: KernelSupport
) -> list[Decision]:
    out = []
    if profile.is_gpu:
        out.append(
            Decision(
                "gguf.n_gpu_layers",
                "all",
                f"weights + KV fit the budget, so all {info['layers']} "
                "layers (and the output layer) go to the GPU; the runtime re-sizes to free device "
                "memory at load time and records any step down",
            )
        )
    else:
        out.append(Decision("gguf.n_gpu_layers", 0, f"profile {profile.name} has no GPU"))
    out.append(
        Decision(
            "gguf.flash_attn",
            use_fa,
            f"profile kernel table: flash_attention supported={fa_entry.supported} ({fa_entry.source})",
        )
    )
    cores = profile.cpu_cores
    out.append(
        Decision(
            "gguf.threads",
            cores or "auto",
            f"profile lists {cores} CPU cores"
            if cores
            else "profile lists no core count: the runtime uses the physical cores it finds",
        )
    )
    return out
