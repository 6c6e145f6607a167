# SPDX-License-Identifier: Apache-2.0
"""Backends and the loader registry.

The backend contract is code: :mod:`edgesdk.runtime.backend` defines the ``Backend`` and ``LLMBackend``
protocols, ``TensorSpec``, ``LoadContext`` and ``Loader``, with a complete worked example of a backend
and its loader in its module docstring (run by ``tests/test_backend.py``). Each module here implements
it for one runtime; CPU is always the last resort of every chain.
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
