# SPDX-License-Identifier: Apache-2.0
"""SCANOSS: Winnowing fingerprints of the code files (offline, always when scanoss is installed)
and, when an API is configured (``--scanoss-url`` / ``SCANOSS_SCAN_URL``, ``SCANOSS_API_KEY``),
matches against it. A configured API that cannot be reached, answers with an error, or answers
without a result for every file raises :class:`ExternalToolError`: the gate fails closed
(pitfall 9; scanoss's own ``folder-scan`` exits 0 in that case), and so does an answer that is
not JSON, not HTTP 200, malformed (values of the wrong type), or not complete within the timeout
(``--scanoss-timeout``, default 30 s). Nothing is written to the working directory. Weight files are
never fingerprinted (they are hashed by the tree scan).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
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
        return {
            "available": self.available,
            "fingerprinted_files": self.fingerprinted,
            "wfp_sha256": self.wfp_sha256,
            "api_url": self.api_url,
            "matched_files": self.matched_files,
            "note": self.note,
        }


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


def _batches(blocks: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    size = 0
    for rel, wfp in blocks:
        if batch and size + len(wfp) > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append((rel, wfp))
        size += len(wfp)
    if batch:
        yield batch


DEFAULT_TIMEOUT_S = 30.0  # --scanoss-timeout / EDGESDK_SCANOSS_TIMEOUT: the whole answer, per request
_MAX_ANSWER_BYTES = 64 << 20  # an answer larger than this is not a scan result
_FAIL_CLOSED = "the license gate fails closed when a configured scanner fails"


def configured_timeout(explicit: float | None) -> float:
    """Seconds one SCANOSS request may take in all (explicit, else EDGESDK_SCANOSS_TIMEOUT, else 30)."""
    raw = explicit if explicit is not None else os.environ.get("EDGESDK_SCANOSS_TIMEOUT")
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        from edgesdk.errors import InputError

        raise InputError(f"SCANOSS timeout {raw!r} is not a positive number of seconds")
    return value


def _scan_endpoint(url: str) -> str:
    """``BASE/scan/direct`` for a URL (any path is replaced, as scanoss-py's ScanossApi does)."""
    from urllib.parse import urlparse

    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        from edgesdk.errors import InputError

        raise InputError(f"SCANOSS API URL {url!r} is not an http(s) URL")
    return f"{parsed.scheme}://{parsed.netloc}/scan/direct"  # as scanoss-py: the base URL + the endpoint


def _post(endpoint: str, wfp: str, api_key: str | None, timeout: float) -> bytes:
    """POST one fingerprint batch; the body of a 200 answer, else ExternalToolError.

    Our own request (``requests``, scanoss-py's HTTP library, honours HTTP(S)_PROXY and
    REQUESTS_CA_BUNDLE) instead of ``ScanossApi.scan``: that one retries with sleeps, never times
    out below 5 s, returns ``None`` for a non-JSON answer and writes ``bad_request-*.txt`` /
    ``bad_json-*.txt`` (the fingerprints of the scanned code) into the current directory.
    """
    import uuid

    import requests
    from urllib3.exceptions import HTTPError as Urllib3Error
    from urllib3.exceptions import ReadTimeoutError

    deadline = time.monotonic() + timeout
    headers = {"User-Agent": "edgesdk-license-gate", "x-request-id": str(uuid.uuid4())}
    if api_key:
        headers["X-Session"] = headers["x-api-key"] = api_key
    too_slow = ExternalToolError(
        f"SCANOSS API {endpoint} did not answer within {timeout:g} s (--scanoss-timeout)", hint=_FAIL_CLOSED
    )
    try:
        with requests.post(
            endpoint,
            files={"file": (headers["x-request-id"] + ".wfp", wfp)},
            data={"format": "plain"},
            headers=headers,
            timeout=(timeout, timeout),
            stream=True,
        ) as resp:
            status, ctype = resp.status_code, resp.headers.get("Content-Type", "")
            raw = resp.raw
            # read1 returns what one receive brings (urllib3 2), so the deadline is checked while
            # a slow server trickles bytes; each receive waits at most `timeout`.
            read = getattr(raw, "read1", None) or raw.read
            body = bytearray()
            while chunk := read(1 << 16, decode_content=True):
                body += chunk
                if len(body) > _MAX_ANSWER_BYTES:
                    raise ExternalToolError(
                        f"SCANOSS API {endpoint} answered more than {_MAX_ANSWER_BYTES >> 20} MB", hint=_FAIL_CLOSED
                    )
                if time.monotonic() > deadline:
                    raise too_slow
    except (requests.Timeout, ReadTimeoutError) as exc:
        raise too_slow from exc
    except (requests.RequestException, Urllib3Error, OSError) as exc:
        raise ExternalToolError(
            f"SCANOSS API {endpoint} failed: {type(exc).__name__}: {_short(exc)}", hint=_FAIL_CLOSED
        ) from exc
    if time.monotonic() > deadline:
        raise too_slow
    if status != 200:
        snippet = _short(Exception(bytes(body[:200]).decode("utf-8", "replace"))) or "(empty body)"
        raise ExternalToolError(f"SCANOSS API {endpoint} answered HTTP {status}: {snippet[:120]}", hint=_FAIL_CLOSED)
    if "json" not in ctype.lower() and not bytes(body[:1]).strip().startswith((b"{", b"[")):
        raise ExternalToolError(
            f"SCANOSS API {endpoint} answered {ctype or 'no content type'}, not JSON", hint=_FAIL_CLOSED
        )
    return bytes(body)


def _check_answer(answer, batch: list[tuple[str, str]], url: str) -> dict:
    """The answer must be {file: [match, ...]} for every posted file, each match typed as the API
    documents; anything else is an error, never a pass."""

    def bad(what: str) -> ExternalToolError:
        return ExternalToolError(f"SCANOSS API {url} returned a malformed answer: {what}", hint=_FAIL_CLOSED)

    if not isinstance(answer, dict):
        raise bad(f"top level is {type(answer).__name__}, expected an object of files")
    missing = [rel for rel, _ in batch if rel not in answer]
    if missing:
        raise ExternalToolError(
            f"SCANOSS API {url} returned no result for {len(missing)} of {len(batch)} files (first: {missing[0]})",
            hint=_FAIL_CLOSED,
        )
    for rel, matches in answer.items():
        if not isinstance(matches, list):
            raise bad(f"{rel}: {type(matches).__name__} where a list of matches belongs")
        for m in matches:
            if not isinstance(m, dict):
                raise bad(f"{rel}: a match is {type(m).__name__}, expected an object")
            mid = m.get("id")
            if not isinstance(mid, str) or not mid:
                raise bad(f"{rel}: match id {mid!r} is not a string")
            if mid == "none":
                continue
            for key in ("component", "version", "matched"):
                if key in m and not isinstance(m[key], (str, type(None))):
                    raise bad(f"{rel}: {key} is {type(m[key]).__name__}, expected a string")
            purl = m.get("purl", [])
            if not isinstance(purl, list) or not all(isinstance(p, str) for p in purl):
                raise bad(f"{rel}: purl is not a list of strings")
            lics = m.get("licenses", [])
            if not isinstance(lics, list):
                raise bad(f"{rel}: licenses is {type(lics).__name__}, expected a list")
            for lic in lics:
                if not isinstance(lic, dict) or not isinstance(lic.get("name"), str):
                    raise bad(f"{rel}: a license entry is not an object with a string name")
    return answer


def match(blocks: list[tuple[str, str]], url: str, api_key: str | None, timeout: float | None = None) -> dict:
    from edgesdk.extras import require

    # requests: scanoss-py's HTTP library, installed with it.
    require("build", ("scanoss", "requests"), "a configured SCANOSS API")
    timeout = configured_timeout(timeout)
    endpoint = _scan_endpoint(url)
    api_key = api_key or os.environ.get("SCANOSS_API_KEY")
    results: dict = {}
    for batch in _batches(blocks):
        body = _post(endpoint, "".join(w for _, w in batch), api_key, timeout)
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ExternalToolError(
                f"SCANOSS API {url} returned no usable JSON ({type(exc).__name__})", hint=_FAIL_CLOSED
            ) from exc
        results.update(_check_answer(answer, batch, url))
    return results


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text.removeprefix("ERROR: ")[:200]


def findings_from_results(results: dict) -> list[LicenseFinding]:
    out = []
    for rel, matches in sorted(results.items()):
        for m in matches:
            if m.get("id") in (None, "none"):
                continue
            names = list(dict.fromkeys(lic["name"] for lic in m.get("licenses", []) if lic["name"]))
            norms = [normalize(n) for n in names]
            exprs = list(dict.fromkeys(n.expression for n in norms if n.expression))
            # Several sources (declared, file header, license file) can disagree: all apply.
            expr = " AND ".join(f"({e})" if " " in e else e for e in exprs) or None
            purl = (m.get("purl") or [""])[0]
            found = (
                f"{m.get('component') or '?'}@{m.get('version') or '?'} {m.get('id')} match {m.get('matched') or ''}"
            )
            out.append(
                LicenseFinding(
                    "scanoss",
                    rel,
                    found.strip(),
                    f"SCANOSS API match {purl}".strip(),
                    expr,
                    "licenses: " + ", ".join(names) if names else "match declares no license",
                    [rel],
                )
            )
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


def run_scanoss(
    root: Path,
    code_files: list[str],
    url: str | None,
    api_key: str | None = None,
    weight_files: Sequence[str] = (),
    timeout: float | None = None,
) -> ScanossResult:
    blocks, available = fingerprint(root, code_files)
    result = ScanossResult(available=available, fingerprinted=len(blocks), api_url=url)
    if blocks:
        result.wfp_sha256 = hashlib.sha256("".join(w for _, w in blocks).encode()).hexdigest()
    if not available:
        result.note = "scanoss not installed: no fingerprints (pip install 'edgesdk[build]')"
        if url:
            match([], url, api_key, timeout)  # raises the clear "not installed" error: fail closed
        return result
    if not url:
        result.note = "fingerprints computed offline; no SCANOSS API configured, so no snippet matching"
        return result
    blocks += _whole_file_blocks(root, list(weight_files))
    if not blocks:
        result.note = "no files to match"
        return result
    results = match(blocks, url, api_key, timeout)
    result.findings = findings_from_results(results)
    result.matched_files = len({f.subject for f in result.findings})
    result.note = f"matched against {url}"
    return result
