# SPDX-License-Identifier: Apache-2.0
"""TensorRT engine: the build configuration (JSON in the bundle), its cache key, the engine cache on the
device, the pre-flight check of an engine's target against a host, and the build itself (TensorRT Python API,
else ``trtexec``).

An engine only loads on the SM and TensorRT version that built it, so a bundle built off-device carries
``tensorrt/engine_config.json`` instead of an engine; ``edgesdk engine build BUNDLE`` or the runtime's
first load on the device turns it into an engine and caches it under the config's cache key.

NOT exercised against a real TensorRT in this repository's CI: TensorRT cannot be installed on any of
its machines (docs/tensorrt.md lists exactly which paths ran).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import BundleIntegrityError, ExternalToolError
from edgesdk.types import JSONObject

if TYPE_CHECKING:
    from edgesdk.host import HostFacts

# The engine configuration (tensorrt/engine_config.json) is JSON: a JSONObject checked by validate_config().
EngineConfig = JSONObject

CONFIG_SCHEMA = 1
ENGINE_FILE = "model.engine"
META_FILE = "engine.json"
TIMING_CACHE_FILE = "timing.cache"
ALLOWED_FLAGS = ("fp16", "bf16", "int8", "fp8")


def cache_key(fields: Mapping[str, Any]) -> str:
    """Stable key over what makes an engine valid: SM, TensorRT, L4T/JetPack, precision, shapes, DLA, model."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _major_minor(text: str | None) -> tuple[int, ...]:
    from edgesdk.capability.tables import version_tuple

    return version_tuple(text)[:2]


def preflight(target: Mapping[str, Any], here: Mapping[str, Any] | HostFacts) -> list[str]:
    """Why an engine built for ``target`` (the config's ``target``: SM, TensorRT, L4T) would not load ``here``
    (:meth:`edgesdk.host.HostFacts.tensorrt_env`, or the facts themselves) -- empty when it would.

    TensorRT engines are specific to the GPU's SM and the TensorRT version that built them (and on
    Jetson the L4T/JetPack release that ships that TensorRT); checking before deserialising turns an
    opaque deserialisation failure into one line and a clean fallback. The planner asks it of the host
    it plans for, the runtime of the device it loads on.
    """
    from edgesdk.host import HostFacts

    env = here.tensorrt_env() if isinstance(here, HostFacts) else here
    problems = []
    if not env.get("sm"):
        problems.append("no NVIDIA GPU here")
    elif target.get("sm") and target["sm"] != env["sm"]:
        problems.append(f"engine targets sm_{target['sm']}, this GPU is sm_{env['sm']}")
    if not env.get("tensorrt"):
        problems.append("TensorRT is not installed here")
    elif target.get("tensorrt") and _major_minor(target["tensorrt"]) != _major_minor(env["tensorrt"]):
        problems.append(f"engine targets TensorRT {target['tensorrt']}, this host has {env['tensorrt']}")
    if target.get("l4t") and env.get("l4t") and _major_minor(target["l4t"]) != _major_minor(env["l4t"]):
        problems.append(f"engine targets L4T {target['l4t']}, this Jetson runs L4T {env['l4t']}")
    return problems


def engine_cache_root() -> Path:
    env = os.environ.get("EDGESDK_ENGINE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgesdk" / "engines"


def _shape_arg(profiles: list[dict[str, dict[str, list[int]]]], which: str) -> str:
    parts: list[str] = []
    for prof in profiles[:1]:  # trtexec takes one optimization profile per flag set
        for name, shapes in prof.items():
            parts.append(f"{name}:{'x'.join(str(d) for d in shapes[which])}")
    return ",".join(parts)


def trtexec_command(config: EngineConfig, onnx_path: Path, engine_path: Path, timing_cache: Path) -> list[str]:
    """The ``trtexec`` command line equivalent to ``config`` (also written into the bundle for users)."""
    cmd = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={engine_path}",
        f"--timingCacheFile={timing_cache}",
        f"--memPoolSize=workspace:{int(config['workspace_mb'])}M",
        f"--builderOptimizationLevel={int(config['builder_optimization_level'])}",
    ]
    cmd += [f"--{flag}" for flag in config["precision_flags"]]
    dla = config.get("dla")
    if dla:
        cmd += [f"--useDLACore={int(dla['core'])}"] + (["--allowGPUFallback"] if dla.get("gpu_fallback") else [])
    if config.get("optimization_profiles"):
        profs = config["optimization_profiles"]
        cmd += [
            f"--minShapes={_shape_arg(profs, 'min')}",
            f"--optShapes={_shape_arg(profs, 'opt')}",
            f"--maxShapes={_shape_arg(profs, 'max')}",
        ]
    return cmd


