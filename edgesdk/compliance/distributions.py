# SPDX-License-Identifier: Apache-2.0
"""Licenses of the Python distributions a bundle's runtime needs (``importlib.metadata``).

The closure follows ``Requires-Dist`` with environment markers evaluated for this interpreter
(and the extras a parent asked for). Per distribution, the first source that names a license
wins: PEP 639 ``License-Expression``, then ``License`` (an id, a name, or a whole text), then
Trove classifiers, then the text of the distribution's license files.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

from edgesdk.compliance.findings import LicenseFinding
from edgesdk.compliance.spdx import Normalized, from_classifiers, identify_text, normalize

_LICENSE_FILE = re.compile(r"(^|/)(LICEN[CS]E|COPYING|NOTICE)[^/]*$", re.I)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# Builds of ONNX Runtime that install the same `onnxruntime` module. A bundle records the one on the
# build host (onnxruntime-gpu on a CUDA workstation); the device may run it on another (plain
# onnxruntime on a CPU host, NVIDIA's onnxruntime-gpu on a Jetson): the one installed here is the
# one whose license applies.
ONNXRUNTIME_FLAVOURS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
)


def _installed_equivalent(name: str) -> md.Distribution | None:
    if canonical(name) not in ONNXRUNTIME_FLAVOURS:
        return None
    for flavour in ONNXRUNTIME_FLAVOURS:
        try:
            return md.distribution(flavour)
        except md.PackageNotFoundError:
            continue
    return None


def _license_files(dist: md.Distribution) -> list:
    declared = dist.metadata.get_all("License-File") or []
    out = []
    for f in dist.files or []:
        posix = f.as_posix()
        if ".dist-info/" in posix or ".egg-info/" in posix:
            if _LICENSE_FILE.search(posix) or any(posix.endswith("/" + d) for d in declared):
                out.append(f)
    return out


def _meta_field(meta: md.PackageMetadata, name: str) -> str | None:
    """The first value of a METADATA field, None when absent (``PackageMetadata.get``: typed from 3.12)."""
    values = meta.get_all(name)
    return values[0] if values else None


def distribution_license(dist: md.Distribution) -> tuple[str, str, Normalized]:
    """(as found, where found, normalised) for one installed distribution."""
    meta = dist.metadata
    expression = _meta_field(meta, "License-Expression")
    if expression:
        return expression, "METADATA License-Expression", normalize(expression)
    field = (_meta_field(meta, "License") or "").strip()
    if field and field.upper() not in ("UNKNOWN", "NONE"):
        norm = normalize(field)
        if norm.expression and not norm.made_up:
            return field, "METADATA License", norm
    classifiers = meta.get_all("Classifier") or []
    norm = from_classifiers(classifiers)
    if norm.expression:
        return "; ".join(c for c in classifiers if c.startswith("License ::")), "Trove classifiers", norm
    texts = []
    for f in _license_files(dist):
        try:
            text = Path(str(dist.locate_file(f))).read_text(encoding="utf-8", errors="replace")
            texts.append((f.as_posix(), text))
        except (OSError, UnicodeError):
            continue
    ids = []
    for _name, text in texts:
        found = identify_text(text)
        if found.expression:
            ids.append(found.expression)
    if ids:
        uniq = list(dict.fromkeys(ids))
        src = "license file text: " + ", ".join(n.rsplit("/", 1)[-1] for n, _ in texts)
        return (
            field or "; ".join(c for c in classifiers if c.startswith("License ::")),
            src,
            Normalized(
                " AND ".join(f"({i})" if " " in i else i for i in uniq), "recognised from the license file text"
            ),
        )
    if field and field.upper() not in ("UNKNOWN", "NONE"):
        return field, "METADATA License", normalize(field)
    return "", "METADATA (no license field, classifier or license file)", Normalized(None, "nothing declared")


def _requirements(dist: md.Distribution, extras: set[str]):
    from packaging.requirements import InvalidRequirement, Requirement

    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None:
            yield req
            continue
        envs = [{"extra": e} for e in extras] or [{"extra": ""}]
        if any(req.marker.evaluate(env) for env in envs):
            yield req


def closure(roots: list[str]) -> tuple[list[md.Distribution], list[str]]:
    """(installed distributions reachable from ``roots``, names that are required but missing)."""
    from packaging.requirements import InvalidRequirement, Requirement

    found: dict[str, md.Distribution] = {}
    missing: list[str] = []
    queue: list[tuple[str, set[str]]] = []
    for root in roots:
        try:
            req = Requirement(root)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # e.g. onnxruntime-gpu on x86_64 Linux, plain onnxruntime elsewhere
            queue.append((req.name, set(req.extras)))
        except InvalidRequirement:
            queue.append((root, set()))
    seen_extras: dict[str, set[str]] = {}
    while queue:
        name, extras = queue.pop(0)
        key = canonical(name)
        if key in seen_extras and extras <= seen_extras[key]:
            continue
        seen_extras.setdefault(key, set()).update(extras)
        dist: md.Distribution | None
        try:
            dist = found.get(key) or md.distribution(name)
        except md.PackageNotFoundError:
            dist = _installed_equivalent(name)
            if dist is None:
                if name not in missing:
                    missing.append(name)
                continue
        found[key] = dist
        for req in _requirements(dist, seen_extras[key]):
            queue.append((req.name, set(req.extras)))
    return sorted(found.values(), key=lambda d: canonical(d.metadata["Name"])), missing


def all_installed() -> list[md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in seen:
            seen[canonical(name)] = dist
    return sorted(seen.values(), key=lambda d: canonical(d.metadata["Name"]))


def distribution_findings(roots: list[str], *, environment: bool = False) -> list[LicenseFinding]:
    dists, missing = (all_installed(), []) if environment else closure(roots)
    out = []
    for dist in dists:
        found, source, norm = distribution_license(dist)
        subject = f"{dist.metadata['Name']}=={dist.version}"
        out.append(LicenseFinding("distribution", subject, found.strip()[:200], source, norm.expression, norm.note))
    for name in missing:
        out.append(
            LicenseFinding(
                "distribution",
                name,
                "",
                "not installed in this environment",
                None,
                "required by the runtime but not installed: its license cannot be read",
            )
        )
    return out
