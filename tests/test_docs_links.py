# SPDX-License-Identifier: Apache-2.0
"""Every file the docs, the profiles' sources and the code's comments cite exists in the repository.

Checked: repository paths (``edgesdk/...``, ``docs/...``, ``tools/...``, ...) and relative Markdown
links in README.md and docs/*.md; repository paths in the ``source:`` fields of the device profiles and
the shipped data tables; in code and configuration, every cited document (``docs/...``, a top-level
``NAME.md``) and every ``# see <path>`` comment. A path that leaves the repository (``../...``) fails.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
TOP_DIRS = ("edgesdk", "docs", "tests", "tools", "examples", "profiles", "LICENSES", "specs", "shared")
# A repository path: starts at a top-level folder of this repository, or is a top-level NAME.md; not
# part of a URL or of a longer path (``github.com/x/docs/build.md`` is someone else's file).
_PATH = (
    r"(?<![\w/.:@-])(?:\.\./)*(?:(?:" + "|".join(TOP_DIRS) + r")/[\w.*/-]*[\w*]"
    r"|[A-Z][A-Z_-]+\.md)"
)
PATH_RE = re.compile(_PATH)
DOC_RE = re.compile(r"(?<![\w/.:@-])(?:\.\./)*(?:(?:docs|specs|shared)/[\w.*/-]*[\w*]|[A-Z][A-Z_-]+\.md)")
SEE_RE = re.compile(r"#.*?\b[Ss]ee\s+`?((?:\.\./)*[\w.-]+/[\w.*/-]*[\w*]|[\w.-]+\.md)")
MD_LINK_RE = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# Paths that name another project's file (or a user's), cited as such: path -> whose file it is.
NOT_OURS = {
    "docs/operators.md": "onnx/onnx-tensorrt",
    "docs/Changelog.md": "onnx/onnx-tensorrt",
    "docs/build.md": "ggml-org/llama.cpp",
    "docs/gen-ai/gen-ai-metrics.md": "open-telemetry/semantic-conventions",
    "docs/http/http-spans.md": "open-telemetry/semantic-conventions",
    "docs/relink.md": "the shipping project's own notes, in an example waiver",
    "docs/index.md": "an example path a waiver pattern is matched against",
    "MODEL_CARD.md": "a model card file name looked for in model directories",
    "profiles/my-device.yaml": "the user's file written by `edgesdk profiles detect --write`",
}
SKIP_FILES = {"tests/test_docs_links.py"}  # its examples are citations on purpose
# Not scanned: test corpora, recorded benchmark output, build and cache folders (and any hidden folder).
SKIP_DIRS = {"tests/data", "tools/bench/results", "__pycache__", "build", "out", "dist", "edgesdk.egg-info"}
CODE_SUFFIXES = {".py", ".sh", ".toml", ".cfg", ".yaml", ".yml"}


def _walk() -> list[Path]:
    out = []
    for folder, dirs, names in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".") and f"{rel}/{d}".lstrip("./") not in SKIP_DIRS and d not in SKIP_DIRS
        )
        out += [
            Path(folder) / n for n in sorted(names) if (Path(folder) / n).relative_to(ROOT).as_posix() not in SKIP_FILES
        ]
    return out


FILES = _walk()


def _exists(cited: str, where: Path) -> bool:
    """``cited`` names a file or folder of this repository (globs must match at least one)."""
    cited = cited.rstrip("/")
    bases = [where.parent] if cited.startswith("../") or "/" not in cited else []
    bases += [ROOT, ROOT / "docs"]
    for base in bases:
        target = (base / cited).resolve()
        if not target.is_relative_to(ROOT):
            continue
        if "*" in cited:
            if list(base.glob(cited)):
                return True
        elif target.exists():
            return True
    return False


def _missing(citations: list[tuple[Path, int, str]]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{line}: {cited}"
        for p, line, cited in citations
        if cited not in NOT_OURS and not _exists(cited, p)
    ]


def _scan(path: Path, regex: re.Pattern[str], *, group: int = 0) -> list[tuple[Path, int, str]]:
    found = []
    for n, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        found += [(path, n, m.group(group)) for m in regex.finditer(text)]
    return found


def _docs() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_docs_cite_existing_repository_files():
    cited: list[tuple[Path, int, str]] = []
    for doc in _docs():
        cited += _scan(doc, PATH_RE)
        cited += [
            (p, n, link)
            for p, n, link in _scan(doc, MD_LINK_RE, group=1)
            if "://" not in link and not link.startswith("mailto:")
        ]
    assert cited, "no citations found: the scanner is broken"
    missing = _missing(cited)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def _sources(node, out: list[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("source", "sources") or key.endswith("_md") or key.startswith("facts"):
                out += (
                    [value]
                    if isinstance(value, str)
                    else [v for v in value if isinstance(v, str)]
                    if isinstance(value, list)
                    else []
                )
            _sources(value, out)
    elif isinstance(node, list):
        for item in node:
            _sources(item, out)


def _data_yaml() -> list[Path]:
    return sorted((ROOT / "profiles").glob("*.yaml")) + sorted((ROOT / "edgesdk" / "data").rglob("*.yaml"))


def test_profile_and_data_sources_cite_existing_files():
    cited: list[tuple[Path, int, str]] = []
    for path in _data_yaml():
        texts: list[str] = []
        _sources(yaml.safe_load(path.read_text(encoding="utf-8")), texts)
        cited += [(path, 0, m.group(0)) for t in texts for m in PATH_RE.finditer(t)]
    missing = _missing(cited)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_code_comments_cite_existing_files():
    cited: list[tuple[Path, int, str]] = []
    for path in FILES:
        if path.suffix in CODE_SUFFIXES or path.name == "Makefile":
            cited += _scan(path, DOC_RE) + _scan(path, SEE_RE, group=1)
    missing = _missing(cited)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "text, ok",
    [
        ("see docs/versions.md", True),
        ("(FACTS.md: measured)", False),
        ("specs/devices.md", False),
        ("../shared/FACTS.md", False),
        ("https://github.com/ggml-org/llama.cpp/blob/master/docs/build.md", True),
        ("edgesdk/data/capability/*.yaml", True),
        ("edgesdk/data/nothing/*.yaml", False),
    ],
)
def test_the_checker_itself(text, ok):
    found = [(ROOT / "README.md", 1, m.group(0)) for m in PATH_RE.finditer(text)]
    assert (_missing(found) == []) is ok
