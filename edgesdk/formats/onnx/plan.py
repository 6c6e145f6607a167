# SPDX-License-Identifier: Apache-2.0
"""ONNX plan: export, graph optimization, precision of the ONNX artifact, the EP chain and parity.

Pure: reads the facts and the profile only. TensorRT reuses :func:`export_decisions` for the ONNX
it hands to the engine builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from edgesdk.errors import InputError, ResourceError
from edgesdk.profiles import execution_provider_chain, parity_thresholds
from edgesdk.types import (
    BuildOptions,
    Decision,
    JSONable,
    JSONValue,
    ModelFacts,
    OptimizeMethod,
    PlanSection,
)

if TYPE_CHECKING:
    from edgesdk.profiles import Profile

FUSION_MODEL_TYPE = {
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "distilbert": "bert",
    "mpnet": "bert",
    "electra": "bert",
    "albert": "bert",
}


@dataclass
class ShapeBuckets(JSONable):
    """The static shapes the runtime captures CUDA graphs for (:func:`shape_buckets_decision`)."""

    batch: list[int]
    seq: list[int] | None  # None: no token axis
    capture: str  # "at load" | "on request"

    def to_json(self) -> JSONValue:
        return {
            "batch": list(self.batch),
            "seq": list(self.seq) if self.seq is not None else None,
            "capture": self.capture,
        }

    @classmethod
    def from_json(cls, value: JSONValue) -> ShapeBuckets:
        assert isinstance(value, dict)
        batch, seq = value["batch"], value.get("seq")
        assert isinstance(batch, list) and (seq is None or isinstance(seq, list))
        return cls(
            [int(str(b)) for b in batch],
            [int(str(s)) for s in seq] if seq is not None else None,
            str(value.get("capture")),
        )


@dataclass
class OnnxPlan(PlanSection):
    """The ONNX format's decisions (also the ONNX half of :class:`~edgesdk.formats.tensorrt.plan.TensorRTPlan`)."""

    export: str = ""
    optimize: OptimizeMethod = OptimizeMethod.ONNXSLIM
    onnx_precision: str | None = None  # the ONNX artifact's precision where it is not the plan's (TensorRT)
    quantize: str | None = None
    memory_gb: float | None = None  # None: the profile has no memory figure
    ep_chain: list[str] = field(default_factory=list)
    shape_buckets: ShapeBuckets | None = None  # None: no CUDA EP in the chain
    parity: dict[str, float | None] = field(default_factory=dict)  # thresholds of the ONNX artifact's precision
    eager_fallback: str | None = None  # "safetensors+config": the bundle carries weights for eager CUDA
    # The thresholds of the artifact's precision and of each precision a parity fallback may reach (the verify
    # stage's, :meth:`thresholds`), decided by the planner from the profile; not a decision of its own (the plan's
    # JSON carries ``parity``, the artifact precision's, as before; sections compare by their decisions).
    parity_by_precision: dict[str, dict[str, float | None]] = field(default_factory=dict, compare=False)

    FIELDS: ClassVar[dict[str, str]] = {
        "export": "export",
        "optimize": "optimize",
        "onnx_precision": "onnx_precision",
        "quantize": "quantize",
        "memory": "memory_gb",
        "ep_chain": "ep_chain",
        "shape_buckets": "shape_buckets",
        "parity": "parity",
        "eager_fallback": "eager_fallback",
    }
    PARSE: ClassVar[dict[str, object]] = {"optimize": OptimizeMethod, "shape_buckets": ShapeBuckets.from_json}

    def thresholds(self, precision: str) -> dict[str, float | None]:
        """The parity thresholds an artifact of ``precision`` is verified against, as the plan decided them. A
        section made from decisions alone (a registered format's plan, typed here) has only ``parity``, which then
        stands for every precision."""
        if precision in self.parity_by_precision:
            return dict(self.parity_by_precision[precision])
        if not self.parity_by_precision:
            return dict(self.parity)
        raise InputError(
            f"the plan decided no parity thresholds for {precision} (it has {', '.join(self.parity_by_precision)})"
        )

    def decide_parity(self, profile: Profile, precision: str) -> None:
        """Fill :attr:`parity_by_precision` for an artifact of ``precision`` and every parity fallback from it."""
        table: dict[str, dict[str, float | None]] = {}
        current: str | None = precision
        while current is not None:
            table[current] = parity_thresholds(profile, current)
            current = next_precision(current, profile.precision_order)
        self.parity_by_precision = table


FIDELITY = ["int8", "fp16", "bf16", "fp32"]  # lowest to highest


