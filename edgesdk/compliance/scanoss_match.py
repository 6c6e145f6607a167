# SPDX-License-Identifier: Apache-2.0
"""SCANOSS: Winnowing fingerprints of the code files (offline, always when scanoss is installed)
and, when an API is configured (``--scanoss-url`` / ``SCANOSS_SCAN_URL``, ``SCANOSS_API_KEY``),
matches against it. A configured API that cannot be reached, answers with an error, or answers
without a result for every file raises :class:`ExternalToolError`: the gate fails closed
(pitfall 9; scanoss's own ``folder-scan`` exits 0 in that case). Weight files are never
fingerprinted (they are hashed by the tree scan).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.compliance.findings import LicenseFinding
from edgesdk.compliance.spdx import normalize
from edgesdk.errors import ExternalToolError

_MAX_FINGERPRINT_BYTES = 2 << 20  # larger "code" files are generated/minified: hash them instead
_BATCH_BYTES = 64 * 1024


@dataclass
class ScanossResult:
    available: bool = False  # scanoss-py importable
    fingerprinted: int = 0
    wfp_sha256: str | None = None  # digest of all fingerprints: lets an auditor re-run the match
    api_url: str | None = None
    matched_files: int = 0
    findings: list[LicenseFinding] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict:
        return {"available": self.available, "fingerprinted_files": self.fingerprinted,
                "wfp_sha256": self.wfp_sha256, "api_url": self.api_url, "matched_files": self.matched_files,
                "note": self.note}


def configured_url(explicit: str | None) -> str | None:
    """Only an explicit URL or SCANOSS_SCAN_URL enables matching: never the public default."""
    return explicit or os.environ.get("SCANOSS_SCAN_URL") or None


def fingerprint(root: Path, rels: list[str]) -> tuple[list[tuple[str, str]], bool]:
    """[(path, wfp block)] per code file, and whether scanoss-py was available."""
    try:
        from scanoss.winnowing import Winnowing
    except ImportError:
        return [], False
    winnowing = Winnowing(quiet=True)
    blocks = []
    for rel in rels:
        path = root / rel
        try:
            if path.stat().st_size > _MAX_FINGERPRINT_BYTES:
                continue
            contents = path.read_bytes()
        except OSError:
            continue
        wfp = winnowing.wfp_for_contents(rel, False, contents)
        if wfp:
            blocks.append((rel, wfp))
    return blocks, True


def _batches(blocks: list[tuple[str, str]]):
    batch, size = [], 0
    for rel, wfp in blocks:
        if batch and size + len(wfp) > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append((rel, wfp))
        size += len(wfp)
    if batch:
        yield batch


def match(blocks: list[tuple[str, str]], url: str, api_key: str | None, timeout: int = 60) -> dict:
    try:
        from scanoss.scanossapi import ScanossApi
    except ImportError as exc:
        raise ExternalToolError("a SCANOSS API is configured but scanoss is not installed",
                                hint="pip install 'edgesdk[scanoss]'") from exc
    api = ScanossApi(url=url, api_key=api_key or os.environ.get("SCANOSS_API_KEY"), quiet=True, retry=0,
                     timeout=timeout)
    results: dict = {}
    for batch in _batches(blocks):
        noise = io.StringIO()
        try:
            with contextlib.redirect_stderr(noise):
                answer = api.scan("".join(w for _, w in batch))
        except Exception as exc:  # noqa: BLE001 - scanoss raises bare Exception for every failure
            raise ExternalToolError(f"SCANOSS API {url} failed: {_short(exc)}",
                                    hint="the license gate fails closed when a configured scanner fails") from exc
        if not isinstance(answer, dict):
            raise ExternalToolError(f"SCANOSS API {url} returned no usable JSON",
                                    hint="the license gate fails closed when a configured scanner fails")
        missing = [rel for rel, _ in batch if rel not in answer]
        if missing:
            raise ExternalToolError(f"SCANOSS API {url} returned no result for {len(missing)} of "
                                    f"{len(batch)} files (first: {missing[0]})")
        results.update(answer)
    return results


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text.removeprefix("ERROR: ")[:200]


def findings_from_results(results: dict) -> list[LicenseFinding]:
    out = []
    for rel, matches in sorted(results.items()):
        for m in matches if isinstance(matches, list) else []:
            if not isinstance(m, dict) or m.get("id") in (None, "none"):
                continue
            names = list(dict.fromkeys(lic.get("name") for lic in m.get("licenses", []) if lic.get("name")))
            norms = [normalize(n) for n in names]
            exprs = list(dict.fromkeys(n.expression for n in norms if n.expression))
            # Several sources (declared, file header, license file) can disagree: all apply.
            expr = " AND ".join(f"({e})" if " " in e else e for e in exprs) or None
            purl = (m.get("purl") or [""])[0]
            found = f"{m.get('component', '?')}@{m.get('version', '?')} {m.get('id')} match {m.get('matched', '')}"
            out.append(LicenseFinding("scanoss", rel, found.strip(), f"SCANOSS API match {purl}".strip(), expr,
                                      "licenses: " + ", ".join(names) if names else "match declares no license",
                                      [rel]))
    return out


def _whole_file_blocks(root: Path, rels: list[str]) -> list[tuple[str, str]]:
    """File-level (MD5) fingerprints for weights, streamed: a known weight file can match whole."""
    out = []
    for rel in rels:
        h = hashlib.md5(usedforsecurity=False)
        path = root / rel
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        out.append((rel, f"file={h.hexdigest()},{path.stat().st_size},{rel}\n"))
    return out


def run_scanoss(root: Path, code_files: list[str], url: str | None, api_key: str | None = None,
                weight_files: list[str] = ()) -> ScanossResult:
    blocks, available = fingerprint(root, code_files)
    result = ScanossResult(available=available, fingerprinted=len(blocks), api_url=url)
    if blocks:
        result.wfp_sha256 = hashlib.sha256("".join(w for _, w in blocks).encode()).hexdigest()
    if not available:
        result.note = "scanoss not installed: no fingerprints (pip install 'edgesdk[scanoss]')"
        if url:
            match([], url, api_key)  # raises the clear "not installed" error: fail closed
        return result
    if not url:
        result.note = "fingerprints computed offline; no SCANOSS API configured, so no snippet matching"
        return result
    blocks += _whole_file_blocks(root, list(weight_files))
    if not blocks:
        result.note = "no files to match"
        return result
    results = match(blocks, url, api_key)
    result.findings = findings_from_results(results)
    result.matched_files = len({f.subject for f in result.findings})
    result.note = f"matched against {url}"
    return result
