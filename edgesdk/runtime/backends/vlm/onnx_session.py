# SPDX-License-Identifier: Apache-2.0
"""The VLM bundle's ONNX FP16 vision encoder + projector on ONNX Runtime (docs/vlm.md, "Runtime").

Which encoder runs is chosen at load time (:func:`choose`):

* ``auto`` (default): the ONNX encoder when onnxruntime really initialises TensorRT or CUDA here
  (probed on a one-node model, :func:`edgesdk.runtime.backends.onnxruntime.probe_provider`), in that
  order; otherwise llama.cpp's mmproj encoder, recorded as a fallback with the reason.
* ``onnx``: the ONNX encoder on the best provider, the CPU included (what the tests run here).
* ``mmproj``: llama.cpp's mmproj encoder (libmtmd), never ONNX.

Set with the load option ``vision_encoder=`` or the environment variable ``EDGESDK_VLM_ENCODER``.
The ONNX encoder takes the same resized pixels the mmproj path gets, normalised with the processor's
rescale factor and mean/std (:func:`edgesdk.contracts.vlm_encoder.normalise`, the artifact's contract), and
returns the features the decoder consumes (``n_image_tokens x n_embd``, float32).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from edgesdk.contracts.vlm_encoder import INPUT_NAME, OUTPUT_NAME, normalise
from edgesdk.errors import BackendUnavailableError, InputError
from edgesdk.host import thread_cap

ENV = "EDGESDK_VLM_ENCODER"
CHOICES = ("auto", "onnx", "mmproj")
FAST_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
_log = logging.getLogger("edgesdk.vlm")


class OnnxImageEncoder:
    """An ONNX Runtime session on the vision encoder + projector graph."""

    def __init__(self, path: Path, preprocessor: dict[str, Any], provider: str, *, threads: int | None = None):
        import onnxruntime as ort

        self.path, self.preprocessor, self.provider = Path(path), preprocessor, provider
        self._in, self._out = INPUT_NAME, OUTPUT_NAME
        so = ort.SessionOptions()
        so.log_severity_level = 3
        threads = threads or thread_cap()  # OMP_NUM_THREADS caps ONNX Runtime as it caps llama.cpp (host.py)
        if threads:
            so.intra_op_num_threads = int(threads)
        providers: list[Any] = []
        if provider == "TensorrtExecutionProvider":
            from edgesdk.formats.tensorrt.engine import engine_cache_root

            cache = engine_cache_root() / "vlm-encoder"
            cache.mkdir(parents=True, exist_ok=True)
            providers.append(
                (
                    provider,
                    {"trt_fp16_enable": True, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache)},
                )
            )
            providers.append("CUDAExecutionProvider")
        elif provider != "CPUExecutionProvider":
            providers.append(provider)
        providers.append("CPUExecutionProvider")
        t0 = perf_counter()
        try:
            self.session = ort.InferenceSession(str(self.path), so, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise BackendUnavailableError(
                f"onnxruntime cannot load the vision encoder {self.path.name}: {str(exc).splitlines()[0][:200]}"
            ) from exc
        self.load_s = perf_counter() - t0
        self.active = self.session.get_providers()[0]
        self.runs = 0
        self.last_s: float | None = None

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        t0 = perf_counter()
        out = self.session.run([self._out], {self._in: normalise(pixels, self.preprocessor)})[0]
        self.last_s = perf_counter() - t0
        self.runs += 1
        return np.ascontiguousarray(out.reshape(-1, out.shape[-1]), dtype=np.float32)

    def report(self) -> dict[str, Any]:
        return {"artifact": self.path.name, "provider": self.active, "load_s": round(self.load_s, 4), "runs": self.runs}


def choose(
    mode: str | None,
    onnx_path: Path | None,
    record_fallback: Callable[[str, str, str], None],
    *,
    required: bool = False,
) -> tuple[str | None, str]:
    """(provider for the ONNX encoder or None for the mmproj encoder, the reason), logging the choice and
    recording a fallback when an ONNX encoder is in the bundle but not used for want of a provider.
    ``required``: the bundle's mmproj does not encode (a CLIP tower with a class token, docs/vlm.md), so the
    ONNX encoder runs on the best provider, the CPU included, and ``mmproj`` is refused."""
    mode = (mode or os.environ.get(ENV) or "auto").strip().lower()
    if mode not in CHOICES:
        raise InputError(f"vision_encoder must be one of {', '.join(CHOICES)}, got {mode!r}")
    if required:
        if mode == "mmproj":
            raise InputError(
                "vision_encoder=mmproj: this bundle's mmproj does not encode images (a CLIP tower with "
                "a class token, which llama.cpp's graph cannot reproduce; docs/vlm.md)",
                hint="use vision_encoder=auto or onnx",
            )
        if onnx_path is None:
            raise BackendUnavailableError("the bundle has no vision_encoder.onnx, and its mmproj does not encode")
        mode = "onnx"
    if mode == "mmproj":
        return None, "vision_encoder=mmproj: llama.cpp's mmproj encoder (libmtmd) was asked for"
    if onnx_path is None:
        why = "the bundle has no ONNX vision encoder (built for a CPU profile or --vision-runtime gguf)"
        if mode == "onnx":
            raise InputError(f"vision_encoder=onnx: {why}", hint="rebuild with --vision-runtime onnx")
        return None, why
    from edgesdk.runtime.backends.onnxruntime import probe_provider

    notes = []
    for ep in FAST_PROVIDERS:
        try:
            ok, why = probe_provider(ep)
        except ImportError:
            ok, why = False, "onnxruntime is not installed"
        if ok:
            return ep, f"ONNX FP16 encoder on {ep} (initialised here)"
        notes.append(f"{ep}: {why}")
    if mode == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError("vision_encoder=onnx needs onnxruntime (pip install onnxruntime)") from exc
        if required:
            reason = (
                "the mmproj does not encode (CLIP class token): ONNX FP16 encoder on the CPU, no faster "
                "provider here (" + "; ".join(notes) + ")"
            )
            record_fallback("ONNX FP16 vision encoder (TensorRT/CUDA)", "ONNX FP16 vision encoder (CPU)", reason)
            _log.info("VLM vision encoder: ONNX on the CPU (%s)", reason)
            return "CPUExecutionProvider", reason
        return "CPUExecutionProvider", (
            "vision_encoder=onnx: ONNX FP16 encoder on the CPU as asked (" + "; ".join(notes) + ")"
        )
    reason = "no fast ONNX Runtime provider for the ONNX FP16 encoder: " + "; ".join(notes)
    record_fallback("ONNX FP16 vision encoder (TensorRT/CUDA)", "llama.cpp mmproj vision encoder", reason)
    _log.info("VLM vision encoder: llama.cpp mmproj (%s)", reason)
    return None, reason
