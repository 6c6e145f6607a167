# SPDX-License-Identifier: Apache-2.0
"""A waiver names what it waives (a path, a package or a license id); a pattern may narrow a named
thing, never stand for it (issue 25, finding 1).

The property test generates subject globs from wildcards and literal pieces and checks every one the
loader accepts without a license against an oracle that knows nothing of the loader: every subject the
glob matches (made by filling its wildcards at random) must belong to one thing, the same package name,
first directory, or the literal subject itself."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

from edgesdk.compliance.gate import scan_licenses
from edgesdk.compliance.waivers import load_waivers
from edgesdk.errors import InputError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("EDGESDK_FUZZ_EXAMPLES", "200"))
from waiver_fixtures import PYPROJECT  # noqa: E402  (tests/ on sys.path)
from waiver_fixtures import waiver_file as _waiver_file  # noqa: E402


def _thing(subject: str) -> tuple[str, str]:
    """The oracle: which one thing a finding subject belongs to (package, top directory, or itself)."""
    eq = subject.find("==")
    if eq >= 0 and "/" not in subject[:eq]:
        return ("package", subject[:eq])
    if "/" in subject:
        return ("directory", subject.split("/", 1)[0])
    return ("name", subject)


# ------------------------------------------------------------------ the cases of the issue


@pytest.mark.parametrize(
    "subject",
    [
        "*.gguf",
        "*0*",
        "*2*",
        "*.py",
        "gemma*",
        "*/LICENSE",
        "*==1.0",
        "?emma-3-270m",
        "[g]emma-3-270m",
        "model.*",
        "*-3-270m",
        "./*",
        "-/*",
        "*/vendor/*",
    ],
)
def test_pattern_that_stands_for_the_name_is_refused(tmp_path: Path, subject: str) -> None:
    with pytest.raises(InputError, match="names no file, directory or package|would waive everything"):
        load_waivers(_waiver_file(tmp_path, subject=subject))


@pytest.mark.parametrize(
    "subject",
    [
        "model.gguf",
        "gemma-3-270m",
        "crc32c==*",
        "crc32c==2.*",
        "vendor/*",
        "src/legacy_*.c",
        "third_party/fastlib/*",
        "(files without a header)",
    ],
)
def test_pattern_that_narrows_a_named_thing_is_kept(tmp_path: Path, subject: str) -> None:
    (waiver,) = load_waivers(_waiver_file(tmp_path, subject=subject))
    assert waiver.subject == subject


@pytest.mark.parametrize("subject", ["*.gguf", "*0*"])
def test_a_named_license_may_be_narrowed_by_any_pattern(tmp_path: Path, subject: str) -> None:
    (waiver,) = load_waivers(_waiver_file(tmp_path, subject=subject, license="LicenseRef-gemma"))
    assert (waiver.subject, waiver.license) == (subject, "LicenseRef-gemma")


def _gemma_tree(tmp_path: Path) -> Path:
    """A tree whose only review finding is a Gemma-licensed GGUF (restricted-model: review)."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "model-q4_0.gguf").write_bytes(b"GGUF weights stand-in\n")
    (root / "model-q4_0.gguf.license").write_text("SPDX-License-Identifier: LicenseRef-gemma\n")
    return root


@pytest.mark.parametrize("subject", ["*.gguf", "*0*", "*2*"])
def test_check_licenses_is_not_cleared_by_a_wildcard_waiver(tmp_path: Path, run_cli, subject: str) -> None:
    root = _gemma_tree(tmp_path)
    assert scan_licenses(root).verdict == "review"  # the finding the waiver would clear
    proc = run_cli("check", "licenses", root, "--waivers", _waiver_file(tmp_path, subject=subject), timeout=120)
    # Before: exit 0 (the glob matched 0-4 of 40 sample subjects, so it was "narrow"). Now: the waiver
    # file is refused (exit 1, one error line), so nothing is cleared.
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.count("error:") == 1 and "names no file, directory or package" in proc.stderr
    named = _waiver_file(tmp_path, subject="model-q4_0.gguf")  # the same waiver naming the file passes
    assert run_cli("check", "licenses", root, "--waivers", named, timeout=120).returncode == 0


# ------------------------------------------------------------------ the property

_LITERAL = st.text(alphabet="ab0.-_", min_size=1, max_size=4)
_TOKEN = st.one_of(
    _LITERAL.map(lambda s: ("lit", s)),
    st.sampled_from(
        [("lit", "/"), ("lit", "=="), ("lit", "="), ("star", "*"), ("one", "?"), ("set", "[a0/]"), ("notset", "[!a]")]
    ),
)
_FILL_CHARS = "ab0./=-"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tokens=st.lists(_TOKEN, min_size=1, max_size=7), data=st.data())
def test_accepted_subject_glob_names_one_thing(tmp_path: Path, tokens, data) -> None:
    pattern = "".join(text for _, text in tokens)
    try:
        load_waivers(_waiver_file(tmp_path, subject=pattern))
    except InputError:
        return  # refused: nothing to check
    # Accepted without a license: every subject it matches must belong to the same thing.
    things = set()
    for _ in range(6):
        parts = []
        for kind, text in tokens:
            if kind == "lit":
                parts.append(text)
            elif kind == "star":
                parts.append(data.draw(st.text(alphabet=_FILL_CHARS, max_size=5)))
            elif kind == "one":
                parts.append(data.draw(st.sampled_from(_FILL_CHARS)))
            elif kind == "set":
                parts.append(data.draw(st.sampled_from("a0/")))
            else:
                parts.append(data.draw(st.sampled_from(_FILL_CHARS.replace("a", ""))))
        subject = "".join(parts)
        assert fnmatch.fnmatchcase(subject, pattern), (subject, pattern)
        things.add(_thing(subject))
    assert len(things) == 1, f"waiver subject {pattern!r} accepted but matches {sorted(things)}"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.text(alphabet="abcxyz019-_", min_size=1, max_size=8).filter(lambda s: any(c.isalnum() for c in s)),
    shape=st.sampled_from(["{n}", "{n}==*", "{n}==1.*", "{n}/*", "{n}/sub/*.c", "{n}/x.py"]),
)
def test_named_thing_narrowed_by_a_pattern_is_accepted(tmp_path: Path, name: str, shape: str) -> None:
    subject = shape.format(n=name)
    (waiver,) = load_waivers(_waiver_file(tmp_path, subject=subject))
    assert waiver.subject == subject