def next_precision(current: str, profile_order: list[str]) -> str | None:
    """The next higher-fidelity precision the profile allows (fp32 always), for a parity fallback."""
    higher = FIDELITY[FIDELITY.index(current) + 1 :] if current in FIDELITY else []
    for p in higher:
        if p in profile_order or p == "fp32":
            return p
    return None


def onnx_section(section: PlanSection) -> OnnxPlan:
    """``section`` as an :class:`OnnxPlan` (a plan made by a registered format that builds with the ONNX stages
    carries its decisions untyped: they are typed here)."""
    return section if isinstance(section, OnnxPlan) else OnnxPlan.from_decisions(section.decisions())


def ep_chain_decision(profile: Profile) -> Decision:
    return Decision(
        "ep_chain",
        execution_provider_chain(profile),
        "profile's execution providers, best first; the "
        "runtime takes only those present and records each fallback; CPU is always last",
    )


def parity_decision(profile: Profile, options: BuildOptions, precision: str) -> Decision:
    return Decision(
        "parity",
        parity_thresholds(profile, precision),
        f"{precision} thresholds vs the PyTorch/source "
        f"outputs on {options.parity_samples} sample inputs; a miss "
        + ("falls back to the next precision" if options.on_parity_fail == "fallback" else "fails the build"),
    )


# Weight bytes at a precision relative to an FP32 source (INT8: weights only; scales are ~1 %).
PRECISION_BYTES = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25}


