# SPDX-License-Identifier: Apache-2.0
"""A small OCI distribution API client (https://github.com/opencontainers/distribution-spec, v1.1): references,
blobs (monolithic upload, resumable download), manifests and indexes. The standard library's HTTP only, so the
runtime-only install pulls. Plain HTTP only for loopback registries (127.0.0.1, ::1, localhost); anything else
is HTTPS. Credentials: ``EDGESDK_REGISTRY_TOKEN`` (a bearer token) when set.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edgesdk.errors import BundleIntegrityError, ExternalToolError, InputError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(EMPTY_JSON).hexdigest()
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
CHUNK = 1 << 20

_REF = re.compile(
    r"^oci://(?P<registry>[A-Za-z0-9.\-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/"
    r"(?P<repo>[a-z0-9]+(?:[._\-/][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._\-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class RegistryError(ExternalToolError):
    """The registry could not be reached or refused a request (exit 10)."""


@dataclass(frozen=True)
class Reference:
    """``oci://REGISTRY/NAMESPACE/NAME[:TAG][@DIGEST]`` (the tag defaults to ``latest``)."""

    registry: str
    repository: str
    tag: str = "latest"
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        m = _REF.match(text.strip())
        if not m:
            raise InputError(
                f"not an OCI reference: {text!r} (expected oci://REGISTRY/NAMESPACE/NAME:TAG, "
                "lower-case repository, e.g. oci://localhost:5000/models/gemma:orin)"
            )
        return cls(m["registry"], m["repo"], m["tag"] or "latest", m["digest"])

    @property
    def reference(self) -> str:
        """What the manifests endpoint takes: the digest when given, else the tag."""
        return self.digest or self.tag

    @property
    def base(self) -> str:
        host = (
            self.registry.rsplit(":", 1)[0] if not self.registry.startswith("[") else self.registry.split("]")[0] + "]"
        )
        scheme = "http" if host in LOOPBACK else "https"
        return f"{scheme}://{self.registry}/v2/{self.repository}"

    def __str__(self) -> str:
        return f"oci://{self.registry}/{self.repository}:{self.tag}" + (f"@{self.digest}" if self.digest else "")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Client:
    """The distribution API of one repository."""

    def __init__(self, ref: Reference, timeout: float = 120.0) -> None:
        self.ref = ref
        self.timeout = timeout
        token = os.environ.get("EDGESDK_REGISTRY_TOKEN")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def _open(
        self,
        method: str,
        url: str,
        data: bytes | BinaryIO | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> Any:
        req = urllib.request.Request(url, data=data, method=method, headers={**self._auth, **(headers or {})})
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)  # noqa: S310 - http(s) only (Reference)
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return exc
            detail = ""
            try:
                body = json.loads(exc.read() or b"{}")
                detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in body.get("errors", []))
            except (ValueError, AttributeError):
                pass
            raise RegistryError(
                f"registry {self.ref.registry} answered {exc.code} to {method} {urllib.parse.urlsplit(url).path}"
                + (f" ({detail})" if detail else "")
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryError(f"registry {self.ref.registry} is not reachable: {reason}") from None
        if resp.status not in ok:
            resp.close()
            raise RegistryError(f"registry {self.ref.registry} answered {resp.status} to {method} {url}")
        return resp

    # ------------------------------------------------------------------ blobs
    def has_blob(self, digest: str) -> bool:
        resp = self._open("HEAD", f"{self.ref.base}/blobs/{digest}", ok=(200, 404))
        resp.close()
        return bool(resp.status == 200)

    def push_blob(self, digest: str, size: int, source: Path | bytes) -> bool:
        """Upload one blob (monolithic: POST then PUT with the digest); False when the registry has it already."""
        if self.has_blob(digest):
            return False
        resp = self._open("POST", f"{self.ref.base}/blobs/uploads/", data=b"", ok=(202,))
        location = resp.headers.get("Location")
        resp.close()
        if not location:
            raise RegistryError(f"registry {self.ref.registry} gave no upload location")
        url = urllib.parse.urljoin(self.ref.base + "/", location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(source, bytes):
            self._open("PUT", url, data=source, headers=headers, ok=(201,)).close()
        else:
            with open(source, "rb") as fh:
                self._open("PUT", url, data=fh, headers=headers, ok=(201,)).close()
        return True

    def fetch_blob(self, digest: str, size: int, dest: Path) -> None:
        """Download a blob to ``dest``, resuming a ``dest.partial`` left by an interrupted pull, and check its
        digest and size before the rename that makes it visible."""
        part = dest.with_name(dest.name + ".partial")
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have < size:
            headers = {"Range": f"bytes={have}-"} if have else {}
            resp = self._open("GET", f"{self.ref.base}/blobs/{digest}", headers=headers, ok=(200, 206))
            mode = "ab" if resp.status == 206 else "wb"  # a registry that ignores Range sends it all
            with resp, open(part, mode) as out:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
        h = hashlib.sha256()
        with open(part, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        got, got_size = "sha256:" + h.hexdigest(), part.stat().st_size
        if got != digest or got_size != size:
            part.unlink()
            raise BundleIntegrityError(
                f"blob {digest} from {self.ref.registry} arrived as {got} ({got_size} bytes, expected {size}): not used"
            )
        os.replace(part, dest)

    # ------------------------------------------------------------------ manifests
    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        self._open(
            "PUT", f"{self.ref.base}/manifests/{reference}", data=body, headers={"Content-Type": media_type}, ok=(201,)
        ).close()
        return sha256_digest(body)

    def get_manifest(self, reference: str) -> tuple[str, dict[str, Any], str] | None:
        """(media type, document, digest) of a manifest or index; None when the registry has none."""
        resp = self._open(
            "GET",
            f"{self.ref.base}/manifests/{reference}",
            headers={"Accept": f"{OCI_INDEX}, {OCI_MANIFEST}"},
            ok=(200, 404),
        )
        with resp:
            if resp.status == 404:
                return None
            body = resp.read(16 << 20)
        digest = sha256_digest(body)
        if reference.startswith("sha256:") and digest != reference:
            raise BundleIntegrityError(f"manifest {reference} from {self.ref.registry} arrived as {digest}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise RegistryError(f"{self.ref}: the manifest is not JSON") from None
        if not isinstance(doc, dict):
            raise RegistryError(f"{self.ref}: the manifest is not a JSON object")
        return str(doc.get("mediaType") or resp.headers.get("Content-Type", "")), doc, digest

    def referrers(self, digest: str, artifact_type: str) -> list[dict[str, Any]] | None:
        """The descriptors of ``artifact_type`` whose ``subject`` is ``digest`` (OCI 1.1 referrers API); None when
        the registry has no referrers API (CNCF distribution 2.8 answers 404), so the caller falls back to a tag."""
        query = urllib.parse.urlencode({"artifactType": artifact_type})
        resp = self._open("GET", f"{self.ref.base}/referrers/{digest}?{query}", headers={"Accept": OCI_INDEX},
                          ok=(200, 404, 400, 405))  # fmt: skip
        with resp:
            if resp.status != 200:
                return None
            body = resp.read(4 << 20)
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        found = doc.get("manifests") if isinstance(doc, dict) else None
        if not isinstance(found, list):
            return None
        return [m for m in found if isinstance(m, dict) and m.get("artifactType") == artifact_type]
