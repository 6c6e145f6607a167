# SPDX-License-Identifier: Apache-2.0
"""No new copy of six or more lines in edgesdk/ (issue 40, item 6, held in CI).

The review tool the issue counts with (``duplicates --repo edgesdk``, which also pairs code of the same shape with
other names) is not installed where CI runs; this test holds the part of it that a copy-paste makes: runs of
:data:`WINDOW` identical code lines (stripped, blank and comment lines skipped, windows of under
:data:`MIN_CHARS` letters and digits ignored: closing brackets, ``else:``) found in two places of edgesdk/. Their
count may fall, never rise above :data:`BUDGET` (the count after the de-duplication of issue 40; lower it when a
clean-up removes some). A failure names the places, to share one piece of code instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edgesdk"
WINDOW = 6
MIN_CHARS = 60
BUDGET = 13


def repeated_windows(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Each run of WINDOW code lines found in more than one place -> those places (``file:line``)."""
    places: dict[str, set[str]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        code = [
            (n, line.strip())
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")
        ]
        for i in range(len(code) - WINDOW + 1):
            lines = [text for _, text in code[i : i + WINDOW]]
            if sum(len(re.sub(r"\W", "", text)) for text in lines) >= MIN_CHARS:
                places["\n".join(lines)].add(f"{path.relative_to(root.parent)}:{code[i][0]}")
    return {text: sorted(where) for text, where in places.items() if len(where) > 1}


def test_no_new_copied_lines():
    found = repeated_windows()
    shown = "\n".join(f"  {', '.join(where)}" for where in sorted(found.values()))
    assert len(found) <= BUDGET, f"{len(found)} repeated {WINDOW}-line runs in edgesdk/ (at most {BUDGET}):\n{shown}"


def test_a_copied_function_is_caught(tmp_path):
    """The check really fails on a copy: a package of one function, then of that function twice."""
    body = "def f(a, b):\n" + "".join(f"    total_{i} = compute_something(a, b, {i})\n" for i in range(7))
    (tmp_path / "edgesdk").mkdir()
    (tmp_path / "edgesdk" / "one.py").write_text(body)
    assert repeated_windows(tmp_path / "edgesdk") == {}
    (tmp_path / "edgesdk" / "two.py").write_text(body.replace("def f", "def g"))
    assert len(repeated_windows(tmp_path / "edgesdk")) == 2  # 7 lines: two windows of 6
