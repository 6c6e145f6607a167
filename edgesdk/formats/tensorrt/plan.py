# SPDX-License-Identifier: Apache-2.0
"""TensorRT plan: target, precision flags, DLA, optimization profiles, engine cache key, and where the
engine is built (this host, or deferred to the device). Pure given the host facts passed in.

Build: :mod:`edgesdk.formats.tensorrt.build`. Engine config/cache/build: :mod:`edgesdk.formats.tensorrt.engine`.
Runtime side: :mod:`edgesdk.runtime.backends.tensorrt`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgesdk.errors import InputError
from edgesdk.formats.onnx.plan import OnnxPlan
from edgesdk.types import BuildOptions, Decision, JSONable, JSONValue, ModelFacts, PlanSection

if TYPE_CHECKING:
    from edgesdk.capability.checker import CapabilityReport
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile

Dims = list[Any]  # one input's dims: int static, str (a named axis) or None dynamic
ShapeTriple = dict[str, list[int]]  # {"min": dims, "opt": dims, "max": dims}

RUNTIME_CHAIN = ["tensorrt-engine", "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
PRECISION_FLAGS: dict[str, list[str]] = {
    "fp32": [],
    "fp16": ["fp16"],
    "bf16": ["bf16"],
    "int8": ["int8", "fp16"],
    "fp8": ["fp8", "fp16"],
}
DLA_MIN_NATIVE_SHARE = 0.8  # below this, DLA<->GPU transitions eat the DLA's power/throughput advantage
DEFAULT_MAX_BATCH = 8
DEFAULT_IMAGE_SIZE = 224  # H/W of an image input whose model states none (ImageNet-style classifiers)
IMAGE_INPUT_NAMES = ("pixel_values", "images", "image", "input_image")


@dataclass
class EngineTarget(JSONable):
    """Where an engine loads: the profile's SM and TensorRT/L4T/JetPack/CUDA versions (``tensorrt_target``)."""

    profile: str
    sm: str | None = None
    tensorrt: str | None = None
    l4t: str | None = None
    jetpack: str | None = None
    cuda: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "profile": self.profile,
            "sm": self.sm,
            "tensorrt": self.tensorrt,
            "l4t": self.l4t,
            "jetpack": self.jetpack,
            "cuda": self.cuda,
        }

    @classmethod
    def from_json(cls, value: JSONValue) -> EngineTarget:
        assert isinstance(value, dict)
        return cls(**{k: (None if v is None else str(v)) for k, v in value.items()})  # type: ignore[arg-type]


@dataclass
class DlaConfig(JSONable):
    """The engine's DLA placement (``dla``): core and whether layers the DLA lacks run on the GPU."""

    core: int = 0
    gpu_fallback: bool = True

    def to_json(self) -> JSONValue:
        return {"core": self.core, "gpu_fallback": self.gpu_fallback}

    @classmethod
    def from_json(cls, value: JSONValue) -> DlaConfig:
        assert isinstance(value, dict)
        return cls(core=int(str(value.get("core", 0))), gpu_fallback=bool(value.get("gpu_fallback", True)))


@dataclass
class TensorRTPlan(OnnxPlan):
    """The TensorRT format's decisions: the ONNX artifact's (:class:`OnnxPlan`) and the engine's."""

    target: EngineTarget | None = None
    precision_flags: list[str] = field(default_factory=list)  # as --explain shows them ("(none: FP32)")
    dla: DlaConfig | None = None
    optimization_profiles: list[dict[str, ShapeTriple]] | str = field(default_factory=list)  # str: static shapes
    precision_report: str | None = None
    cache_key: dict[str, JSONValue] = field(default_factory=dict)  # engine cache key (model hash added at build)
    engine_build: str = ""  # "this host" | "deferred to the device"

    FIELDS: ClassVar[dict[str, str]] = {
        **OnnxPlan.FIELDS,
        "tensorrt_target": "target",
        "tensorrt_precision_flags": "precision_flags",
        "dla": "dla",
        "tensorrt_optimization_profiles": "optimization_profiles",
        "precision_report": "precision_report",
        "engine_cache_key": "cache_key",
        "engine_build": "engine_build",
    }
    PARSE: ClassVar[dict[str, object]] = {
        **OnnxPlan.PARSE,
        "target": EngineTarget.from_json,
        "dla": DlaConfig.from_json,
    }


