# SPDX-License-Identifier: Apache-2.0
"""The one table renderer: the layouts the CLI, license, trace, capability and profiler reports print."""

from __future__ import annotations

import pytest

from edgesdk.textable import format_table


def test_cli_layout_header_rule_none_and_trailing_spaces():
    text = format_table([["a", None, "x"], ["bbbb", 12, ""]], ["name", "n", "note"])
    assert text == "name  n   note\n----  --  ----\na     -   x\nbbbb  12"


def test_empty_last_header_keeps_the_rule_column():
    # profiler compare: the last column is blank unless a metric regressed
    assert format_table([["p50", ""]], ["metric", ""]) == "metric\n------  \np50"


def test_report_layout_last_column_unpadded_and_not_stripped():
    text = format_table([("a", "bb", "tail  ")], ("H1", "H2", "H3"), rule=False, rstrip=False)
    assert text == "H1  H2  H3\na   bb  tail  "


def test_max_width_cuts_all_but_the_last_column():
    long = "x" * 50
    text = format_table([(long, long)], ("A", "B"), rule=False, max_width=40)
    assert text.splitlines()[1] == "x" * 40 + "  " + long


def test_right_alignment_and_title():
    text = format_table([["a", 1], ["b", 100]], ["k", "v"], align="<>", title="T")
    assert text == "T\nk    v\n-  ---\na    1\nb  100"


def test_no_rows_prints_the_header():
    assert format_table([], ["a", "bb"]) == "a  bb\n-  --"


def test_ragged_row_and_bad_alignment_are_refused():
    with pytest.raises(ValueError, match="2 cells"):
        format_table([["a", "b"]], ["one"])
    with pytest.raises(ValueError, match="alignment"):
        format_table([["a"]], ["one"], align="^")
