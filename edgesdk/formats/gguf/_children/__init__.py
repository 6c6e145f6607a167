# SPDX-License-Identifier: Apache-2.0
"""Child programs of the GGUF build, run as ``python -m edgesdk.formats.gguf._children.<name> ARGS``
(:mod:`edgesdk.formats.gguf.convert` starts them): each runs in a process of its own because what it loads
must not share a process with the build (llama.cpp's quantizer; torch beside a CUDA build of llama.cpp).
Modules of the package, so they ship in the wheel and ruff and mypy check them."""

from __future__ import annotations
