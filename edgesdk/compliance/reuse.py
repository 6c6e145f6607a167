# SPDX-License-Identifier: Apache-2.0
"""REUSE coverage rules: which files to look at, ``SPDX-License-Identifier`` headers,
``.license`` sidecars and ``REUSE.toml`` annotations (https://reuse.software/spec-3.3/)."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import InputError

IGNORED_DIRS = {
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "out",
    "build",
    "dist",
    ".tox",
    ".eggs",
}
_HEADER_LINES = 30
# A header is a comment line; a string literal that merely contains the tag is not (pitfall 7).
_HEADER = re.compile(
    r"^\s*(?:#+|//+|/\*+|\*|--|;+|<!--|%+|\.\.|@REM|REM)?\s*"
    r"SPDX-License-Identifier:\s*(?P<expr>.+?)\s*(?:\*/|-->)?\s*$"
)


@dataclass
class Annotation:
    index: int
    patterns: list[str]
    regexes: list[re.Pattern]
    expression: str
    precedence: str  # closest | aggregate | override

    def matches(self, rel: str) -> bool:
        return any(r.fullmatch(rel) for r in self.regexes)


def _glob_to_regex(pattern: str) -> re.Pattern:
    """REUSE.toml globs: `*` stays inside one directory, `**` crosses directories."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out += re.escape(pattern[i + 1])
            i += 2
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def load_reuse_toml(root: Path) -> list[Annotation]:
    path = root / "REUSE.toml"
    if not path.is_file():
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot parse ({exc})") from exc
    out = []
    for index, ann in enumerate(data.get("annotations", [])):
        patterns = ann.get("path", [])
        patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        expr = ann.get("SPDX-License-Identifier")
        if not patterns or not expr:
            continue
        expr = " AND ".join(expr) if isinstance(expr, list) else str(expr)
        precedence = ann.get("precedence", "closest")
        if precedence not in ("closest", "aggregate", "override"):
            raise InputError(
                f"{path}: annotations[{index}].precedence {precedence!r} is not closest, aggregate or override"
            )
        out.append(Annotation(index, patterns, [_glob_to_regex(p) for p in patterns], expr, precedence))
    return out


def annotation_for(rel: str, annotations: list[Annotation]) -> Annotation | None:
    """The last matching annotation wins (REUSE.toml rule)."""
    hit = None
    for ann in annotations:
        if ann.matches(rel):
            hit = ann
    return hit


def header_expression(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            head = fh.read(8192)
    except OSError:
        return None
    if b"\0" in head:
        return None
    for line in head.decode("utf-8", errors="replace").splitlines()[:_HEADER_LINES]:
        m = _HEADER.match(line)
        if m:
            return m.group("expr").strip()
    return None


def list_files(root: Path, *, use_git: bool = True) -> list[str]:
    """Files under ``root`` as POSIX paths relative to it: git's view (tracked + untracked, not
    ignored) inside a git work tree, else a walk that skips virtualenvs, caches and build output.
    Bundles are always walked: a .gitignore must not hide a weight file from the gate."""
    if not use_git:
        return _walk(root, skip_dirs=False)  # everything in a bundle ships
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if proc.returncode == 0:
            names = [n for n in proc.stdout.decode("utf-8", errors="replace").split("\0") if n]
            files = sorted({n for n in names if (root / n).is_file() and not _ignored(n)})
            if files or not any(root.iterdir()):
                return files
    except (OSError, subprocess.SubprocessError):
        pass
    return _walk(root)


def _walk(root: Path, skip_dirs: bool = True) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if skip_dirs:
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS and not d.endswith(".egg-info"))
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            out.append(rel)
    return sorted(out)


def _ignored(rel: str) -> bool:
    return any(part in IGNORED_DIRS or part.endswith(".egg-info") for part in rel.split("/")[:-1])
