# SPDX-License-Identifier: Apache-2.0
"""The GGUF type table moved to :mod:`edgesdk.contracts.gguf_types` (issue 40, item 5). This name stays only for
``edgesdk/runtime/backends/llamacpp.py``, which another change is editing: delete it once that module imports
``edgesdk.contracts.gguf_types``."""

from __future__ import annotations

from edgesdk.contracts.gguf_types import DEFAULT_KV_TYPE, kv_bytes

__all__ = ["DEFAULT_KV_TYPE", "kv_bytes"]
