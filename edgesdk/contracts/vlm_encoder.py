# SPDX-License-Identifier: Apache-2.0
"""The ONNX vision-encoder artifact's contract (``vision_encoder.onnx`` of a VLM bundle), shared by the build that
writes it and the runtime that runs it: the graph's input and output names and how an image becomes its input.

* input :data:`INPUT_NAME` float32 ``[1, 3, H, W]``: the resized image, normalised by :func:`normalise`;
* output :data:`OUTPUT_NAME` float32 ``[1, n_image_tokens, n_embd]``: the features the decoder consumes.

The build's export and parity (:mod:`edgesdk.formats.vlm.onnx_encoder`) and the runtime's ONNX Runtime session on
the artifact (:mod:`edgesdk.runtime.backends.vlm.onnx_session`) import these from here (:mod:`edgesdk.contracts`:
the lowest layer, so the formats below the runtime import it without importing the runtime).
"""

from __future__ import annotations

from typing import Any

import numpy as np

INPUT_NAME, OUTPUT_NAME = "pixel_values", "image_features"


def normalise(pixels: np.ndarray, preprocessor: dict[str, Any]) -> np.ndarray:
    """HxWx3 uint8 (the resized image) -> float32 ``[1, 3, H, W]`` as the processor does it: times
    ``rescale_factor`` (when ``do_rescale``), minus ``image_mean``, over ``image_std`` (when ``do_normalize``)."""
    x = pixels.astype(np.float32)
    if preprocessor.get("do_rescale", True):
        x = x * np.float32(preprocessor.get("rescale_factor", 1 / 255))
    if preprocessor.get("do_normalize", True):
        mean = np.asarray(preprocessor.get("image_mean", [0.5, 0.5, 0.5]), dtype=np.float32)
        std = np.asarray(preprocessor.get("image_std", [0.5, 0.5, 0.5]), dtype=np.float32)
        x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)
