# SPDX-License-Identifier: Apache-2.0
"""Loader for ``format: torch`` bundles (a ``torch.export`` program run by PyTorch), and the eager CUDA
fallback of GPU ONNX bundles (:func:`choose_eager_fallback`).

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

from edgesdk.capability.tables import eager_cost_estimate
from edgesdk.errors import BackendUnavailableError
from edgesdk.runtime.backend import LoadContext, TensorSpec
from edgesdk.runtime.fastpaths import fast_paths
from edgesdk.runtime.options import OnnxLoadOptions

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
            raise BackendUnavailableError("this bundle is a torch.export program: install torch on the device") from exc
        self._torch = torch
        path = bundle.artifact_path("exported-program")
        try:
            program = torch.export.load(str(path))
        except Exception as exc:  # corrupt/foreign archive: torch raises RuntimeError/ValueError/KeyError
            raise BackendUnavailableError(
                f"cannot load torch.export program {path.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            ) from exc
        cuda = bool(OnnxLoadOptions.narrow(ctx.options).device != "cpu" and torch.cuda.is_available())
        self.device = "cuda:0" if cuda else "cpu"
        self.paths = fast_paths(ctx.profile, device_is_cuda=cuda)
        for feature, label in (
            ("triton", "torch.compile"),
            ("cuda_graphs", "cuda-graphs"),
            ("flash_attention", "flash-attention"),
        ):
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
        self.inputs = tuple(TensorSpec.from_manifest(s) for s in bundle.manifest.io_entries("inputs"))
        self.outputs = tuple(TensorSpec.from_manifest(o) for o in bundle.manifest.io_entries("outputs"))
        self.output_names = [o.name for o in self.outputs]
        self._fallback = bundle.manifest.torch_fallback
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
            "backend": self.name,
            "device": self.device,
            "mode": self.mode,
            "fast_paths": self.paths,
            "why_eager": self._fallback.reason,
            "forcing_ops": self._fallback.forcing_ops,
            "cost": {
                "measured_here_ms_p50": round(float(np.median(steady)), 4) if steady else None,
                "runs_measured": len(steady),
                "device": self.device,
                "built_on_host_ms_p50": self._fallback.built_on_host_ms_p50,
                "estimated_gpu_penalty": eager_cost_estimate(self._precision),
            },
            "placement": {"source": "PyTorch eager: every op on " + self.device},
        }

    def close(self) -> None:
        self.module = None


def load_torch(bundle: Bundle, ctx: LoadContext) -> TorchEagerBackend:
    return TorchEagerBackend(bundle, ctx)


# ---------------------------------------------------------------- eager CUDA fallback of ONNX bundles

MEASURE_WARMUP = 2
MEASURE_RUNS = 10
MEASURE_BUDGET_S = 3.0  # per candidate: load time stays bounded however slow the CPU EP is
REP_SEQ = 128
GPU_EPS = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "DmlExecutionProvider",
    "ROCMExecutionProvider",
    "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider",
)
_SHORT = {"TensorrtExecutionProvider": "TensorRT", "CUDAExecutionProvider": "CUDA EP", "CPUExecutionProvider": "CPU EP"}


def measure_ms(
    label: str,
    run: Any,
    feeds: Mapping[str, np.ndarray],
    *,
    warmup: int = MEASURE_WARMUP,
    runs: int = MEASURE_RUNS,
    budget_s: float = MEASURE_BUDGET_S,
) -> float:
    """Median wall time of ``run(feeds)`` after ``warmup`` runs: at most ``runs`` timed runs, stopping once
    ``budget_s`` is spent (at least 3 runs). ``label`` names the candidate (for injected measurers)."""
    for _ in range(warmup):
        run(feeds)
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < runs and (len(samples) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        run(feeds)
        samples.append((time.perf_counter() - t0) * 1000)
    return float(np.median(samples))


def representative_feeds(inputs: Any, config: Mapping[str, Any], seq: int = REP_SEQ) -> dict[str, np.ndarray]:
    """Batch 1, sequence ``seq`` (clipped to the model's positions): token ids in the vocabulary, full mask;
    images at their static size (else the config's ``image_size``). Seeded, so runs are comparable."""
    rng = np.random.default_rng(0)
    seq = min(seq, int(config.get("max_position_embeddings") or seq))
    vocab = int(config.get("vocab_size") or 1000)
    size = int(config.get("image_size") or 224)
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        dims = list(spec.shape or (None, None))
        shape = [d if isinstance(d, int) else (1 if axis == 0 else seq) for axis, d in enumerate(dims)]
        if spec.name == "pixel_values" or spec.dtype.startswith("float"):
            if len(dims) == 4:
                shape = [
                    1,
                    dims[1] if isinstance(dims[1], int) else int(config.get("num_channels", 3)),
                    *(d if isinstance(d, int) else size for d in dims[2:]),
                ]
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.name == "input_ids":
            feeds[spec.name] = rng.integers(min(1000, vocab - 1), vocab, size=shape).astype(spec.dtype)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones(shape, dtype=spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


class EagerCudaBackend:
    """A GPU ONNX bundle's weights (``eager/``) as a ``transformers`` module, run eagerly by PyTorch.

    Same inputs and outputs as the ONNX graph (outputs FP32, as the ONNX bundle's)."""

    name = "torch"
    provider = "pytorch"

    def __init__(self, bundle: Bundle, device: str, inputs: Any, outputs: Any):
        import torch

        from edgesdk.formats.torch.eager import load_eager_module

        self._torch = torch
        self.device = device
        self.module: Any = load_eager_module(bundle.path, bundle.manifest.model.task, device)
        self.dtype = next(self.module.parameters()).dtype
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.output_names = [o.name for o in self.outputs]
        self.choice: dict[str, Any] = {}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        kwargs = {}
        for name, arr in feeds.items():
            t = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device)
            kwargs[name] = t.to(self.dtype) if t.is_floating_point() else t
        with torch.inference_mode():
            result = self.module(**kwargs)
            values = [result[n] if n in result else result[i] for i, n in enumerate(self.output_names)]
            out = {n: v.float().cpu().numpy() for n, v in zip(self.output_names, values)}
        return out

    def report(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "device": self.device,
            "mode": "eager",
            "dtype": str(self.dtype),
            "eager_fallback": self.choice,
            "placement": {"source": "PyTorch eager: every op on " + self.device},
        }

    def close(self) -> None:
        self.module = None


def _torch_cuda() -> tuple[str | None, str]:
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return "cuda:0", f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"


def choose_eager_fallback(bundle: Bundle, ctx: LoadContext, ort_backend: Any, chain: list[str]) -> Any:
    """When the planned chain has a GPU EP but ONNX Runtime landed on the CPU EP, and the bundle carries eager
    weights and PyTorch sees a CUDA device: measure both at load on a representative input and keep the faster.

    Options (``edgesdk.load(..., **options)``): ``eager_fallback=False`` turns it off; ``eager_device`` names
    the torch device (default ``cuda:0`` when torch sees one); ``eager_measure(label, run, feeds) -> ms``
    replaces the timing (what-if runs and tests). The outcome is a fallback record with both figures and
    ``report()["eager_fallback"]`` on whichever backend runs."""
    planned = [ep for ep in chain if ep in GPU_EPS]
    if not planned or getattr(ort_backend, "device", None) != "CPUExecutionProvider":
        return ort_backend
    status: dict[str, Any] = {"considered": True, "planned": planned}
    ort_backend.eager_fallback = status
    opts = OnnxLoadOptions.narrow(ctx.options)
    if opts.eager_fallback is False:
        status.update(used=False, reason="eager_fallback=False (option)")
        return ort_backend
    if not bundle.has_artifact("eager-weights"):
        status.update(
            used=False,
            reason="the bundle carries no eager weights (built for a CPU profile, from a "
            "non-Hugging Face source, or before eager fallbacks existed)",
        )
        return ort_backend
    device = opts.eager_device
    how = f"eager_device={device} (option)"
    if device is None:
        device, how = _torch_cuda()
    if device is None:
        status.update(used=False, reason=f"no eager CUDA: {how}")
        return ort_backend
    measure = opts.eager_measure or measure_ms
    t0 = time.perf_counter()
    try:
        eager = EagerCudaBackend(bundle, device, ort_backend.inputs, ort_backend.outputs)
    except Exception as exc:  # noqa: BLE001 - any load failure keeps the CPU EP, with the reason recorded
        status.update(
            used=False,
            reason=f"eager load failed on {device}: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}",
        )
        return ort_backend
    load_s = time.perf_counter() - t0
    cfg_raw = bundle.read_bytes("config.json")
    import json

    config = json.loads(cfg_raw) if cfg_raw else {}
    feeds = representative_feeds(ort_backend.inputs, config)
    shape = " x ".join(str(d) for d in next(iter(feeds.values())).shape)
    t1 = time.perf_counter()
    ref = ort_backend.run(feeds)
    got = eager.run(feeds)
    cos = min(_cosine(ref[n], got[n]) for n in ort_backend.output_names)
    cpu_ms = float(measure("CPUExecutionProvider", ort_backend.run, feeds))
    eager_ms = float(measure(f"torch-eager:{device}", eager.run, feeds))
    measure_s = time.perf_counter() - t1
    head = planned[0]
    gpu_why = next((f["reason"] for f in ctx.fallbacks if f.get("from") == head), "did not initialise")
    label = f"eager {'CUDA' if device.startswith('cuda') else device}"
    figures = (
        f"CPU EP {cpu_ms:.2f} ms vs {label} {eager_ms:.2f} ms vs planned {_SHORT.get(head, head)} n/a "
        f"({gpu_why.split(': ', 1)[-1][:120]})"
    )
    costs = {
        "input_shape": shape,
        "cpu_ep_ms_p50": round(cpu_ms, 4),
        "eager_ms_p50": round(eager_ms, 4),
        "eager_device": device,
        "planned": head,
        "planned_ms": None,
        "eager_vs_cpu_ep_cosine": round(cos, 6),
        "load_cost_s": {"eager_load": round(load_s, 3), "measure": round(measure_s, 3)},
        "measurement": f"median of up to {MEASURE_RUNS} runs after {MEASURE_WARMUP} warm-up runs, at most "
        f"{MEASURE_BUDGET_S:g} s per candidate" + (" (injected measurer)" if measure is not measure_ms else ""),
    }
    status.update(costs)
    if cos < 0.99:
        status.update(
            used=False, reason=f"eager output disagrees with the ONNX graph (cosine {cos:.4f} < 0.99): kept the CPU EP"
        )
        eager.close()
        ctx.record_fallback(head, "CPUExecutionProvider", f"{figures}; eager rejected: cosine {cos:.4f}", costs=costs)
        return ort_backend
    if eager_ms < cpu_ms:
        status.update(used=True, reason=f"{label} is {cpu_ms / eager_ms:.1f}x faster than the CPU EP here")
        eager.choice = status
        ctx.record_fallback(
            head,
            f"torch-eager:{device}",
            f"no GPU execution provider; measured at load (input {shape}): {figures} -> {label}",
            costs=costs,
        )
        ort_backend.close()
        return eager
    status.update(used=False, reason=f"the CPU EP is {eager_ms / cpu_ms:.1f}x faster than {label} here")
    eager.close()
    ctx.record_fallback(
        head,
        "CPUExecutionProvider",
        f"no GPU execution provider; measured at load (input {shape}): {figures} -> CPU EP",
        costs=costs,
    )
    return ort_backend
