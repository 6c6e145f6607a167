# SPDX-License-Identifier: Apache-2.0
"""Loader for ``format: torch`` bundles: a ``torch.export`` program run by PyTorch.

Fast paths are taken only where the profile's kernel table allows them and the host can run them:
FlashAttention (SDPA flash backend), ``torch.compile`` (needs Triton on GPU) and CUDA graphs. Each one
not taken is a recorded fallback to the eager path with its reason (e.g. FlashAttention on sm_87, Triton
on aarch64), and the report says what eager costs: measured here on the first runs, and estimated for
a GPU from the docs/devices.md H200 measurements.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendUnavailableError
from edgesdk.runtime.backend import LoadContext, TensorSpec
from edgesdk.runtime.fastpaths import eager_cost_estimate, fast_paths

if TYPE_CHECKING:
    from edgesdk.bundle import Bundle


class TorchEagerBackend:
    """A ``torch.export`` program, compiled where the profile and host allow, else eager."""

    name = "torch"
    provider = "pytorch"

    def __init__(self, bundle: Bundle, ctx: LoadContext):
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailableError("this bundle is a torch.export program: install torch on the device") \
                from exc
        self._torch = torch
        path = bundle.artifact_path("exported-program")
        try:
            program = torch.export.load(str(path))
        except Exception as exc:  # corrupt/foreign archive: torch raises RuntimeError/ValueError/KeyError
            raise BackendUnavailableError(f"cannot load torch.export program {path.name}: "
                                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
        cuda = bool(ctx.options.get("device", "auto") != "cpu" and torch.cuda.is_available())
        self.device = "cuda:0" if cuda else "cpu"
        self.paths = fast_paths(ctx.profile, device_is_cuda=cuda)
        for feature, label in (("triton", "torch.compile"), ("cuda_graphs", "cuda-graphs"),
                               ("flash_attention", "flash-attention")):
            if not self.paths[feature]["use"]:
                ctx.record_fallback(label, "eager", self.paths[feature]["reason"])
        if cuda and not self.paths["flash_attention"]["use"]:
            torch.backends.cuda.enable_flash_sdp(False)  # SDPA then picks the memory-efficient/math kernels
        module: Any = program.module()
        if cuda:
            module = module.to(self.device)
        self.mode = "eager"
        if self.paths["triton"]["use"]:
            try:
                mode = "reduce-overhead" if self.paths["cuda_graphs"]["use"] else "default"
                module = torch.compile(module, mode=mode)
                self.mode = f"torch.compile({mode})"
            except Exception as exc:  # noqa: BLE001 - compile failing is itself a fallback to eager
                ctx.record_fallback("torch.compile", "eager", f"compile failed: {type(exc).__name__}: {exc}"[:200])
        self.module: Any = module
        io = bundle.manifest.io
        self.inputs = tuple(TensorSpec.from_manifest(s) for s in io.get("inputs") or [])
        self.outputs = tuple(TensorSpec.from_manifest(o) for o in io.get("outputs") or [])
        self.output_names = [o.name for o in self.outputs]
        self._extras = bundle.manifest.extras.get("torch_fallback") or {}
        self._times: list[float] = []
        self._precision = bundle.precision or "fp32"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(feeds[spec.name])).to(self.device) for spec in self.inputs]
        t0 = time.perf_counter()
        with torch.no_grad():
            result = self.module(*args)
        if self.device != "cpu":
            torch.cuda.synchronize()
        self._times.append((time.perf_counter() - t0) * 1000)
        outs = result if isinstance(result, (tuple, list)) else (result,)
        names = self.output_names or [f"output_{i}" for i in range(len(outs))]
        return {n: o.detach().cpu().numpy() for n, o in zip(names, outs)}

    def report(self) -> dict[str, Any]:
        steady = self._times[1:] or self._times
        return {
            "backend": self.name, "device": self.device, "mode": self.mode, "fast_paths": self.paths,
            "why_eager": self._extras.get("reason"), "forcing_ops": self._extras.get("forcing_ops", []),
            "cost": {
                "measured_here_ms_p50": round(float(np.median(steady)), 4) if steady else None,
                "runs_measured": len(steady), "device": self.device,
                "built_on_host_ms_p50": ((self._extras.get("cost") or {}).get("measured_here") or {}).get(
                    "eager_ms_p50"),
                "estimated_gpu_penalty": eager_cost_estimate(self._precision),
            },
            "placement": {"source": "PyTorch eager: every op on " + self.device},
        }

    def close(self) -> None:
        self.module = None


def load_torch(bundle: Bundle, ctx: LoadContext) -> TorchEagerBackend:
    return TorchEagerBackend(bundle, ctx)
