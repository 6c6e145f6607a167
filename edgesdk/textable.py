# SPDX-License-Identifier: Apache-2.0
"""The one plain-text table renderer (CLI tables, license and trace reports, capability, profiler).

Columns are separated by two spaces; ``None`` prints as ``-``. The last column is never padded when
it is left-aligned, so a long free-text column at the end does not widen the others' lines.

>>> print(format_table([["a", 1], ["bbb", None]], ["name", "n"]))
name  n
----  -
a     1
bbb   -
>>> print(format_table([["x", "12"]], ["k", "v"], align="<>", rule=False, title="figures"))
figures
k   v
x  12

This module sits at the bottom of the package (it imports nothing from edgesdk) so that library
modules and commands can both use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_table"]


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def format_table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[Any],
    *,
    align: str | Sequence[str] = "",
    title: str | None = None,
    rule: bool = True,
    max_width: int | None = None,
    rstrip: bool = True,
) -> str:
    """Render ``rows`` under ``headers`` as aligned text (no trailing newline).

    ``align``: one character per column, ``"<"`` (left, the default for columns not given) or ``">"``.
    ``title``: a line printed above the table. ``rule``: a line of dashes under the header.
    ``max_width``: every column but the last is cut to this many characters (and no wider).
    ``rstrip``: strip trailing spaces from each line.
    """
    ncols = len(headers)
    for row in rows:
        if len(row) != ncols:
            raise ValueError(f"table row has {len(row)} cells, the header has {ncols}: {list(row)!r}")
    aligns = [align[i] if i < len(align) else "<" for i in range(ncols)]
    for a in aligns:
        if a not in ("<", ">"):
            raise ValueError(f"table alignment must be '<' or '>', got {a!r}")
    cells = [[_text(c) for c in headers]] + [[_text(c) for c in r] for r in rows]
    if max_width is not None:
        cells = [[c[:max_width] if i < ncols - 1 else c for i, c in enumerate(r)] for r in cells]
    widths = [max(len(r[i]) for r in cells) for i in range(ncols)]

    def line(r: list[str]) -> str:
        out = []
        for i, c in enumerate(r):
            if aligns[i] == ">":
                out.append(c.rjust(widths[i]))
            elif i < ncols - 1:
                out.append(c.ljust(widths[i]))
            else:
                out.append(c)
        text = "  ".join(out)
        return text.rstrip() if rstrip else text

    lines = [line(r) for r in cells]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    if title is not None:
        lines.insert(0, title)
    return "\n".join(lines)