def validate_config(config: object, where: str) -> EngineConfig:
    if not isinstance(config, dict) or config.get("schema") != CONFIG_SCHEMA:
        raise BundleIntegrityError(f"{where}: not a TensorRT engine configuration (schema {CONFIG_SCHEMA})")
    for key in (
        "onnx",
        "precision_flags",
        "target",
        "cache_key_fields",
        "cache_key",
        "workspace_mb",
        "builder_optimization_level",
        "optimization_profiles",
    ):
        if key not in config:
            raise BundleIntegrityError(f"{where}: engine configuration lacks {key!r}")
    if cache_key(config["cache_key_fields"]) != config["cache_key"]:
        raise BundleIntegrityError(f"{where}: cache_key does not match cache_key_fields (edited by hand?)")
    # The config drives a builder (and possibly trtexec): accept only values we could have written.
    onnx_rel = Path(str(config["onnx"]))
    if onnx_rel.is_absolute() or ".." in onnx_rel.parts:
        raise BundleIntegrityError(f"{where}: onnx path {config['onnx']!r} escapes the bundle")
    bad = [f for f in config["precision_flags"] if f not in ALLOWED_FLAGS]
    if bad:
        raise BundleIntegrityError(f"{where}: unknown precision flags {bad} (allowed: {', '.join(ALLOWED_FLAGS)})")
    dla = config.get("dla")
    if dla is not None and not (isinstance(dla, dict) and isinstance(dla.get("core"), int) and dla["core"] >= 0):
        raise BundleIntegrityError(f"{where}: dla must be null or {{core: int >= 0, gpu_fallback: bool}}")
    for prof in config["optimization_profiles"]:
        for name, shapes in prof.items():
            if not all(
                isinstance(shapes.get(k), list) and all(isinstance(d, int) and d > 0 for d in shapes[k])
                for k in ("min", "opt", "max")
            ):
                raise BundleIntegrityError(f"{where}: optimization profile for {name!r} needs positive int dims")
    if not isinstance(config["workspace_mb"], int) or not isinstance(config["builder_optimization_level"], int):
        raise BundleIntegrityError(f"{where}: workspace_mb and builder_optimization_level must be integers")
    return config


def read_config(path: Path) -> EngineConfig:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleIntegrityError(f"{path}: unreadable engine configuration ({exc})") from exc
    return validate_config(data, str(path))


def cached_engine(config: EngineConfig, root: Path | None = None) -> tuple[Path | None, str]:
    """The cached engine for ``config`` if present and intact, else (None, why)."""
    d = (root or engine_cache_root()) / config["cache_key"]
    engine, meta = d / ENGINE_FILE, d / META_FILE
    if not engine.is_file():
        return None, f"no cached engine under {d}"
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None, f"corrupt engine cache at {d}: {META_FILE} unreadable"
    digest = hashlib.sha256(engine.read_bytes()).hexdigest()
    if info.get("sha256") != digest or info.get("cache_key") != config["cache_key"]:
        return None, f"corrupt engine cache at {d}: engine sha256 does not match {META_FILE}"
    return engine, "cached"


