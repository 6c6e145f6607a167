# SPDX-License-Identifier: Apache-2.0
"""Small helpers on report values shared by the report table (:mod:`.report`), the comparison
(:mod:`.compare`) and the plots (:mod:`.plots`); a leaf of the profiler, so those three do not import
each other for them."""

from __future__ import annotations

import math
from typing import Any


def value_at(report: dict, path: tuple) -> Any:
    """The value at ``path`` (keys and list indices) in ``report``, or ``None`` where any step is missing."""
    node: Any = report
    for key in path:
        if isinstance(key, int):
            if not isinstance(node, list) or len(node) <= key:
                return None
        elif not isinstance(node, dict):
            return None
        node = node[key] if isinstance(key, int) else node.get(key)
        if node is None:
            return None
    return node


def plain(v: float, digits: int = 3) -> str:
    """``digits`` significant digits as a plain number, never an exponent: 1534.2 -> 1534, 0.00123 -> 0.00123,
    12345.6 -> 12,346 (tables are read by people; the JSON report keeps full precision)."""
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    short = f"{v:.{digits}g}"
    if "e" not in short:
        return short
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:.{min(decimals, 12)}f}"
