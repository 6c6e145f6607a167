# SPDX-License-Identifier: Apache-2.0
"""Output formats, one module each: ``onnx``, ``tensorrt``, ``gguf``. Each exposes ``build_<fmt>(ctx)``."""