def tensorrt_section(section: PlanSection) -> TensorRTPlan:
    """``section`` as a :class:`TensorRTPlan` (typing the decisions of a plan made elsewhere)."""
    return section if isinstance(section, TensorRTPlan) else TensorRTPlan.from_decisions(section.decisions())


def parse_shapes(specs: Iterable[object]) -> dict[str, ShapeTriple]:
    """``--shapes NAME:MIN:OPT:MAX`` (trtexec's triple, dims joined by ``x``) -> {name: {min, opt, max}}.

    Each triple must have one rank, positive dims, and min <= opt <= max per dim; a name given twice is an
    error. Pure: the model's inputs are checked against it when planning."""
    out: dict[str, ShapeTriple] = {}
    for spec in specs:
        parts = str(spec).rsplit(":", 3)
        if len(parts) != 4 or not parts[0]:
            raise InputError(
                f"--shapes {spec!r}: expected NAME:MIN:OPT:MAX, e.g. pixel_values:1x3x224x224:4x3x224x224:8x3x224x224"
            )
        name, *triple = parts
        dims: list[list[int]] = []
        for which, text in zip(("min", "opt", "max"), triple):
            try:
                d = [int(x) for x in text.lower().split("x")]
            except ValueError:
                raise InputError(
                    f"--shapes {spec!r}: {which} {text!r} is not dims joined by 'x' (e.g. 1x3x224x224)"
                ) from None
            if not d or any(x <= 0 for x in d):
                raise InputError(f"--shapes {spec!r}: {which} dims must be positive integers")
            dims.append(d)
        if len({len(d) for d in dims}) != 1:
            raise InputError(f"--shapes {spec!r}: min, opt and max must have the same rank")
        if any(not (a <= b <= c) for a, b, c in zip(*dims)):
            raise InputError(f"--shapes {spec!r}: each dim needs min <= opt <= max")
        if name in out:
            raise InputError(f"--shapes: input {name!r} given twice")
        out[name] = {"min": dims[0], "opt": dims[1], "max": dims[2]}
    return out


def _image_hw(facts: ModelFacts) -> tuple[int | None, str]:
    """(H/W, where it came from) for image inputs: config.json image_size, preprocessor_config.json size."""
    config = dict(facts.config or {})
    where = "config.json"
    if facts.kind == "onnx" and not config:
        sibling = _graph_facts(facts)["sibling_config"]  # read by inspect (ModelFacts.graph)
        if sibling is not None:
            config, where = dict(sibling["config"]), str(sibling["file"])
    size = config.get("image_size")
    if size is None and isinstance(config.get("size"), dict):  # preprocessor_config.json
        size = config["size"].get("height") or config["size"].get("shortest_edge")
    elif size is None and isinstance(config.get("size"), int):
        size = config["size"]
    if isinstance(size, list) and size:
        size = size[0]
    return (int(size), where) if isinstance(size, int) and size > 0 else (None, "")


def _graph_facts(facts: ModelFacts) -> dict[str, Any]:
    """An ONNX source's graph facts: inspect's (``facts.graph``), else read now (facts made by hand, without
    inspect: the one case the planner reads a file)."""
    if facts.graph is not None:
        return facts.graph
    import onnx

    from edgesdk.formats.onnx.facts import onnx_graph_facts

    path = Path(str(facts.source))
    return onnx_graph_facts(onnx.load(str(path), load_external_data=False), path)


