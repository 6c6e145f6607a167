# SPDX-License-Identifier: Apache-2.0
"""Backends and the loader registry.

The backend contract (every backend implements it; CPU is always the last resort):

``name``      runtime name: ``onnxruntime``, ``llama.cpp``, ``tensorrt``, ``torch``
``provider``  the ``gen_ai.provider.name`` telemetry reports
``device``    where it runs, e.g. ``CPUExecutionProvider`` or ``cuda:0``
``run(feeds) -> dict[str, ndarray]``  one inference on named inputs
``report() -> dict``                  what ran where (placement, settings), for ``session.report()``
``close()``                           release native resources

LLM backends add ``generate``, ``stream``, ``chat`` and ``tokenize``.

A loader takes ``(bundle, ctx)`` and returns a backend, walking its own fallback chain and calling
``ctx.record_fallback(from_, to, reason)`` for every step down. Example::

    def load_onnx(bundle, ctx):
        backend = OnnxRuntimeBackend(bundle.artifact_path("model"), chain, ctx)
        return backend
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# format -> "module:function"; imported lazily so a device needs only its own backend's packages.
LOADERS: dict[str, str] = {
    "onnx": "edgesdk.runtime.backends.onnxruntime:load_onnx",
    "gguf": "edgesdk.runtime.backends.llamacpp:load_gguf",
    "tensorrt": "edgesdk.runtime.backends.tensorrt:load_tensorrt",
    "torch": "edgesdk.runtime.backends.torch_eager:load_torch",
}


def get_loader(fmt: str) -> Callable:
    from edgesdk.errors import BackendUnavailableError

    target = LOADERS.get(fmt)
    if target is None:
        raise BackendUnavailableError(f"no runtime backend for bundle format {fmt!r}",
                                      hint=f"known formats: {', '.join(sorted(LOADERS))}")
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)
