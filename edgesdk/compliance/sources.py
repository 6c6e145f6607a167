# SPDX-License-Identifier: Apache-2.0
"""Scan a directory tree (a bundle or a source tree) for license declarations.

Per file, coverage follows REUSE: a ``REUSE.toml`` annotation with ``precedence = "override"``,
else the file's own ``SPDX-License-Identifier`` header or ``.license`` sidecar, else a
``REUSE.toml`` annotation, else the nearest LICENSE/COPYING file in an enclosing directory
(pitfall 5: a license that only lives in a LICENSE file), else the tree's fallback (the
project's declared license, or the model's license for model payload in a bundle). Weight
files are hashed, never read for text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.compliance.findings import LicenseFinding
from edgesdk.compliance.reuse import annotation_for, header_expression, list_files, load_reuse_toml
from edgesdk.compliance.spdx import identify_text, normalize
from edgesdk.errors import InputError

# LICENSE, COPYING.txt, LICENSE-MIT, LICENSE.APACHE2, COPYING.LESSER; not "license-list.md" (pitfall 7).
LICENSE_FILE = re.compile(r"^(?i:LICEN[CS]E|COPYING)(?:[-._][A-Z0-9][A-Z0-9.+-]*)?(?i:\.(?:txt|md|rst))?$")
WEIGHT_SUFFIXES = {
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".onnx",
    ".engine",
    ".plan",
    ".trt",
    ".npz",
    ".npy",
    ".h5",
    ".tflite",
    ".ckpt",
    ".onnx_data",
    ".data",
    ".pb",
    ".mlmodel",
}
CODE_SUFFIXES = {
    ".py",
    ".pyx",
    ".pxd",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".cu",
    ".cuh",
    ".js",
    ".mjs",
    ".ts",
    ".sh",
    ".bash",
    ".go",
    ".rs",
    ".java",
    ".kt",
    ".rb",
    ".pl",
    ".lua",
    ".swift",
    ".cs",
    ".cmake",
    ".m",
    ".mm",
    ".scala",
    ".php",
    ".r",
    ".jl",
}
_CHUNK = 1 << 20


@dataclass
class TreeScan:
    root: Path
    findings: list[LicenseFinding] = field(default_factory=list)
    # Files with no license information of their own (a REUSE gap), and what covers them instead.
    without_own_info: dict[str, str] = field(default_factory=dict)
    code_files: list[str] = field(default_factory=list)  # candidates for scanoss fingerprints
    weights: list[dict] = field(default_factory=list)  # {path, sha256, bytes}
    model_files: list[str] = field(default_factory=list)  # .onnx/.gguf to read metadata from
    cards: list[str] = field(default_factory=list)  # README.md files with a license front matter
    vendored: list[dict] = field(default_factory=list)  # {path, spdx, license_file}
    scanoss_settings: list[str] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _is_model_card(path: Path) -> bool:
    if path.name.lower() not in ("readme.md", "model_card.md"):
        return False
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        return False
    return head.startswith("---") and re.search(r"^license(_name)?\s*:", head, re.M) is not None


def scan_tree(
    root: Path,
    *,
    fallback: tuple[str | None, str] | None,
    skip: AbstractSet[str] = frozenset(),
    payload_is_model: bool = False,
    only: list[str] | None = None,
) -> TreeScan:
    """Walk ``root``. ``fallback`` = (expression, where it was declared) for files no header,
    sidecar, annotation or LICENSE file covers. ``payload_is_model``: in a bundle, non-code files
    without their own declaration are the model's payload and covered by the model's license."""
    root = Path(root)
    scan = TreeScan(root)
    annotations = load_reuse_toml(root)
    listed = only if only is not None else list_files(root, use_git=not payload_is_model)
    files = [f for f in listed if f not in skip]
    present = set(files)
    dir_license: dict[str, tuple[str, str | None]] = {}  # dir -> (license file, expression)
    groups: dict[tuple, LicenseFinding] = {}
    pending: list[str] = []

    def group(layer, subject_dir, found, source, expr, note, rel):
        key = (layer, subject_dir, expr, source)
        if key not in groups:
            groups[key] = LicenseFinding(layer, subject_dir or ".", found, source, expr, note, [])
        groups[key].files.append(rel)

    for rel in files:
        path = root / rel
        name = path.name
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        ann = annotation_for(rel, annotations)
        if (
            name == "REUSE.toml"
            or rel.startswith("LICENSES/")
            or (name.endswith(".license") and rel[: -len(".license")] in present)
        ):
            continue
        if ann and ann.precedence == "override":
            group(
                "source",
                parent,
                ann.expression,
                f"REUSE.toml annotation #{ann.index} (override)",
                normalize(ann.expression).expression,
                normalize(ann.expression).note,
                rel,
            )
            continue
        if name == "scanoss.json":
            scan.scanoss_settings.append(rel)
        suffix = path.suffix.lower()
        if suffix in WEIGHT_SUFFIXES:
            try:
                scan.weights.append({"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size})
            except OSError as exc:
                raise InputError(f"cannot read {path}: {exc.strerror}") from exc
            if suffix in (".onnx", ".gguf"):
                scan.model_files.append(rel)
        if LICENSE_FILE.match(name):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise InputError(f"cannot read {path}: {exc.strerror}") from exc
            norm = identify_text(text)
            dir_license[parent] = (rel, norm.expression)
            scan.findings.append(
                LicenseFinding(
                    "license-file", rel, _first_line(text), "license file text", norm.expression, norm.note, [rel]
                )
            )
            continue
        if _is_model_card(path):
            scan.cards.append(rel)
        sidecar = root / (rel + ".license")
        own = header_expression(sidecar) if (rel + ".license") in present else None
        where = ".license sidecar" if own else ""
        if not own and suffix not in WEIGHT_SUFFIXES:
            own = header_expression(path)
            where = "SPDX-License-Identifier header" if own else ""
        if own:
            norm = normalize(own)
            group("source", parent, own, where, norm.expression, norm.note, rel)
        elif ann:
            norm = normalize(ann.expression)
            group(
                "source", parent, ann.expression, f"REUSE.toml annotation #{ann.index}", norm.expression, norm.note, rel
            )
        else:
            pending.append(rel)
        if suffix in CODE_SUFFIXES:
            scan.code_files.append(rel)

    root_expr = dir_license.get("", (None, None))[1]
    for lic_dir, (lic_file, expr) in sorted(dir_license.items()):
        if lic_dir and expr != root_expr:
            scan.vendored.append({"path": lic_dir, "spdx": expr, "license_file": lic_file})
    license_findings = {f.subject: f for f in scan.findings if f.layer == "license-file"}
    unlicensed: list[str] = []
    for rel in pending:
        covering = _nearest_license(rel, dir_license)
        suffix = Path(rel).suffix.lower()
        if covering:
            license_findings[covering].files.append(rel)
            scan.without_own_info[rel] = covering
        elif payload_is_model and suffix not in CODE_SUFFIXES:
            scan.without_own_info[rel] = "model license (bundle payload)"
        elif fallback and fallback[0]:
            group(
                "source",
                "(files without a header)",
                fallback[0],
                fallback[1],
                normalize(fallback[0]).expression,
                "files without a header inherit the project's declared license",
                rel,
            )
            scan.without_own_info[rel] = fallback[1]
        else:
            unlicensed.append(rel)
    for rel in unlicensed:
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        group(
            "source", parent, "", "no header, sidecar, REUSE.toml or LICENSE file", None, "no license information", rel
        )
    scan.findings.extend(groups.values())
    for f in scan.findings:
        if f.layer == "source" and len(f.files) == 1:
            f.subject = f.files[0]
    return scan


def _nearest_license(rel: str, dir_license: dict[str, tuple[str, str | None]]) -> str | None:
    parts = rel.split("/")[:-1]
    while True:
        key = "/".join(parts)
        if key in dir_license:
            return dir_license[key][0]
        if not parts:
            return None
        parts.pop()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:120]
    return ""


def scanoss_settings_findings(root: Path, rels: list[str]) -> list[LicenseFinding]:
    """A scanoss.json that removes or replaces components would clear findings client-side with no
    audit trail (pitfall 8). We do not apply it; each such file is a finding a person must clear."""
    out = []
    for rel in rels:
        try:
            data = json.loads((root / rel).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        bom = data.get("bom", {}) if isinstance(data, dict) else {}
        removing = {k: len(bom.get(k) or []) for k in ("remove", "replace") if bom.get(k)}
        if removing:
            desc = ", ".join(f"bom.{k}: {n} entr{'y' if n == 1 else 'ies'}" for k, n in removing.items())
            out.append(
                LicenseFinding(
                    "settings",
                    rel,
                    desc,
                    "scanoss.json",
                    None,
                    "scanoss.json tries to clear scanner findings; not applied",
                    [rel],
                    category="scanner-settings",
                    action="review",
                    reason="scanoss.json bom.remove/bom.replace is not obeyed: clear it with an audited waiver instead",
                )
            )
    return out
