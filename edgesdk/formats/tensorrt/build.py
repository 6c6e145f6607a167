# SPDX-License-Identifier: Apache-2.0
"""TensorRT build: the ONNX artifact (the ONNX stages), then the engine when this host is the target,
else a deferred engine build configuration; and the device-side ``edgesdk engine`` commands.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.formats.tensorrt import engine as E
from edgesdk.formats.tensorrt.plan import PRECISION_FLAGS, RUNTIME_CHAIN, tensorrt_section

if TYPE_CHECKING:
    from edgesdk.bundle import Bundle
    from edgesdk.formats import BuildContext
    from edgesdk.profiles import Profile

WORKSPACE_FRACTION = 0.25  # of the profile's memory budget, capped below


def _workspace_mb(profile: Profile) -> int:
    budget = profile.memory_budget_gb() or 4.0
    return int(max(256, min(4096, budget * 1024 * WORKSPACE_FRACTION)))


def engine_config(ctx: BuildContext, onnx_rel: str, onnx_sha256: str) -> E.EngineConfig:
    plan = tensorrt_section(ctx.plan.section)
    fields: dict[str, Any] = dict(plan.cache_key)
    fields["precision"] = ctx.precision  # after any parity fallback
    fields["flags"] = PRECISION_FLAGS.get(ctx.precision, [])
    fields["model_sha256"] = onnx_sha256
    profiles = plan.optimization_profiles
    config = {
        "schema": E.CONFIG_SCHEMA,
        "onnx": onnx_rel,
        "precision": ctx.precision,
        "precision_flags": fields["flags"],
        "dla": plan.dla.to_json() if plan.dla is not None else None,
        "optimization_profiles": profiles if isinstance(profiles, list) else [],
        "workspace_mb": _workspace_mb(ctx.profile),
        "builder_optimization_level": 3,
        "timing_cache": E.TIMING_CACHE_FILE,
        "target": plan.target.to_json() if plan.target is not None else None,
        "cache_key_fields": fields,
        "cache_key": E.cache_key(fields),
    }
    config["trtexec"] = " ".join(
        E.trtexec_command(config, Path(onnx_rel), Path(E.ENGINE_FILE), Path(E.TIMING_CACHE_FILE))
    )
    return config


def build_tensorrt(ctx: BuildContext) -> None:
    """ONNX artifact first (the lead's ONNX stages), then the engine here or a deferred build config."""
    from edgesdk.capability import check_capability, precision_report_from
    from edgesdk.formats.onnx.build import build_onnx
    from edgesdk.formats.tensorrt.engine import preflight
    from edgesdk.host import host_env

    build_onnx(ctx)
    if ctx.manifest.format == "torch":  # ONNX export failed; the torch.export fallback took over
        return
    onnx_path = ctx.staging / "model.onnx"
    with ctx.stage("engine"):
        use_dla = tensorrt_section(ctx.plan.section).dla is not None
        report = check_capability(onnx_path, ctx.profile, ctx.precision, use_dla=use_dla)
        summary = report.to_dict()["summary"]
        prec = precision_report_from(report) if ctx.precision != "fp32" else None
        sha = next(a.sha256 for a in ctx.artifacts if a.path == "model.onnx")
        config = engine_config(ctx, "model.onnx", sha)
        (ctx.staging / "tensorrt").mkdir(exist_ok=True)
        (ctx.staging / "tensorrt" / "engine_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        ctx.add_artifact("tensorrt/engine_config.json", "engine-config")
        env = host_env()
        problems = preflight(config["target"], env)
        info: dict[str, Any] = {
            "config": "tensorrt/engine_config.json",
            "cache_key": config["cache_key"],
            "capability": summary,
            "precision_report": prec,
            "host": {k: env[k] for k in ("tensorrt", "sm", "l4t", "trtexec")},
        }
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
            info["engine"] = {
                "built": False,
                "deferred": True,
                "reason": "; ".join(problems),
                "how": "edgesdk engine build BUNDLE (on the device), or the first edgesdk.load there",
            }
            ctx.progress(f"TensorRT engine deferred: {'; '.join(problems)}")
        ctx.manifest.extras["tensorrt"] = info
        ctx.manifest.runtime.backend_chain = list(RUNTIME_CHAIN)


# --------------------------------------------------------------------------------------------- on the device


def _bundle_config(path: str | os.PathLike[str]) -> tuple[Bundle, E.EngineConfig]:
    from edgesdk.bundle import open_bundle
    from edgesdk.errors import BundleIntegrityError, InputError

    bundle = open_bundle(path)
    if bundle.format != "tensorrt":  # a usage mistake (exit 3), not a damaged bundle
        raise InputError(
            f"{bundle.path} is a {bundle.format or 'unknown'}-format bundle; `edgesdk engine` works on "
            "TensorRT bundles",
            hint="build one with --format tensorrt",
        )
    if not bundle.has_artifact("engine-config"):
        raise BundleIntegrityError(f"{bundle.path}: TensorRT bundle without tensorrt/engine_config.json")
    return bundle, E.read_config(bundle.artifact_path("engine-config"))


def describe_bundle_engine(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The engine configuration, this host's pre-flight against it, and the cache state."""
    from edgesdk.formats.tensorrt.engine import preflight
    from edgesdk.host import host_env

    bundle, config = _bundle_config(path)
    env = host_env()
    cached, why = E.cached_engine(config)
    return {
        "bundle": str(bundle.path),
        "config": config,
        "host": env,
        "preflight_problems": preflight(config["target"], env),
        "prebuilt_engine": bundle.has_artifact("engine"),
        "cache": {
            "dir": str(E.engine_cache_root() / config["cache_key"]),
            "engine": str(cached) if cached else None,
            "state": why,
        },
    }


def build_bundle_engine(path: str | os.PathLike[str], *, force: bool = False) -> dict[str, Any]:
    """``edgesdk engine build``: refuse (one line) where the host is not the target; else build and cache."""
    from edgesdk.errors import ExternalToolError
    from edgesdk.formats.tensorrt.engine import preflight
    from edgesdk.host import host_env

    bundle, config = _bundle_config(path)
    env = host_env()
    problems = preflight(config["target"], env)
    if problems:
        raise ExternalToolError(
            "cannot build this bundle's engine here: " + "; ".join(problems),
            hint=f"run on a {config['target'].get('profile')} device, or see "
            f"`edgesdk engine show {bundle.path}` for the trtexec command",
        )
    if force:
        E.evict(config)
    cached, _ = E.cached_engine(config)
    status = "cached" if cached else "built"
    engine = cached or E.engine_for(config, bundle.path / config["onnx"], env)
    return {"status": status, "engine": str(engine), "cache_key": config["cache_key"]}
