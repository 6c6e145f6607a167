# SPDX-License-Identifier: Apache-2.0
"""edgesdk: build a model for a device profile, ship it as a verified bundle, run and profile it."""

from __future__ import annotations

__version__ = "0.1.0"


def _preload_llama_cpp() -> None:
    """Load a CUDA build of libllama before numpy's OpenBLAS.

    A CUDA build of llama-cpp-python 0.3.36 segfaulted at model load on the H200 machine whenever numpy
    was imported first (bisected there: `import numpy; import llama_cpp; Llama(...)` crashes, the reverse
    order works; tools/bench/results/p4_h200.json). CPU-only builds are not affected, so only a build that
    ships libggml-cuda is preloaded (a file check: nothing is loaded on other hosts). The same build must
    not share a process with torch's CUDA libraries loaded after it ("free(): invalid pointer"): processes
    that use torch set EDGESDK_NO_LLAMA_PRELOAD=1 (the exporter child does).
    """
    import importlib.util
    import os
    import sys

    if "numpy" in sys.modules or "torch" in sys.modules or os.environ.get("EDGESDK_NO_LLAMA_PRELOAD") == "1":
        return
    try:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            return
        libdir = os.path.join(list(spec.submodule_search_locations)[0], "lib")
        if os.path.isdir(libdir) and any(n.startswith("libggml-cuda") for n in os.listdir(libdir)):
            import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken optional backend must not break `import edgesdk`
        pass


_preload_llama_cpp()

__all__ = ["__version__", "load"]


def load(bundle, **kwargs):
    """Open a bundle directory and return a :class:`edgesdk.runtime.session.Session`.

    Verifies every artifact's sha256 before loading, picks the best backend present on this
    machine and falls back along the plan's chain, recording each step (``session.report()``).
    """
    from edgesdk.runtime.session import load as _load

    return _load(bundle, **kwargs)
