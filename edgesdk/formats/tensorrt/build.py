# SPDX-License-Identifier: Apache-2.0
"""TensorRT format: plan (precision flags, DLA, optimization profiles, engine cache key) and build
(ONNX artifact + engine when this host is the target, else a deferred engine build configuration).

Runtime side: :mod:`edgesdk.runtime.backends.tensorrt`. Engine config/cache/build:
:mod:`edgesdk.formats.tensorrt_engine`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from edgesdk.errors import InputError
from edgesdk.formats import tensorrt_engine as E
from edgesdk.plan import Decision

RUNTIME_CHAIN = ["tensorrt-engine", "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
PRECISION_FLAGS = {"fp32": [], "fp16": ["fp16"], "bf16": ["bf16"], "int8": ["int8", "fp16"], "fp8": ["fp8", "fp16"]}
DLA_MIN_NATIVE_SHARE = 0.8  # below this, DLA<->GPU transitions eat the DLA's power/throughput advantage
DEFAULT_MAX_BATCH = 8
WORKSPACE_FRACTION = 0.25  # of the profile's memory budget, capped below


def _precision(profile, options) -> str:
    if options.precision:
        return options.precision
    return next((p for p in profile.policy["precision"] if p in ("fp16", "int8", "fp32")), "fp32")


def _target(profile) -> dict:
    sw = profile.software
    return {"profile": profile.name, "sm": profile.sm, "tensorrt": sw.get("tensorrt"), "l4t": sw.get("l4t"),
            "jetpack": sw.get("jetpack"), "cuda": sw.get("cuda")}


def _dynamic_inputs(facts, options) -> dict[str, list]:
    """Input name -> dims (int static, str/None dynamic) as far as planning can know without exporting."""
    if facts.kind == "onnx":
        from edgesdk.capability.graph import load_graph

        view = load_graph(facts.source)
        return {n: view.shape.get(n) or [None] for n in view.inputs}
    if facts.kind == "hf":
        names = ["input_ids", "attention_mask"]
        if facts.config.get("type_vocab_size", 0) and facts.family in ("bert", "electra", "albert", "mpnet"):
            names.append("token_type_ids")
        if facts.task == "image-classification":
            size = int(facts.config.get("image_size") or 224)
            return {"pixel_values": ["batch", int(facts.config.get("num_channels") or 3), size, size]}
        return {n: ["batch", "sequence"] for n in names}
    names = options.extra.get("input_names") or []
    example = options.extra.get("example_inputs")
    example = example if isinstance(example, tuple) else ((example,) if example is not None else ())
    names = names or [f"input_{i}" for i in range(len(example))]
    return {n: ["batch", *list(getattr(t, "shape", ()))[1:]] for n, t in zip(names, example)}


def optimization_profiles(inputs: dict[str, list], facts, options) -> list[dict]:
    """One min/opt/max profile over the dynamic dims: batch 1/1/max_batch, sequence 1/seq_len/max_seq."""
    max_batch = int(options.extra.get("max_batch", DEFAULT_MAX_BATCH))
    max_seq = int(options.extra.get("max_seq_len") or facts.config.get("max_position_embeddings") or
                  max(512, options.seq_len))
    prof: dict[str, dict] = {}
    for name, dims in inputs.items():
        if all(isinstance(d, int) and d > 0 for d in dims):
            continue
        triples = []
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0:
                triples.append((d, d, d))
            elif i == 0:  # batch
                triples.append((1, 1, max_batch))
            else:  # sequence-like: opt at the planned length
                triples.append((1, min(options.seq_len, max_seq), max_seq))
        prof[name] = {k: [t[j] for t in triples] for j, k in enumerate(("min", "opt", "max"))}
    return [prof] if prof else []


def _dla_decision(facts, profile, options, precision: str) -> Decision | None:
    from edgesdk.capability import tables

    trt = profile.software.get("tensorrt") or ""
    if options.dla:
        if profile.dla_cores <= 0:
            raise InputError(f"--dla requested but profile {profile.name} has no DLA",
                             hint="DLA exists on Jetson AGX Orin and Orin NX only")
        ok, why = tables.dla_available(trt)
        if not ok:
            raise InputError(f"--dla requested but {why}")
        if precision not in ("fp16", "int8"):
            raise InputError(f"--dla requested with precision {precision}: the DLA runs FP16/INT8 only")
    if profile.dla_cores <= 0 or options.dla is False or not tables.dla_available(trt)[0]:
        return None
    if options.dla:
        return Decision("dla", {"core": 0, "gpu_fallback": True}, "requested with --dla; layers the DLA lacks run "
                        "on the GPU (GPU fallback on)")
    if facts.kind != "onnx":
        return Decision("dla", None, "not chosen automatically: the model is not ONNX yet, and transformer exports "
                        "have dynamic shapes the DLA cannot take; pass --dla to force it")
    if precision not in ("fp16", "int8"):
        return Decision("dla", None, f"plan precision {precision}: the DLA runs FP16/INT8 only")
    from edgesdk.capability import check_capability

    report = check_capability(facts.source, profile, precision, use_dla=True)
    compute = [n for n in report.nodes if n.placement != "folded"]
    on_dla = sum(1 for n in compute if n.placement == "dla")
    share = on_dla / len(compute) if compute else 0.0
    if report.dynamic_inputs:
        return Decision("dla", None, f"dynamic inputs {list(report.dynamic_inputs)}: the DLA needs static shapes")
    if share < DLA_MIN_NATIVE_SHARE:
        return Decision("dla", None, f"only {on_dla}/{len(compute)} nodes are DLA-native ({share:.0%} < "
                        f"{DLA_MIN_NATIVE_SHARE:.0%}); DLA<->GPU transitions would cost more than the DLA saves")
    return Decision("dla", {"core": 0, "gpu_fallback": True},
                    f"{on_dla}/{len(compute)} nodes DLA-native with static shapes; DLA core 0 frees the GPU, the "
                    f"rest runs on the GPU ({len(report.partitions)} partitions)")


def plan_tensorrt(facts, profile, options) -> list[Decision]:
    """TensorRT decisions: target, precision flags, DLA, optimization profiles, engine cache key, where built."""
    if not profile.is_gpu:
        raise InputError(f"--format tensorrt needs an NVIDIA GPU profile; {profile.name} is a {profile.kind} "
                         "profile", hint="use --format onnx for CPU hosts")
    target = _target(profile)
    if not target["tensorrt"]:
        raise InputError(f"profile {profile.name} names no TensorRT version (software.tensorrt)")
    precision = _precision(profile, options)
    if precision == "fp8" and not profile.kernels.get("fp8", {}).get("supported"):
        raise InputError(f"precision fp8 is not available on {profile.name} "
                         f"({profile.kernels.get('fp8', {}).get('source')})")
    out = [Decision("tensorrt_target", target, f"engines load only on the SM/TensorRT that built them "
                    f"({profile.software.get('source')})")]
    flags = PRECISION_FLAGS.get(precision, [])
    out.append(Decision("tensorrt_precision_flags", flags or ["(none: FP32)"],
                        "INT8 keeps FP16 enabled so layers without INT8 kernels do not drop to FP32"
                        if precision == "int8" else f"plan precision {precision}"))
    dla = _dla_decision(facts, profile, options, precision)
    if dla is not None:
        out.append(dla)
    inputs = _dynamic_inputs(facts, options)
    profiles = optimization_profiles(inputs, facts, options)
    out.append(Decision("tensorrt_optimization_profiles", profiles or "static shapes: none needed",
                        "min/opt/max per dynamic input: opt at batch 1 and the planned sequence length "
                        f"({options.seq_len}), max bounded so the engine's workspace fits" if profiles
                        else "every input shape is static"))
    if facts.kind == "onnx" and precision != "fp32":
        from edgesdk.capability import precision_report

        prec = precision_report(facts.source, profile, precision, use_dla=bool(dla and dla.value))
        kept = sum(r["count"] for r in prec["kept_higher_precision"])
        out.append(Decision("precision_report", f"{prec['float_nodes'] - kept}/{prec['float_nodes']} float ops in "
                            f"{precision.upper()}, {kept} kept higher, {prec['precision_conversions']} reformats, "
                            f"{prec['float_partition_crossings']} float partition crossings",
                            " | ".join(prec["explanation"])))
    fields = {**{k: target[k] for k in ("sm", "tensorrt", "l4t", "jetpack")}, "precision": precision,
              "flags": flags, "dla": dla.value if dla is not None else None, "profiles": profiles}
    out.append(Decision("engine_cache_key", fields, "an engine is reused only when SM, TensorRT, L4T/JetPack, "
                        "precision, DLA and shapes all match (the model hash is added at build time)"))
    from edgesdk.runtime.fallback import host_env, preflight

    problems = preflight(target, host_env())
    where = "this host" if not problems else "deferred to the device"
    out.append(Decision("engine_build", where, "this host matches the target" if not problems else
                        "; ".join(problems) + ": the bundle carries the ONNX and the exact build configuration; "
                        "`edgesdk engine build BUNDLE` or the first load on the device builds and caches it"))
    return out


def _workspace_mb(profile) -> int:
    budget = profile.memory_budget_gb() or 4.0
    return int(max(256, min(4096, budget * 1024 * WORKSPACE_FRACTION)))


def engine_config(ctx, onnx_rel: str, onnx_sha256: str) -> dict:
    plan = ctx.plan
    fields = dict(plan.decision("engine_cache_key") or {})
    fields["precision"] = ctx.precision  # after any parity fallback
    fields["flags"] = PRECISION_FLAGS.get(ctx.precision, [])
    fields["model_sha256"] = onnx_sha256
    profiles = plan.decision("tensorrt_optimization_profiles")
    config = {
        "schema": E.CONFIG_SCHEMA, "onnx": onnx_rel, "precision": ctx.precision,
        "precision_flags": fields["flags"], "dla": plan.decision("dla"),
        "optimization_profiles": profiles if isinstance(profiles, list) else [],
        "workspace_mb": _workspace_mb(ctx.profile), "builder_optimization_level": 3,
        "timing_cache": E.TIMING_CACHE_FILE, "target": plan.decision("tensorrt_target"),
        "cache_key_fields": fields, "cache_key": E.cache_key(fields),
    }
    config["trtexec"] = " ".join(E.trtexec_command(config, Path(onnx_rel), Path(E.ENGINE_FILE),
                                                   Path(E.TIMING_CACHE_FILE)))
    return config


def build_tensorrt(ctx) -> None:
    """ONNX artifact first (the lead's ONNX stages), then the engine here or a deferred build config."""
    from edgesdk.capability import check_capability, precision_report_from
    from edgesdk.formats.onnx import build_onnx
    from edgesdk.runtime.fallback import host_env, preflight

    build_onnx(ctx)
    if ctx.manifest.get("format") == "torch":  # ONNX export failed; the torch.export fallback took over
        return
    onnx_path = ctx.staging / "model.onnx"
    with ctx.stage("engine"):
        use_dla = bool(ctx.plan.decision("dla"))
        report = check_capability(onnx_path, ctx.profile, ctx.precision, use_dla=use_dla)
        summary = report.to_dict()["summary"]
        prec = precision_report_from(report) if ctx.precision != "fp32" else None
        sha = next(a["sha256"] for a in ctx.artifacts if a["path"] == "model.onnx")
        config = engine_config(ctx, "model.onnx", sha)
        (ctx.staging / "tensorrt").mkdir(exist_ok=True)
        (ctx.staging / "tensorrt" / "engine_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        ctx.add_artifact("tensorrt/engine_config.json", "engine-config")
        env = host_env()
        problems = preflight(config["target"], env)
        info: dict = {"config": "tensorrt/engine_config.json", "cache_key": config["cache_key"],
                      "capability": summary, "precision_report": prec, "host": {k: env[k] for k in
                                                                                ("tensorrt", "sm", "l4t", "trtexec")}}
        if summary["unsupported_everywhere"]:
            ctx.progress(f"no backend runs {summary['unsupported_everywhere']} on {ctx.profile.name}")
        if not problems:
            work = ctx.staging / "tensorrt" / "_work"
            data, binfo = E.build_engine(config, onnx_path, work, env)
            (ctx.staging / "tensorrt" / E.ENGINE_FILE).write_bytes(data)
            ctx.add_artifact(f"tensorrt/{E.ENGINE_FILE}", "engine")
            if (work / E.TIMING_CACHE_FILE).is_file():
                shutil.move(str(work / E.TIMING_CACHE_FILE), str(ctx.staging / "tensorrt" / E.TIMING_CACHE_FILE))
                ctx.add_artifact(f"tensorrt/{E.TIMING_CACHE_FILE}", "timing-cache")
            shutil.rmtree(work, ignore_errors=True)
            info["engine"] = {"built": True, "deferred": False, **binfo}
        else:
            info["engine"] = {"built": False, "deferred": True, "reason": "; ".join(problems),
                              "how": "edgesdk engine build BUNDLE (on the device), or the first edgesdk.load there"}
            ctx.progress(f"TensorRT engine deferred: {'; '.join(problems)}")
        ctx.manifest.setdefault("extras", {})["tensorrt"] = info
        ctx.manifest["backend_chain"] = list(RUNTIME_CHAIN)


# --------------------------------------------------------------------------------------------- on the device

def _bundle_config(path):
    from edgesdk.bundle import open_bundle
    from edgesdk.errors import BundleIntegrityError

    bundle = open_bundle(path)
    if bundle.format != "tensorrt" or not bundle.has_artifact("engine-config"):
        raise BundleIntegrityError(f"{bundle.path} is a {bundle.format or 'unknown'} bundle without a TensorRT "
                                   "engine configuration (build it with --format tensorrt)")
    return bundle, E.read_config(bundle.artifact_path("engine-config"))


def describe_bundle_engine(path) -> dict:
    """The engine configuration, this host's pre-flight against it, and the cache state."""
    from edgesdk.runtime.fallback import host_env, preflight

    bundle, config = _bundle_config(path)
    env = host_env()
    cached, why = E.cached_engine(config)
    return {"bundle": str(bundle.path), "config": config, "host": env,
            "preflight_problems": preflight(config["target"], env),
            "prebuilt_engine": bundle.has_artifact("engine"),
            "cache": {"dir": str(E.engine_cache_root() / config["cache_key"]), "engine": str(cached) if cached
                      else None, "state": why}}


def build_bundle_engine(path, *, force: bool = False) -> dict:
    """``edgesdk engine build``: refuse (one line) where the host is not the target; else build and cache."""
    from edgesdk.errors import ExternalToolError
    from edgesdk.runtime.fallback import host_env, preflight

    bundle, config = _bundle_config(path)
    env = host_env()
    problems = preflight(config["target"], env)
    if problems:
        raise ExternalToolError("cannot build this bundle's engine here: " + "; ".join(problems),
                                hint=f"run on a {config['target'].get('profile')} device, or see "
                                     f"`edgesdk engine show {bundle.path}` for the trtexec command")
    if force:
        E.evict(config)
    cached, _ = E.cached_engine(config)
    status = "cached" if cached else "built"
    engine = cached or E.engine_for(config, bundle.path / config["onnx"], env)
    return {"status": status, "engine": str(engine), "cache_key": config["cache_key"]}
