# SPDX-License-Identifier: Apache-2.0
"""The child program of a GGUF load's probe (``python -m edgesdk.runtime.backends.llamacpp_probe PATH NGL FA
N_CTX``): llama.cpp loads the model with those settings and the engine decodes one short prompt. Exit 0 when that
worked; a crash (a signal) or an error ends only this child, and the parent
(:func:`edgesdk.runtime.backends.llamacpp._probe_in_child`) reports it and tries the next setting.

Imports only the engine and llama-cpp-python, through :func:`edgesdk.native.import_llama_cpp` (the load order the
parent uses)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from edgesdk.runtime.batching import BatchEngine

    path, ngl, fa, n_ctx = argv[0], int(argv[1]), argv[2] == "1", int(argv[3])
    with BatchEngine(path, slots=1, n_gpu_layers=ngl, flash_attn=fa, n_ctx=n_ctx) as engine:
        engine.logits(engine.tokenize("Hello"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
