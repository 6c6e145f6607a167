# SPDX-License-Identifier: Apache-2.0
"""The GGUF type table: llama.cpp's file-type numbers (:data:`FTYPES`), the bits per weight of each type
(:data:`BPW`) and the K/V cache arithmetic (:func:`kv_bytes`). In :mod:`edgesdk.contracts` (the lowest layer; it
imports nothing of edgesdk), so the profile validator, the GGUF planner and converter, the GGUF facts, the
profiler's roofline and the llama.cpp runtime share it without importing the planner (or each other).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# llama_ftype values (llama.h; the same numbers as gguf-py's LlamaFileType) for the types we plan with.
FTYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_S": 11,
    "Q3_K_M": 12,
    "Q3_K_L": 13,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_S": 16,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "BF16": 32,
}
FTYPE_NAMES = {v: k for k, v in FTYPES.items()}

# Bits per weight. Plain block types follow from the block layout in ggml-common.h (e.g. Q8_0 is
# 32 int8 + one f16 scale = 34 bytes / 32 weights = 8.5; Q6_K is 210 bytes / 256 = 6.5625). The
# _S/_M/_L mixes keep some tensors at a larger type; their figures are the effective bpw llama.cpp's
# quantize tool reports for 7B-class llama models (tools/quantize, "bpw" column) and are estimates.
BPW = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.5625,
    "Q5_K_M": 5.69,
    "Q5_K_S": 5.54,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q4_K_M": 4.89,
    "Q4_K_S": 4.58,
    "Q4_0": 4.5,
    "Q4_1": 5.0,
    "Q3_K_L": 4.27,
    "Q3_K_M": 3.91,
    "Q3_K_S": 3.5,
    "Q2_K": 2.96,
}

# Bytes per element of the K/V cache types llama.cpp takes (--cache-type-k/-v), from the same block layouts.
KV_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q4_0": 18 / 32,
}
DEFAULT_KV_TYPE = "f16"


def kv_bytes(info: Mapping[str, Any], n_ctx: int, kv_type: str = DEFAULT_KV_TYPE) -> int:
    """KV cache bytes: 2 (K and V) x layers x kv_heads x head_dim x context x bytes per element of
    ``kv_type`` (2 for llama.cpp's default F16 cache)."""
    elements = 2 * int(info["layers"]) * int(info["kv_heads"]) * int(info["head_dim"]) * n_ctx
    return math.ceil(elements * KV_TYPE_BYTES[kv_type])
