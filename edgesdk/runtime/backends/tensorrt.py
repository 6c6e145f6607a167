# SPDX-License-Identifier: Apache-2.0
"""Loader for ``format: tensorrt`` bundles: TensorRT engine -> ORT TensorRT EP -> CUDA EP -> CPU EP.

1. Pre-flight (before any deserialisation): this host's SM, TensorRT version and L4T against the
   engine's target. A mismatch is one line in the fallback record, never a crash.
2. Engine: the bundle's prebuilt engine, else the engine cache, else a deferred build on this device
   (then cached). A corrupt cache entry is evicted and rebuilt, and recorded.
3. Anything failing above -> ONNX Runtime on the bundle's ONNX with the EP chain, where the ORT backend
   really initialises each EP and records every step down. Per-node EP placement comes from ONNX
   Runtime's profiler on the first run.

The TensorRT engine path has NOT run against a real TensorRT in this repository (none installable here);
the fallback path is what runs on CPU hosts and is tested for real.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, BundleIntegrityError, ExternalToolError
from edgesdk.formats.tensorrt import engine as E
from edgesdk.formats.tensorrt.engine import preflight
from edgesdk.runtime.backend import LoadContext, TensorSpec
from edgesdk.runtime.options import OnnxLoadOptions

if TYPE_CHECKING:
    from edgesdk.bundle import Bundle
    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

ENGINE_STEP = "tensorrt-engine"


class TensorRTEngineBackend:
    """Runs a deserialised engine with torch CUDA tensors as I/O buffers (TensorRT 10 tensor API)."""

    name = "tensorrt"
    provider = "tensorrt"

    def __init__(self, engine_path: Path, env: Mapping[str, Any], source: str, dla_core: int | None = None):
        import tensorrt as trt
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailableError("TensorRT engine needs CUDA buffers: torch has no CUDA device here")
        self._trt, self._torch = trt, torch
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        if dla_core is not None:
            runtime.DLA_core = int(dla_core)  # a DLA engine deserialises onto the core it was planned for
        self.engine = runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise BackendUnavailableError(f"TensorRT could not deserialise {engine_path}")
        self.context = self.engine.create_execution_context()
        self.device = f"cuda:0 (sm_{env.get('sm')})"
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        specs = [
            TensorSpec(
                n, np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))).name, tuple(self.engine.get_tensor_shape(n))
            )
            for n in self.names
        ]  # -1: dynamic -> None
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in self.names}
        self.inputs = tuple(s for s in specs if is_input[s.name])
        self.outputs = tuple(s for s in specs if not is_input[s.name])
        self._report = {
            "backend": self.name,
            "engine": str(engine_path),
            "engine_source": source,
            "tensorrt": env.get("tensorrt"),
            "placement": {"source": "whole graph in one engine"},
        }

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        trt, torch = self._trt, self._torch
        stream = torch.cuda.current_stream()
        keep = []
        for name in (spec.name for spec in self.inputs):
            t = torch.from_numpy(np.ascontiguousarray(feeds[name])).cuda()
            keep.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        outputs = {}
        for name in (spec.name for spec in self.outputs):
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = torch.from_numpy(np.empty(0, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            outputs[name] = torch.empty(shape, dtype=dtype, device="cuda")
            self.context.set_tensor_address(name, outputs[name].data_ptr())
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise BackendUnavailableError("TensorRT execute_async_v3 failed")
        stream.synchronize()
        return {k: v.cpu().numpy() for k, v in outputs.items()}

    def report(self) -> dict[str, Any]:
        return dict(self._report)

    def close(self) -> None:
        self.context = None
        self.engine = None


class OrtFallbackBackend:
    """The ONNX Runtime backend plus what the TensorRT loader learnt: pre-flight, capability, placement."""

    def __init__(self, inner: OnnxRuntimeBackend, preflight_info: dict[str, Any], bundle: Bundle):
        self.inner = inner
        self.name = inner.name
        self.provider = inner.provider
        self.device = inner.device
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self._pre = preflight_info
        self._bundle = bundle
        self._placement_wanted = bool(preflight_info.pop("placement", True))

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._placement_wanted:
            # Where each node actually ran, from ONNX Runtime's own profiler (one extra profiled run, once).
            self._placement_wanted = False
            try:
                self.inner.placement(feeds)
            except Exception as exc:  # noqa: BLE001 - placement is a report, never a reason to fail a run
                self._pre["placement_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return self.inner.run(feeds)

    def report(self) -> dict[str, Any]:
        rep = self.inner.report()
        capability, explanation = self._bundle.manifest.tensorrt_planned()
        rep["tensorrt"] = {**self._pre, "planned_capability": capability, "precision_report": explanation}
        return rep

    def close(self) -> None:
        self.inner.close()


def _listed_onnx(bundle: Bundle, config: dict[str, Any]) -> Path:
    """The ONNX file the engine configuration names: only one the manifest lists (and so verified)."""
    path = bundle.file(str(config.get("onnx")))
    if path is None:
        raise BundleIntegrityError(
            f"bundle {bundle.path}: the engine configuration names {config.get('onnx')!r}, "
            "which the manifest does not list"
        )
    return path


def _engine_source(bundle: Bundle, config: dict[str, Any], env: dict[str, Any], ctx: LoadContext) -> tuple[Path, str]:
    """Prebuilt engine from the bundle, else the cache, else build it here (deferred build)."""
    if bundle.has_artifact("engine"):
        return bundle.artifact_path("engine"), "bundle"

    def note(msg: str) -> None:
        if "corrupt" in msg:
            ctx.record_fallback("engine-cache", "engine-rebuild", msg)

    path = E.engine_for(config, _listed_onnx(bundle, config), env, record=note)
    return path, "cache or deferred build on this device"


def load_tensorrt(bundle: Bundle, ctx: LoadContext) -> TensorRTEngineBackend | OrtFallbackBackend:
    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

    # edgesdk.load(..., host=HostFacts(...)) loads as if on another host (ctx.host_facts() returns it).
    env = ctx.host_facts().tensorrt_env()
    chain = list(
        bundle.manifest.runtime.backend_chain
        or [ENGINE_STEP, "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    opts = OnnxLoadOptions.narrow(ctx.options)
    if opts.providers:
        chain = [ENGINE_STEP, *opts.providers]
    # placement=False skips the one profiled run that records where each node ran (first run only).
    info: dict[str, Any] = {
        "host": {k: env.get(k) for k in ("tensorrt", "sm", "l4t", "platform", "gpu")},
        "placement": opts.placement if opts.placement is not None else True,
    }
    config = E.read_config(bundle.artifact_path("engine-config"))
    problems = preflight(config["target"], env)
    info["preflight"] = {"target": config["target"], "problems": problems, "ok": not problems}
    ep_chain = [c for c in chain if c != ENGINE_STEP]
    next_step = ep_chain[0] if ep_chain else "CPUExecutionProvider"
    if ENGINE_STEP in chain and not problems:
        try:
            path, source = _engine_source(bundle, config, env, ctx)
            return TensorRTEngineBackend(path, env, source, (config.get("dla") or {}).get("core"))
        except (ExternalToolError, BackendUnavailableError) as exc:
            ctx.record_fallback(ENGINE_STEP, next_step, exc.one_line())
        except Exception as exc:  # noqa: BLE001 - a native TensorRT error must become a fallback, not a crash
            ctx.record_fallback(ENGINE_STEP, next_step, f"TensorRT failed: {type(exc).__name__}: {str(exc)[:160]}")
    elif ENGINE_STEP in chain:
        ctx.record_fallback(ENGINE_STEP, next_step, "pre-flight: " + "; ".join(problems))
    inner = OnnxRuntimeBackend(
        _listed_onnx(bundle, config),
        ep_chain or ["CPUExecutionProvider"],
        ctx.record_fallback,
        threads=opts.threads,
    )
    return OrtFallbackBackend(inner, info, bundle)