def _capability(facts: ModelFacts, profile: Profile, precision: str, use_dla: bool) -> CapabilityReport:
    """The capability report of an ONNX source from its graph facts (inspect's shape-inferred graph): tables
    only, no file read and no ONNX Runtime session (CUDA/CPU EP kernels are probed by the build's engine
    stage, whose report the bundle carries)."""
    from edgesdk.capability.checker import check_view
    from edgesdk.capability.graph import GraphView

    view = GraphView.from_facts(_graph_facts(facts)["capability"])
    return check_view(view, profile, precision, use_dla=use_dla, probe=False)


def _precision(profile: Profile, options: BuildOptions) -> str:
    if options.precision:
        return options.precision
    return str(next((p for p in profile.precision_order if p in ("fp16", "int8", "fp32")), "fp32"))


def _target(profile: Profile) -> dict[str, Any]:
    v = profile.software_version
    return {
        "profile": profile.name,
        "sm": profile.sm,
        "tensorrt": v("tensorrt"),
        "l4t": v("l4t"),
        "jetpack": v("jetpack"),
        "cuda": v("cuda"),
    }


def _dynamic_inputs(facts: ModelFacts, options: BuildOptions) -> dict[str, Dims]:
    """Input name -> dims (int static, str/None dynamic) as far as planning can know without exporting."""
    if facts.kind == "onnx":
        graph = _graph_facts(facts)
        channels: dict[str, int] = graph["conv_channels"]
        dims: dict[str, Dims] = {n: list(d or [None]) for n, d in graph["input_dims"].items()}
        for n, d in dims.items():  # image inputs: batch stays dynamic, C/H/W come from the model
            if len(d) == 4 and (n in IMAGE_INPUT_NAMES or channels.get(n)):
                if not (isinstance(d[1], int) and d[1] > 0):
                    d[1] = channels.get(n) or 3
                hw, _ = _image_hw(facts)
                for i in (2, 3):
                    if not (isinstance(d[i], int) and d[i] > 0):
                        d[i] = hw or DEFAULT_IMAGE_SIZE
        return dims
    if facts.kind == "hf":
        names = ["input_ids", "attention_mask"]
        if facts.config.get("type_vocab_size", 0) and facts.family in ("bert", "electra", "albert", "mpnet"):
            names.append("token_type_ids")
        if facts.task == "image-classification":
            size = _image_hw(facts)[0] or DEFAULT_IMAGE_SIZE
            return {"pixel_values": ["batch", int(facts.config.get("num_channels") or 3), size, size]}
        return {n: ["batch", "sequence"] for n in names}
    names = options.option("input_names") or []
    example = options.option("example_inputs")
    example = example if isinstance(example, tuple) else ((example,) if example is not None else ())
    names = names or [f"input_{i}" for i in range(len(example))]
    return {n: ["batch", *list(getattr(t, "shape", ()))[1:]] for n, t in zip(names, example)}


def _user_shapes(options: BuildOptions) -> dict[str, ShapeTriple]:
    shapes = options.option("shapes") or {}
    if isinstance(shapes, (list, tuple)):  # Python API: the CLI's strings
        return parse_shapes(shapes)
    return dict(shapes)


def _check_user_shapes(user: dict[str, ShapeTriple], inputs: dict[str, Dims]) -> None:
    for name, triple in user.items():
        if name not in inputs:
            raise InputError(
                f"--shapes names input {name!r}; the model's inputs are "
                f"{', '.join(inputs) or '(unknown before export)'}"
            )
        dims = inputs[name]
        if dims and dims != [None] and len(dims) != len(triple["min"]):
            raise InputError(
                f"--shapes {name}: rank {len(triple['min'])}, but the input has rank {len(dims)} "
                f"({'x'.join(str(d) for d in dims)})"
            )
        for i, d in enumerate(dims if dims != [None] else []):
            if isinstance(d, int) and d > 0 and {triple[k][i] for k in ("min", "opt", "max")} != {d}:
                raise InputError(f"--shapes {name}: dim {i} of the input is static {d}; min/opt/max must all be {d}")


