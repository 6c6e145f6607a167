# SPDX-License-Identifier: Apache-2.0
"""A small OCI distribution API client (https://github.com/opencontainers/distribution-spec, v1.1): references,
blobs (monolithic upload, resumable download), manifests and indexes. The standard library's HTTP only, so the
runtime-only install pulls.

Transport: HTTPS, except for a loopback registry (``localhost``, ``127.0.0.0/8``, ``::1``) or with ``insecure``,
which take plain HTTP. A registry (or a token realm, or a redirect) that would move credentials or bytes over
plain HTTP otherwise is refused (:class:`PlainHTTPRefused`, exit 3).

Credentials (asked for only when the registry answers 401): ``EDGESDK_REGISTRY_USER`` /
``EDGESDK_REGISTRY_PASSWORD``, else ``docker login``'s file (``$DOCKER_CONFIG/config.json``, default
``~/.docker/config.json``: the registry's ``auths`` entry, or its credential helper), sent as HTTP basic auth or
exchanged for a bearer token at the ``WWW-Authenticate: Bearer realm=...`` the registry names (the distribution
spec's token flow; anonymous when there are no credentials). ``EDGESDK_REGISTRY_TOKEN``: a bearer token sent
from the first request.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import shutil
import ssl
import subprocess
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
CHUNK = 1 << 20

_REF = re.compile(
    r"^oci://(?P<registry>[A-Za-z0-9.\-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/"
    r"(?P<repo>[a-z0-9]+(?:[._\-/][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._\-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class RegistryError(ExternalToolError):
    """The registry could not be reached or refused a request (exit 10)."""


class PlainHTTPRefused(InputError):
    """Plain HTTP to a registry, token realm or redirect that is not on loopback, without ``--insecure``
    (exit 3)."""


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (brackets allowed)."""
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


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
    def host(self) -> str:
        """The registry's host name or address, without the port."""
        if self.registry.startswith("["):
            return self.registry.split("]")[0] + "]"
        return self.registry.rsplit(":", 1)[0]

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def base(self, insecure: bool = False) -> str:
        scheme = "http" if self.loopback or insecure else "https"
        return f"{scheme}://{self.registry}/v2/{self.repository}"

    def __str__(self) -> str:
        return f"oci://{self.registry}/{self.repository}:{self.tag}" + (f"@{self.digest}" if self.digest else "")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    source: str  # where they came from, for messages (never the secret itself)


def _registry_key(text: str) -> str:
    """A ``docker login`` ``auths`` key as ``host[:port]``: ``https://ghcr.io/v1/`` -> ``ghcr.io``."""
    t = text.strip().lower()
    t = t.split("://", 1)[1] if "://" in t else t
    return t.split("/", 1)[0]


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _helper_credentials(helper: str, registry: str, where: str) -> Credentials | None:
    """``docker-credential-HELPER get`` (the docker credential-helper protocol: server on stdin, JSON out)."""
    exe = shutil.which(f"docker-credential-{helper}")
    if exe is None:
        raise InputError(
            f"{where} names the credential helper {helper!r} for {registry}, but docker-credential-{helper} is not "
            "on PATH (or set EDGESDK_REGISTRY_USER and EDGESDK_REGISTRY_PASSWORD)"
        )
    for server in (registry, f"https://{registry}"):
        proc = subprocess.run([exe, "get"], input=server, capture_output=True, text=True, timeout=30)  # noqa: S603
        if proc.returncode == 0:
            try:
                got = json.loads(proc.stdout)
                return Credentials(str(got["Username"]), str(got["Secret"]), f"docker-credential-{helper}")
            except (ValueError, KeyError, TypeError):
                raise InputError(f"docker-credential-{helper} get gave no Username/Secret for {registry}") from None
    return None


