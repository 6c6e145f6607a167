# SPDX-License-Identifier: Apache-2.0
"""The llama.cpp core the GGUF backend (:mod:`edgesdk.runtime.backends.llamacpp`) and the VLM backend
(:mod:`edgesdk.runtime.backends.vlm.backend`) share: llama-cpp-python imported for a loader with llama.cpp's log
routed. Both then run their decoder in a :class:`~edgesdk.runtime.batching.BatchEngine` on its
:class:`~edgesdk.runtime.batching.Weights`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgesdk.errors import BackendUnavailableError
from edgesdk.native import import_llama_cpp, route_llama_logs

if TYPE_CHECKING:
    pass


def load_llama_cpp(what: str, *, verbose: bool) -> Any:
    """``llama_cpp`` for the loader of ``what`` (``"a GGUF bundle"``, ``"a VLM bundle"``): the ``gguf`` extra required,
    the module imported (:class:`BackendUnavailableError` when it is installed but its native library does not load),
    and llama.cpp's log lines routed (stderr only when ``verbose``; :func:`edgesdk.native.route_llama_logs`)."""
    from edgesdk.extras import require

    require("gguf", "llama_cpp", what)
    try:
        llama_cpp = import_llama_cpp()
    except (ImportError, OSError) as exc:  # installed, but its native library does not load
        raise BackendUnavailableError(f"llama-cpp-python is installed but does not load: {exc}") from exc
    route_llama_logs(verbose)
    return llama_cpp