def store_engine(
    config: EngineConfig, engine_bytes: bytes, build_info: Mapping[str, Any], root: Path | None = None
) -> Path:
    d: Path = (root or engine_cache_root()) / config["cache_key"]
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (ENGINE_FILE + ".tmp")
    tmp.write_bytes(engine_bytes)
    os.replace(tmp, d / ENGINE_FILE)
    meta = {
        "cache_key": config["cache_key"],
        "fields": config["cache_key_fields"],
        "sha256": hashlib.sha256(engine_bytes).hexdigest(),
        "bytes": len(engine_bytes),
        **build_info,
    }
    (d / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return d / ENGINE_FILE


def evict(config: EngineConfig, root: Path | None = None) -> None:
    d = (root or engine_cache_root()) / config["cache_key"]
    for name in (ENGINE_FILE, META_FILE):
        (d / name).unlink(missing_ok=True)


def _build_with_python_api(config: EngineConfig, onnx_path: Path, timing_cache: Path) -> bytes:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExternalToolError(f"TensorRT {trt.__version__} cannot parse {onnx_path.name}: {errors[:300]}")
    bc = builder.create_builder_config()
    bc.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config["workspace_mb"]) << 20)
    bc.builder_optimization_level = int(config["builder_optimization_level"])
    for flag in config["precision_flags"]:
        bc.set_flag(getattr(trt.BuilderFlag, flag.upper()))
    dla = config.get("dla")
    if dla:
        bc.default_device_type = trt.DeviceType.DLA
        bc.DLA_core = int(dla["core"])
        if dla.get("gpu_fallback"):
            bc.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    for prof in config["optimization_profiles"]:
        p = builder.create_optimization_profile()
        for name, shapes in prof.items():
            p.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
        bc.add_optimization_profile(p)
    cache = bc.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    bc.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, bc)
    if serialized is None:
        raise ExternalToolError(
            f"TensorRT {trt.__version__} failed to build an engine for {onnx_path.name} (see the TensorRT log above)"
        )
    timing_cache.write_bytes(bytes(bc.get_timing_cache().serialize()))
    return bytes(serialized)


def build_engine(
    config: EngineConfig, onnx_path: Path, work_dir: Path, env: Mapping[str, Any]
) -> tuple[bytes, dict[str, Any]]:
    """Build the engine on this host (TensorRT Python API, else trtexec). Returns (engine bytes, info)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    timing_cache = work_dir / TIMING_CACHE_FILE
    t0 = time.perf_counter()
    if env.get("tensorrt"):
        data = _build_with_python_api(config, onnx_path, timing_cache)
        tool = f"tensorrt {env['tensorrt']} Python API"
    elif env.get("trtexec"):
        engine_path = work_dir / ENGINE_FILE
        cmd = trtexec_command(config, onnx_path, engine_path, timing_cache)
        cmd[0] = env["trtexec"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not engine_path.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
            raise ExternalToolError(f"trtexec failed (exit {proc.returncode}): {tail[0][:200]}")
        data = engine_path.read_bytes()
        tool = env["trtexec"]
    else:
        raise ExternalToolError(
            "cannot build a TensorRT engine here: neither the TensorRT Python API nor trtexec is available",
            hint="run `edgesdk engine build BUNDLE` on the target device",
        )
    return data, {
        "built_with": tool,
        "build_s": round(time.perf_counter() - t0, 2),
        "host_sm": env.get("sm"),
        "host_tensorrt": env.get("tensorrt"),
        "host_l4t": env.get("l4t"),
    }


def engine_for(
    config: EngineConfig,
    onnx_path: Path,
    env: Mapping[str, Any],
    *,
    record: Callable[[str], object] | None = None,
    root: Path | None = None,
) -> Path:
    """Cached engine for ``config``, building (and caching) it when absent or corrupt. ``record(msg)`` hears
    about cache misses/corruption so the caller can report them."""
    path, why = cached_engine(config, root)
    if path is not None:
        return path
    if "corrupt" in why:
        evict(config, root)
    if record:
        record(why)
    work = (root or engine_cache_root()) / config["cache_key"] / "_work"
    data, info = build_engine(config, onnx_path, work, env)
    return store_engine(config, data, info, root)