def optimization_profiles(
    inputs: dict[str, Dims], facts: ModelFacts, options: BuildOptions
) -> list[dict[str, ShapeTriple]]:
    """One min/opt/max profile over the dynamic dims: batch 1/1/max_batch, sequence 1/seq_len/max_seq; inputs
    named in ``options.shapes`` (``--shapes``) take the user's triple instead."""
    max_batch = int(options.option("max_batch") or DEFAULT_MAX_BATCH)
    max_seq = int(
        options.option("max_seq_len") or facts.config.get("max_position_embeddings") or max(512, options.seq_len)
    )
    user = _user_shapes(options)
    _check_user_shapes(user, inputs)
    prof: dict[str, ShapeTriple] = {}
    for name, dims in inputs.items():
        if name in user:
            prof[name] = {k: list(v) for k, v in user[name].items()}
            continue
        if all(isinstance(d, int) and d > 0 for d in dims):
            continue
        triples: list[tuple[int, int, int]] = []
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0:
                triples.append((d, d, d))
            elif i == 0:  # batch
                triples.append((1, 1, max_batch))
            else:  # sequence-like: opt at the planned length
                triples.append((1, min(options.seq_len, max_seq), max_seq))
        prof[name] = {k: [t[j] for t in triples] for j, k in enumerate(("min", "opt", "max"))}
    return [prof] if prof else []


def _dla_decision(facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str) -> Decision | None:
    from edgesdk.capability import tables

    trt = profile.software_version("tensorrt") or ""
    if options.dla:
        if profile.dla_cores <= 0:
            raise InputError(
                f"--dla requested but profile {profile.name} has no DLA",
                hint="DLA exists on Jetson AGX Orin and Orin NX only",
            )
        ok, why = tables.dla_available(trt)
        if not ok:
            raise InputError(f"--dla requested but {why}")
        if precision not in ("fp16", "int8"):
            raise InputError(f"--dla requested with precision {precision}: the DLA runs FP16/INT8 only")
    if profile.dla_cores <= 0 or options.dla is False or not tables.dla_available(trt)[0]:
        return None
    if options.dla:
        return Decision(
            "dla",
            {"core": 0, "gpu_fallback": True},
            "requested with --dla; layers the DLA lacks run on the GPU (GPU fallback on)",
        )
    if facts.kind != "onnx":
        return Decision(
            "dla",
            None,
            "not chosen automatically: the model is not ONNX yet, and transformer exports "
            "have dynamic shapes the DLA cannot take; pass --dla to force it",
        )
    if precision not in ("fp16", "int8"):
        return Decision("dla", None, f"plan precision {precision}: the DLA runs FP16/INT8 only")
    report = _capability(facts, profile, precision, use_dla=True)
    compute = [n for n in report.nodes if n.placement != "folded"]
    on_dla = sum(1 for n in compute if n.placement == "dla")
    share = on_dla / len(compute) if compute else 0.0
    if report.dynamic_inputs:
        return Decision("dla", None, f"dynamic inputs {list(report.dynamic_inputs)}: the DLA needs static shapes")
    if share < DLA_MIN_NATIVE_SHARE:
        return Decision(
            "dla",
            None,
            f"only {on_dla}/{len(compute)} nodes are DLA-native ({share:.0%} < "
            f"{DLA_MIN_NATIVE_SHARE:.0%}); DLA<->GPU transitions would cost more than the DLA saves",
        )
    return Decision(
        "dla",
        {"core": 0, "gpu_fallback": True},
        f"{on_dla}/{len(compute)} nodes DLA-native with static shapes; DLA core 0 frees the GPU, the "
        f"rest runs on the GPU ({len(report.partitions)} partitions)",
    )


