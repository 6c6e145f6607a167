# SPDX-License-Identifier: Apache-2.0
"""Real registries with authentication for the distribution tests: Debian's ``docker-registry`` (CNCF distribution
2.8) with an htpasswd file (HTTP basic auth, bcrypt entries from ``htpasswd -B``), and with token auth, whose
token service is :class:`TokenService` below: the distribution spec's token endpoint (``GET realm?service=&scope=``
with basic credentials -> ``{"token": JWT}``), issuing ES256 JWTs the registry itself verifies against the
certificate its ``rootcertbundle`` names (``x5c`` header). The registry is real; only the token issuer is the
test's, as it would be Harbor's, GHCR's or Docker Hub's elsewhere.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HTPASSWD = shutil.which("htpasswd")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def htpasswd_line(user: str, password: str) -> str | None:
    """A bcrypt htpasswd entry (the only kind distribution 2.8 accepts): apache2-utils' ``htpasswd -B``, else the
    ``bcrypt`` module; None when neither is here."""
    if HTPASSWD:
        out = subprocess.run([HTPASSWD, "-Bbn", user, password], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    try:
        import bcrypt  # type: ignore[import-not-found]
    except ImportError:
        return None
    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}"


class TokenService:
    """A token endpoint for one user: grants the scope asked for to ``user``/``password``, nothing to anyone else."""

    def __init__(self, root: Path, user: str, password: str, service: str = "edgesdk-test") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.user, self.password, self.service, self.issuer = user, password, service, "edgesdk-test-issuer"
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgesdk test token issuer")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = root / "token-cert.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")
        self.requests: list[dict[str, str]] = []
        service_ref = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                auth = self.headers.get("Authorization", "")
                service_ref.requests.append({**query, "auth": auth.split(" ")[0]})
                granted = False
                if auth.startswith("Basic "):
                    user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                    if (user, password) != (service_ref.user, service_ref.password):
                        self.send_response(401)
                        self.end_headers()
                        return
                    granted = True
                body = json.dumps({"token": service_ref.token(query.get("scope", ""), granted)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.realm = f"http://127.0.0.1:{self.port}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, scope: str, granted: bool) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        for item in scope.split(" ") if granted and scope else []:
            kind, name, actions = item.split(":")  # repository:NS/NAME:pull,push
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": self.user if granted else "", "aud": self.service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}  # fmt: skip
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self.x5c]}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def auth_config(self) -> str:
        return (
            f"auth:\n  token:\n    realm: {self.realm}\n    service: {self.service}\n    issuer: {self.issuer}\n"
            f"    rootcertbundle: {self.cert_path}\n"
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
