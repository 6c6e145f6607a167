# SPDX-License-Identifier: Apache-2.0
"""VLM backend: image decode + preprocessing (the model's own processor config), the vision encoder +
projector (F16 mmproj) and the quantized GGUF decoder, all through llama.cpp's multimodal library
(libmtmd, via llama-cpp-python's public ``llama_cpp.mtmd_cpp`` bindings).

One request: preprocess (Pillow: decode, RGB, resize / center-crop as ``preprocessor_config.json``
says) -> encode (``mtmd_encode_chunk`` or the ONNX encoder; skipped when the image's features are cached) -> the
engine's request (:class:`~edgesdk.runtime.batching.MultimodalRequest`: text token ids and image chunks) -> the model's
one :class:`~edgesdk.runtime.batching.BatchEngine` evaluates each image inside the request's slot
(``mtmd_helper_decode_image_chunk``) and batches its text and generated tokens with the other requests'. Image-prefix
reuse: features are cached by (preprocessed pixels' sha256, encoder sha256), and the engine's prefix reuse keeps a
slot's KV cells (text tokens and image hashes), so a second question about the same image evaluates only its own
text. Telemetry: one GenAI span per request (``telemetry.inference``) with
stage child spans ``preprocess``, ``encode`` (only when the encoder runs; a cached image is an
``edgesdk.vlm.image_cached`` event), ``prefill`` (until the first text piece) and ``decode`` (``rec.stage``), and the
stage times as ``edgesdk.vlm.{preprocess,encode}_s`` attributes; image tokens are counted in
``gen_ai.usage.input_tokens`` and separately as ``edgesdk.vlm.image_tokens``.

The package's modules: :mod:`.preprocess` (image decoding, :class:`ImagePreprocessor`), :mod:`.families` (the
runtime's per-family behaviour, chosen by the family record), :mod:`.pipeline` (:class:`VLMPipeline`: the decoder
weights and libmtmd, a prompt with images -> the engine's prompt),
:mod:`.onnx_session` (the ONNX Runtime session on the ONNX encoder artifact, whose contract is
:mod:`edgesdk.contracts.vlm_encoder`, and the choice of encoder) and :mod:`.backend` (:class:`VLMBackend`,
:func:`load_vlm`, :func:`parity_backend`).
"""

from __future__ import annotations

from edgesdk.contracts.vlm_encoder import INPUT_NAME, OUTPUT_NAME, normalise
from edgesdk.runtime.backends.vlm.backend import VLMBackend, load_vlm, parity_backend
from edgesdk.runtime.backends.vlm.pipeline import ENCODE_TIMES_KEPT, FEATURE_CACHE_SIZE, VLMPipeline
from edgesdk.runtime.backends.vlm.preprocess import (
    MAX_ASPECT,
    MAX_IMAGE_BYTES,
    MIN_MAX_SIDE,
    ImagePreprocessor,
    decode_image,
    load_pixels,
    open_image,
)
from edgesdk.runtime.requests import DEFAULT_SAMPLING  # the runtime's one set of sampling defaults

__all__ = [
    "DEFAULT_SAMPLING",
    "ENCODE_TIMES_KEPT",
    "FEATURE_CACHE_SIZE",
    "INPUT_NAME",
    "MAX_ASPECT",
    "MAX_IMAGE_BYTES",
    "MIN_MAX_SIDE",
    "OUTPUT_NAME",
    "ImagePreprocessor",
    "VLMBackend",
    "VLMPipeline",
    "decode_image",
    "load_pixels",
    "load_vlm",
    "normalise",
    "open_image",
    "parity_backend",
]
