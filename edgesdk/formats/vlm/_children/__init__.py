# SPDX-License-Identifier: Apache-2.0
"""Child programs of the VLM build, run as ``python -m edgesdk.formats.vlm._children.<name> ARGS``
(:mod:`edgesdk.formats.vlm.build` and :mod:`edgesdk.formats.vlm.onnx_encoder` start them): each loads torch
and transformers in a process of its own, so torch stays out of the build process (as in the GGUF path,
:mod:`edgesdk.formats.gguf._children`: torch's bundled CUDA libraries and a CUDA build of llama.cpp in one
process crashed with "free(): invalid pointer"). Modules of the package, so they ship in the wheel and ruff
and mypy check them; importing one imports no torch (that happens in ``main``)."""

from __future__ import annotations