def plan_tensorrt(
    facts: ModelFacts,
    profile: Profile,
    options: BuildOptions,
    host: HostFacts | None = None,
    precision: str | None = None,
) -> list[Decision]:
    """TensorRT decisions: target, precision flags, DLA, optimization profiles, engine cache key, where built.

    ``precision`` is the plan's (edgesdk.plan decided it); None (a caller without a plan) derives it from
    ``--precision`` and the profile's order."""
    if not profile.is_gpu:
        raise InputError(
            f"--format tensorrt needs an NVIDIA GPU profile; {profile.name} is a {profile.kind} profile",
            hint="use --format onnx for CPU hosts",
        )
    target = _target(profile)
    if not target["tensorrt"]:
        raise InputError(f"profile {profile.name} names no TensorRT version (software.tensorrt)")
    precision = precision or _precision(profile, options)
    if precision == "fp8" and not profile.kernel("fp8").supported:
        raise InputError(f"precision fp8 is not available on {profile.name} ({profile.kernel('fp8').source})")
    out: list[Decision] = [
        Decision(
            "tensorrt_target",
            target,
            f"engines load only on the SM/TensorRT that built them ({profile.software_version('source')})",
        )
    ]
    flags = PRECISION_FLAGS.get(precision, [])
    out.append(
        Decision(
            "tensorrt_precision_flags",
            flags or ["(none: FP32)"],
            "INT8 keeps FP16 enabled so layers without INT8 kernels do not drop to FP32"
            if precision == "int8"
            else f"plan precision {precision}",
        )
    )
    dla = _dla_decision(facts, profile, options, precision)
    if dla is not None:
        out.append(dla)
    inputs = _dynamic_inputs(facts, options)
    profiles = optimization_profiles(inputs, facts, options)
    user = sorted(_user_shapes(options))
    images = [n for n, d in inputs.items() if len(d) == 4 and n not in user and profiles and n in profiles[0]]
    why = (
        "min/opt/max per dynamic input: opt at batch 1 and the planned sequence length "
        f"({options.seq_len}, --seq-len), max batch {int(options.option('max_batch') or DEFAULT_MAX_BATCH)} "
        "and the sequence bound (--max-seq-len) so the engine's workspace fits"
    )
    if images:
        why += f"; image inputs {images}: batch dynamic, C/H/W from the model"
    if user:
        why = f"{', '.join(user)} from --shapes" + ("" if set(user) >= set(profiles[0]) else f"; others: {why}")
    out.append(
        Decision(
            "tensorrt_optimization_profiles",
            profiles or "static shapes: none needed",
            why if profiles else "every input shape is static",
        )
    )
    if facts.kind == "onnx" and precision != "fp32":
        from edgesdk.capability import precision_report_from

        prec = precision_report_from(_capability(facts, profile, precision, use_dla=bool(dla and dla.value)))
        kept = sum(r["count"] for r in prec["kept_higher_precision"])
        out.append(
            Decision(
                "precision_report",
                f"{prec['float_nodes'] - kept}/{prec['float_nodes']} float ops in "
                f"{precision.upper()}, {kept} kept higher, {prec['precision_conversions']} reformats, "
                f"{prec['float_partition_crossings']} float partition crossings",
                " | ".join(prec["explanation"]),
            )
        )
    fields = {
        **{k: target[k] for k in ("sm", "tensorrt", "l4t", "jetpack")},
        "precision": precision,
        "flags": flags,
        "dla": dla.value if dla is not None else None,
        "profiles": profiles,
    }
    out.append(
        Decision(
            "engine_cache_key",
            fields,
            "an engine is reused only when SM, TensorRT, L4T/JetPack, "
            "precision, DLA and shapes all match (the model hash is added at build time)",
        )
    )
    from edgesdk.formats.tensorrt.engine import preflight
    from edgesdk.host import HostFacts

    problems = preflight(target, host if host is not None else HostFacts())
    where = "this host" if not problems else "deferred to the device"
    out.append(
        Decision(
            "engine_build",
            where,
            "this host matches the target"
            if not problems
            else "; ".join(problems) + ": the bundle carries the ONNX and the exact build configuration; "
            "`edgesdk engine build BUNDLE` or the first load on the device builds and caches it",
        )
    )
    return out
