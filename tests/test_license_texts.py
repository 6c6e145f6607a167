# SPDX-License-Identifier: Apache-2.0
"""Issue 34 item 6: a whole license text is classified as the license whose phrases it covers best, not as one
whose name it mentions. The standard GPL-3.0 text ends with "use the GNU Lesser General Public License instead",
and was classified LGPL-3.0-only (review, and ``--accept-license LGPL-3.0-only`` shipped it); GPL-2.0's text was
not recognised at all. The corpus is the full texts of the SPDX License List as the ``spdx`` package (CC0-1.0, a
dev dependency) ships them: none is copied into this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgesdk.compliance.gate import scan_licenses
from edgesdk.compliance.spdx import identify_text

spdx = pytest.importorskip("spdx", reason="pip install -e .[dev] (the spdx package ships the SPDX license texts)")

# 30 licenses common in models, their code and their data; the package's list predates the -only ids.
COMMON = [
    "Apache-2.0", "MIT", "BSD-3-Clause", "BSD-2-Clause", "ISC", "0BSD", "Zlib", "BSL-1.0", "Unlicense",
    "GPL-2.0", "GPL-3.0", "LGPL-2.0", "LGPL-2.1", "LGPL-3.0", "AGPL-3.0", "MPL-1.1", "MPL-2.0", "EPL-1.0",
    "CDDL-1.0", "Artistic-2.0", "OFL-1.1", "WTFPL", "PostgreSQL", "CC0-1.0", "CC-BY-4.0", "CC-BY-SA-4.0",
    "CC-BY-NC-4.0", "CC-BY-NC-SA-4.0", "CC-BY-ND-4.0", "CC-BY-NC-ND-4.0",
]  # fmt: skip
ONLY = {"GPL-2.0", "GPL-3.0", "LGPL-2.0", "LGPL-2.1", "LGPL-3.0", "AGPL-3.0"}


def full_text(license_id: str) -> str:
    """The license's full SPDX text, its template markup resolved to the original wording."""
    record = next(r for r in spdx.licenses() if r["id"] == license_id)
    text = spdx.License(record).template
    text = re.sub(r"<<var;[^>]*?original=(.*?);match=.*?>>", r"\1", text, flags=re.S)
    return re.sub(r"<<[^>]*>>", "", text)


def test_the_corpus_has_thirty_texts():
    assert len(set(COMMON)) == 30
    assert all(len(full_text(lid)) > 200 for lid in COMMON)


@pytest.mark.parametrize("license_id", COMMON)
def test_each_full_spdx_text_is_classified_as_itself(license_id):
    want = f"{license_id}-only" if license_id in ONLY else license_id
    got = identify_text(full_text(license_id))
    assert got.expression == want, got


def test_texts_in_one_file_are_each_reported():
    got = identify_text(full_text("GPL-3.0") + "\n\n" + full_text("LGPL-3.0"))  # COPYING + COPYING.LESSER
    assert got.expression == "LGPL-3.0-only AND GPL-3.0-only", got
    got = identify_text(full_text("GPL-3.0"))
    assert "only partly covered: LGPL-3.0-only 50%" in got.note, got


def test_gpl3_copying_of_a_model_is_denied_not_review(tmp_path: Path):
    """The issue's case end to end: a model directory whose COPYING is the GPL-3.0 text. Strong copyleft is
    denied by the default policy; ``--accept-license LGPL-3.0-only`` no longer ships it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "COPYING").write_text(full_text("GPL-3.0"), encoding="utf-8")
    for accepted in ((), ("LGPL-3.0-only",)):
        result = scan_licenses(model, accepted=accepted)
        assert result.verdict == "deny", [f.headline() for f in result.findings]
        assert [f.spdx for f in result.findings if "COPYING" in f.subject] == ["GPL-3.0-only"]