def _size(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n < 1e8 else f"{n / 1e9:.2f} GB"


def memory_decision(facts: ModelFacts, profile: Profile, precision: str) -> Decision:
    """The artifact's weights must fit the profile's memory budget (ResourceError, exit 8, when not).

    Weights only: ONNX Runtime keeps one copy of each initializer after load; activations depend on
    batch and sequence and are the caller's. A lower bound, so a model refused here cannot run there."""
    budget_gb = profile.memory_budget_gb()
    size = facts.weight_bytes or 0
    factor = PRECISION_BYTES.get(precision, 1.0) if facts.kind in ("hf", "torch") else 1.0
    need = size * factor
    arith = f"{_size(size)} source weights x {factor} ({precision})" if factor != 1.0 else f"{_size(size)} weights"
    if budget_gb is None:
        return Decision("memory", None, f"profile {profile.name} has no memory figure; {arith} not checked")
    if need > budget_gb * 1e9:
        raise ResourceError(
            f"{facts.name} does not fit profile {profile.name}: {arith} = {_size(need)} > budget {budget_gb} GB",
            hint="pick a larger device profile or a smaller model",
        )
    return Decision(
        "memory",
        round(need / 1e9, 3),
        f"{arith} = {_size(need)} <= budget {budget_gb} GB (profile {profile.name}); activations come on top",
    )


def plan_onnx(facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str) -> OnnxPlan:
    out = [
        *export_decisions(facts, profile, options, precision),
        memory_decision(facts, profile, precision),
        ep_chain_decision(profile),
        shape_buckets_decision(facts, profile, options),
        parity_decision(profile, options, precision),
    ]
    eager = eager_fallback_decision(facts, profile, precision)
    section = OnnxPlan.from_decisions(out + ([eager] if eager is not None else []))
    section.decide_parity(profile, section.onnx_precision or precision)
    return section


# Shape buckets for CUDA-graph capture (the runtime's defaults before the planner recorded them).
SEQ_BUCKETS = (32, 128, 256, 512)
BATCH_BUCKETS = (1, 8)
TEXT_TASKS = (
    "feature-extraction",
    "text-classification",
    "token-classification",
    "fill-mask",
    "question-answering",
    "sentence-similarity",
)


def shape_buckets_decision(facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision:
    """The static shapes the runtime captures CUDA graphs for, one graph per bucket (batch x sequence).

    CUDA graphs replay fixed kernels on fixed addresses, so a request is padded up to the smallest bucket
    that holds it and the padding is masked (the "upper bound + runtime mask" way to serve dynamic
    shapes). Value: ``{"batch": [..], "seq": [..] | None, "capture": "at load" | "on request"}``, or None
    where the profile's chain has no CUDA EP. Sequence buckets: 32/128/256/512 capped at the model's
    positions (or ``--max-seq-len``), plus that cap and the planned ``--seq-len``; none for a model
    without a token axis. Batch buckets: 1 and 8, capped by ``--max-batch`` (which is added)."""
    chain = execution_provider_chain(profile)
    if "CUDAExecutionProvider" not in chain:
        return Decision(
            "shape_buckets",
            None,
            f"profile {profile.name}'s EP chain ({' -> '.join(chain)}) has no "
            "CUDA EP: requests run at their own shapes (CUDA graphs, which need static shapes, do not "
            "apply)",
        )
    max_batch = options.option("max_batch")
    batches = sorted(
        {b for b in BATCH_BUCKETS if max_batch is None or b <= max_batch} | ({int(max_batch)} if max_batch else set())
    )
    positions = facts.config.get("max_position_embeddings")
    text = isinstance(positions, int) or facts.task in TEXT_TASKS
    seqs: list[int] | None = None
    seq_why = "no token axis (not a text model): batch buckets only"
    if text:
        user_cap = options.option("max_seq_len")
        cap = user_cap or (positions if isinstance(positions, int) and positions > 0 else None)
        ladder = {b for b in SEQ_BUCKETS if cap is None or b <= cap}
        if cap is not None and (user_cap or cap < max(SEQ_BUCKETS)):
            ladder.add(int(cap))  # the cap cuts the ladder (or the user asked for it): one bucket at the cap
        if cap is None or options.seq_len <= cap:
            ladder.add(options.seq_len)
        seqs = sorted(ladder)
        bound = (
            f"capped at {cap} ({'--max-seq-len' if user_cap else 'the model max positions'})"
            if cap and (user_cap or cap <= max(SEQ_BUCKETS))
            else f"none above {max(SEQ_BUCKETS)} although the model takes {cap} positions (a longer request runs "
            "the plain session; --max-seq-len adds a bucket)"
            if cap
            else "(the model states no max positions)"
        )
        seq_why = (
            f"sequence {'/'.join(map(str, seqs))}: the ladder {'/'.join(map(str, SEQ_BUCKETS))} {bound}, "
            f"with the planned --seq-len {options.seq_len}"
        )
    graphs = len(batches) * (len(seqs) if seqs else 1)
    cuda_graphs = profile.kernel("cuda_graphs")
    recommended = bool(cuda_graphs.recommended)
    capture = "at load" if recommended else "on request"
    when = (
        "the profile recommends CUDA graphs, so the runtime enables them at load"
        if recommended
        else f"profile {profile.name} does not recommend CUDA graphs "
        f"({cuda_graphs.source if cuda_graphs.source is not None else 'no reason given'}); "
        "the runtime uses these buckets when they are asked for (cuda_graphs=True)"
    )
    return Decision(
        "shape_buckets",
        {"batch": batches, "seq": seqs, "capture": capture},
        f"CUDA graphs need static shapes: up to {graphs} graphs, each captured on its bucket's first "
        f"request; a request is padded to the smallest bucket holding it and masked (attention_mask), "
        f"a larger one runs the plain session. Batch {'/'.join(map(str, batches))} "
        f"({'--max-batch' if max_batch else 'batch 1 latency and a small batch'}); {seq_why}. "
        f"{when[0].upper() + when[1:]}. Measured on an H200 (MiniLM FP16, batch 1, seq 128): "
        "plain run 0.54 ms, captured "
        "graph 0.22 ms; padded seq 100 -> 128: 0.34 ms",
    )


def eager_fallback_decision(facts: ModelFacts, profile: Profile, precision: str) -> Decision | None:
    """GPU profiles: ship the weights for an eager CUDA fallback (safetensors + config, not torch.export).

    Where no GPU execution provider initialises (the CPU-only onnxruntime of a GPU host) but PyTorch sees
    a CUDA device, the runtime measures the CPU EP against eager CUDA at load and runs the faster."""
    if not profile.is_gpu:
        return None
    if facts.kind != "hf":
        return Decision(
            "eager_fallback",
            None,
            f"GPU profile, but the source is {facts.kind!r}: no Hugging Face "
            "safetensors + config to rebuild the module from, so a device without a GPU execution "
            "provider runs this bundle on the CPU EP",
        )
    size = (facts.weight_bytes or 0) * PRECISION_BYTES.get(precision, 1.0)
    return Decision(
        "eager_fallback",
        "safetensors+config",
        f"GPU profile: the bundle also carries the weights "
        f"({precision} safetensors, ~{_size(size)}) and config.json, so where no GPU execution provider "
        "initialises but PyTorch sees a CUDA device (e.g. a GPU server with the CPU-only onnxruntime) the "
        "runtime measures CPU EP vs eager CUDA at load (a few warm runs, batch 1) and runs the faster, "
        "with both figures in the fallback record. Safetensors + config rather than a torch.export "
        "program: the same weight bytes, but loadable by any torch/transformers version, dynamic "
        "batch/sequence, no pickle; a .pt2 adds a graph traced at one shape for one torch release",
    )


def _optimize_decision(facts: ModelFacts, profile: Profile, precision: str) -> Decision:
    """optimize (ONNX Runtime bundles): standard ops only where TensorRT heads a Jetson's EP chain, the plain
    export for INT8 on a CPU, onnxruntime's transformer fusions for a Hugging Face family it knows, else onnxslim's
    cleanup; each reason carries the measurement behind it."""
    fusion = FUSION_MODEL_TYPE.get(facts.family or "")
    chain = execution_provider_chain(profile)
    if profile.kind == "jetson" and chain[:1] == ["TensorrtExecutionProvider"]:
        return Decision(
            "optimize",
            OptimizeMethod.ONNXSLIM,
            "TensorRT ships with JetPack and heads this "
            "profile's EP chain: standard ONNX ops only (onnxslim: constant folding, no onnxruntime "
            "contrib fusions such as Attention/SkipLayerNormalization/BiasGelu), so TensorRT takes "
            "the graph whole (MiniLM: 1 TensorRT partition, 0 crossings; fused: 41 partitions, 57 "
            "crossings)",
        )
    if precision == "int8" and not profile.is_gpu:
        return Decision(
            "optimize",
            OptimizeMethod.NONE,
            "plain export; ONNX Runtime's session optimizer runs "
            "at load: measured on CPU, INT8 on the fused graph ran at 0.56-0.68x FP32 "
            "against 0.52-0.58x on "
            "the plain export in the same runs, and fusion gave FP32 no gain (docs/int8.md)",
        )
    if fusion and facts.kind == "hf":
        heads = facts.config.get("num_attention_heads")
        hidden = facts.config.get("hidden_size")
        gpu = (
            (
                " Where the CUDA EP runs it (no TensorRT on the host), measured on an H200 (MiniLM FP16, batch 1, "
                "seq 128): fused 0.45 ms vs 1.06 ms for the standard-op graph, and only the fused graph captures as a "
                "CUDA graph (0.22 ms; the standard-op graph leaves 63 shape nodes on the CPU EP); for TensorRT "
                "pass --format tensorrt"
            )
            if profile.is_gpu
            else ""
        )
        return Decision(
            "optimize",
            OptimizeMethod.ORT_TRANSFORMER,
            f"onnxruntime transformer optimizer "
            f"(model_type={fusion}, heads={heads}, hidden={hidden}) fuses attention, "
            "LayerNorm+residual "
            "and GELU into single kernels that both CPU and CUDA EPs implement." + gpu,
        )
    return Decision(
        "optimize",
        OptimizeMethod.ONNXSLIM,
        "generic graph cleanup (constant folding, dead nodes); no transformer fusion pattern applies to this model",
    )


def export_decisions(
    facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str, fmt: str = "onnx"
) -> list[Decision]:
    """Export, optimize and precision decisions of the ONNX artifact (``fmt="tensorrt"``: the engine's input)."""
    out: list[Decision] = []
    if facts.kind == "hf":
        out.append(
            Decision(
                "export",
                f"optimum ONNX exporter, opset {options.opset}, dynamic batch/sequence axes",
                "optimum-onnx knows each Hugging Face architecture's inputs/outputs and dynamic axes",
            )
        )
    elif facts.kind == "torch":
        out.append(Decision("export", f"torch.onnx.export, opset {options.opset}", "plain nn.Module source"))
    else:
        out.append(Decision("export", "none (ONNX taken as is)", "the source is already ONNX"))
    if fmt == "tensorrt":
        out.append(
            Decision(
                "optimize",
                OptimizeMethod.ONNXSLIM,
                "TensorRT parses standard ONNX only: onnxruntime's "
                "fused com.microsoft ops (Attention, SkipLayerNormalization) would split the engine",
            )
        )
        out.append(
            Decision(
                "onnx_precision",
                "fp32",
                f"TensorRT applies {precision} itself when it builds the "
                "engine; FP16-converted or dynamic-INT8 ONNX ops would fall off TensorRT",
            )
        )
        return out
    out.append(_optimize_decision(facts, profile, precision))
    if precision == "int8":
        out.append(
            Decision(
                "quantize",
                "accuracy-aware dynamic INT8 (per-channel weights), excluding the most "
                "sensitive nodes until parity holds",
                f"INT8 must keep min cosine >= {parity_thresholds(profile, 'int8')['min_cosine']} vs the source",
            )
        )
    elif precision == "fp16":
        out.append(
            Decision(
                "quantize",
                "FP16 weights and activations, keeping I/O FP32 and LayerNorm/Softmax "
                "inputs in FP32 where FP16 overflows",
                "GPU profile; halves weight bytes",
            )
        )
    return out