def credentials(registry: str) -> Credentials | None:
    """The credentials for ``registry`` (``host[:port]``): ``EDGESDK_REGISTRY_USER`` / ``_PASSWORD``, else
    ``docker login``'s config file (its ``auths`` entry: ``auth`` = base64 ``user:password``, or ``username`` /
    ``password``; else ``credHelpers`` / ``credsStore``). None when there are none."""
    user, password = os.environ.get("EDGESDK_REGISTRY_USER"), os.environ.get("EDGESDK_REGISTRY_PASSWORD")
    if user is not None or password is not None:
        if not user or password is None:
            raise InputError("set both EDGESDK_REGISTRY_USER and EDGESDK_REGISTRY_PASSWORD (or neither)")
        return Credentials(user, password, "EDGESDK_REGISTRY_USER/EDGESDK_REGISTRY_PASSWORD")
    path = docker_config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"docker config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"docker config {path} is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError(f"docker config {path}: expected a JSON object")
    want = _registry_key(registry)
    auths = doc.get("auths")
    auths = auths if isinstance(auths, dict) else {}
    entry = next((v for k, v in auths.items() if _registry_key(k) == want and isinstance(v, dict)), None)
    where = f"docker config {path}"
    if entry is not None:
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(str(entry["auth"]), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise InputError(f"{where}: auths[{want!r}].auth is not base64 of user:password") from None
            name, sep, secret = decoded.partition(":")
            if not sep or not name:
                raise InputError(f"{where}: auths[{want!r}].auth is not base64 of user:password")
            return Credentials(name, secret, where)
        if entry.get("username") and entry.get("password") is not None:
            return Credentials(str(entry["username"]), str(entry["password"]), where)
    helpers = doc.get("credHelpers")
    helpers = helpers if isinstance(helpers, dict) else {}
    helper = next((v for k, v in helpers.items() if _registry_key(k) == want), None) or doc.get("credsStore")
    if isinstance(helper, str) and helper:
        return _helper_credentials(helper, want, where)
    return None


_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``WWW-Authenticate``: (scheme lower-case, parameters), e.g. ``('bearer', {'realm': ..., 'service': ...})``."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE.findall(rest))


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a registry's redirect (blob storage, a CDN) without carrying its Authorization to another host, and
    never from HTTPS down to plain HTTP off loopback (unless insecure)."""

    def __init__(self, insecure: bool) -> None:
        self.insecure = insecure

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        old, to = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(new.full_url)
        if to.scheme != "https" and not (self.insecure or is_loopback(to.hostname or "")):
            raise PlainHTTPRefused(
                f"the registry redirected {old.path} to plain HTTP ({to.scheme}://{to.netloc}): refused "
                "(plain HTTP only for loopback registries or with --insecure)"
            )
        if to.netloc != old.netloc:
            new.remove_header("Authorization")
        return new


def _plain_http_answer(exc: BaseException) -> bool:
    """An SSL handshake failure that means the server answered in plain HTTP."""
    reason = str(getattr(exc, "reason", "") or exc).upper()
    return isinstance(getattr(exc, "reason", exc), ssl.SSLError) and any(
        r in reason for r in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
    )


class Client:
    """The distribution API of one repository. ``insecure``: plain HTTP to a registry that is not on loopback."""

    def __init__(self, ref: Reference, timeout: float = 120.0, insecure: bool = False) -> None:
        self.ref = ref
        self.timeout = timeout
        self.insecure = insecure
        self.base = ref.base(insecure)
        token = os.environ.get("EDGESDK_REGISTRY_TOKEN")
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._creds: Credentials | None = None
        self._creds_read = False
        self._tokens: dict[str, str] = {}  # bearer token per scope of the challenge
        self._opener = urllib.request.build_opener(_Redirects(insecure))

    def _credentials(self) -> Credentials | None:
        if not self._creds_read:
            self._creds, self._creds_read = credentials(self.ref.registry), True
        return self._creds

    def _need_credentials(self, why: str) -> RegistryError:
        return RegistryError(
            f"registry {self.ref.registry} {why}: run docker login {self.ref.registry}, or set "
            f"EDGESDK_REGISTRY_USER and EDGESDK_REGISTRY_PASSWORD"
        )

    def _answer_challenge(self, header: str, tried: int) -> None:
        """Set ``self._auth`` for the next try from a 401's ``WWW-Authenticate`` (basic, or the token flow)."""
        scheme, params = parse_challenge(header)
        creds = self._credentials()
        if scheme == "basic":
            if creds is None:
                raise self._need_credentials("asks for a user name and password (HTTP basic auth)")
            if tried:
                raise RegistryError(f"registry {self.ref.registry} refused the credentials from {creds.source} (401)")
            pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode("ascii")
            self._auth = {"Authorization": f"Basic {pair}"}
            return
        if scheme != "bearer" or not params.get("realm"):
            raise RegistryError(
                f"registry {self.ref.registry} answered 401 with an authentication scheme edgesdk does not speak: "
                f"{header[:80]!r}"
            )
        scope = params.get("scope", "")
        cached = self._tokens.get(scope)
        if cached and not tried and self._auth.get("Authorization") != f"Bearer {cached}":
            self._auth = {"Authorization": f"Bearer {cached}"}
            return
        if tried > 1:
            raise (
                RegistryError(
                    f"registry {self.ref.registry} refused the token {params['realm']} gave for the credentials from "
                    f"{creds.source} (401)"
                )
                if creds
                else self._need_credentials(f"refused an anonymous token for {scope or 'this request'}")
            )
        self._tokens[scope] = self._fetch_token(params, creds)
        self._auth = {"Authorization": f"Bearer {self._tokens[scope]}"}

    def _fetch_token(self, params: dict[str, str], creds: Credentials | None) -> str:
        """The distribution spec's token flow: GET realm?service=...&scope=... (basic auth with the credentials, or
        anonymous) -> ``{"token": ...}`` (or ``access_token``)."""
        realm = params["realm"]
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RegistryError(f"registry {self.ref.registry}: the token realm {realm!r} is not an http(s) URL")
        if parts.scheme != "https" and not (self.insecure or is_loopback(parts.hostname)):
            raise PlainHTTPRefused(
                f"registry {self.ref.registry} names the plain-HTTP token realm {realm}: refused "
                "(plain HTTP only for loopback or with --insecure)"
            )
        query = {k: params[k] for k in ("service", "scope") if params.get(k)}
        url = realm + (("&" if "?" in realm else "?") + urllib.parse.urlencode(query) if query else "")
        headers = {}
        if creds is not None:
            pair = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {pair}"
        try:
            with self._opener.open(urllib.request.Request(url, headers=headers), timeout=self.timeout) as resp:
                doc = json.loads(resp.read(1 << 20))
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise (
                    RegistryError(
                        f"the token service {parts.netloc} refused the credentials from {creds.source} ({exc.code})"
                    )  # fmt: skip
                    if creds
                    else self._need_credentials(f"gives no anonymous token ({parts.netloc} answered {exc.code})")
                ) from None
            raise RegistryError(f"the token service {parts.netloc} answered {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RegistryError(
                f"the token service {parts.netloc} is not reachable: {getattr(exc, 'reason', exc)}"
            ) from None
        except ValueError:
            raise RegistryError(f"the token service {parts.netloc} answered something that is not JSON") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"the token service {parts.netloc} answered without a token")
        return token

    def _open(
        self,
        method: str,
        url: str,
        data: bytes | BinaryIO | None = None,
        headers: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> Any:
        tried = 0
        while True:
            if tried and hasattr(data, "seek"):
                data.seek(0)  # type: ignore[union-attr]
            req = urllib.request.Request(url, data=data, method=method, headers={**self._auth, **(headers or {})})
            try:
                resp = self._opener.open(req, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and 401 not in ok and tried < 3:
                    challenge = exc.headers.get("WWW-Authenticate") or ""
                    exc.close()
                    if not challenge:
                        raise RegistryError(
                            f"registry {self.ref.registry} answered 401 to {method} "
                            f"{urllib.parse.urlsplit(url).path} without saying how to authenticate"
                        ) from None
                    self._answer_challenge(challenge, tried)
                    tried += 1
                    continue
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
                if url.startswith("https:") and _plain_http_answer(exc):
                    raise PlainHTTPRefused(
                        f"registry {self.ref.registry} answers in plain HTTP, not HTTPS: refused (plain HTTP only "
                        "for loopback registries or with --insecure)"
                    ) from None
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"registry {self.ref.registry} is not reachable: {reason}") from None
            if resp.status not in ok:
                resp.close()
                raise RegistryError(f"registry {self.ref.registry} answered {resp.status} to {method} {url}")
            return resp

    # ------------------------------------------------------------------ blobs
    def has_blob(self, digest: str) -> bool:
        resp = self._open("HEAD", f"{self.base}/blobs/{digest}", ok=(200, 404))
        resp.close()
        return bool(resp.status == 200)

    def push_blob(self, digest: str, size: int, source: Path | bytes) -> bool:
        """Upload one blob (monolithic: POST then PUT with the digest); False when the registry has it already."""
        if self.has_blob(digest):
            return False
        resp = self._open("POST", f"{self.base}/blobs/uploads/", data=b"", ok=(202,))
        location = resp.headers.get("Location")
        resp.close()
        if not location:
            raise RegistryError(f"registry {self.ref.registry} gave no upload location")
        url = urllib.parse.urljoin(self.base + "/", location)
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
            resp = self._open("GET", f"{self.base}/blobs/{digest}", headers=headers, ok=(200, 206))
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
            "PUT", f"{self.base}/manifests/{reference}", data=body, headers={"Content-Type": media_type}, ok=(201,)
        ).close()
        return sha256_digest(body)

    def get_manifest(self, reference: str) -> tuple[str, dict[str, Any], str] | None:
        """(media type, document, digest) of a manifest or index; None when the registry has none."""
        resp = self._open(
            "GET",
            f"{self.base}/manifests/{reference}",
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
        resp = self._open("GET", f"{self.base}/referrers/{digest}?{query}", headers={"Accept": OCI_INDEX},
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
