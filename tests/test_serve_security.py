# SPDX-License-Identifier: Apache-2.0
"""`edgesdk serve` is a network service a web page must not be able to drive (issue 25, finding 3): bodies
only as application/json (a cross-origin text/plain or form POST needs no CORS preflight), a Host allow-list
(DNS rebinding), CORS answered only for configured origins, and an empty API key refused.

Real servers on 127.0.0.1 (a MiniLM bundle: the checks do not depend on the model), raw sockets where a
client library would fix the request up. docs/security.md, "The server", describes the threat model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
from test_serve import ServerProcess, free_port  # noqa: E402

pytestmark = pytest.mark.slow

EMBED = {"model": "minilm", "input": "hello"}
APP = "https://app.example.com"
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def minilm_bundle(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


@pytest.fixture(scope="module")
def server(minilm_bundle, tmp_path_factory):
    """The defaults: no API key, loopback, no --allowed-host, no --cors-origin."""
    srv = ServerProcess([minilm_bundle, "--name", "minilm"], tmp_path_factory.mktemp("serve-default"))
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def configured(minilm_bundle, tmp_path_factory):
    """An API key, one more host name and one CORS origin."""
    srv = ServerProcess(
        [
            minilm_bundle,
            "--name",
            "minilm",
            "--api-key",
            "s3cret",
            "--allowed-host",
            "minilm.lan",
            "--cors-origin",
            APP,
        ],
        tmp_path_factory.mktemp("serve-configured"),
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is; the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


# ------------------------------------------------------------------------------ Content-Type
@pytest.mark.parametrize(
    "ctype",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
def test_body_that_is_not_declared_json_is_refused(server, ctype):
    # What a cross-origin page can send without a CORS preflight (fetch/form with a "simple" type), or none.
    headers = {"Content-Type": ctype} if ctype else {}
    r = httpx.post(server.url + "/v1/embeddings", content=json.dumps(EMBED), headers=headers, timeout=60)
    assert r.status_code == 415, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_json_body_is_served(server, ctype):
    r = httpx.post(
        server.url + "/v1/embeddings", content=json.dumps(EMBED), headers={"Content-Type": ctype}, timeout=60
    )
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384


# ------------------------------------------------------------------------------ Host
@pytest.mark.parametrize(
    "host", ["evil.example", "attacker.example:{port}", "127.0.0.1.nip.io", "localhost.evil.example"]
)
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/embeddings")])
def test_foreign_host_name_is_refused(server, host, method, path):
    # A DNS-rebinding page talks to 127.0.0.1 under its own name: the Host header gives it away.
    r = httpx.request(
        method,
        server.url + path,
        json=EMBED if method == "POST" else None,
        timeout=60,
        headers={"Host": host.format(port=server.port)},
    )
    assert r.status_code == 421, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert err["code"] == "host_not_allowed" and "--allowed-host" in err["message"]


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{port}",
        "localhost:{port}",
        "LOCALHOST",
        "localhost.",
        "[::1]:{port}",
        "app.localhost:{port}",
        "10.1.2.3:{port}",
    ],
)
def test_loopback_names_and_addresses_are_served(server, host):
    r = httpx.get(server.url + "/v1/models", headers={"Host": host.format(port=server.port)}, timeout=30)
    assert r.status_code == 200, (host, r.text[:200])


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET /v1/models HTTP/1.0\r\n\r\n",
        b"GET /v1/models HTTP/1.0\r\nHost: a b\r\n\r\n",
        b"GET /v1/models HTTP/1.0\r\nHost: localhost:x\r\n\r\n",
        b"GET /v1/models HTTP/1.0\r\nHost: :8080\r\n\r\n",
    ],
)  # empty name
def test_missing_or_malformed_host_is_400(server, request_line):
    status, body = _raw(server.port, request_line)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_host"


def test_allowed_host_adds_a_name(configured):
    auth = {"Authorization": "Bearer s3cret"}
    for host in (f"minilm.lan:{configured.port}", "MINILM.LAN."):
        assert httpx.get(configured.url + "/v1/models", headers={**auth, "Host": host}).status_code == 200
    r = httpx.get(configured.url + "/v1/models", headers={**auth, "Host": "other.lan"})
    assert r.status_code == 421
    # The host check comes before the API key: a foreign name learns nothing, not even that a key is needed.
    assert httpx.get(configured.url + "/v1/models", headers={"Host": "other.lan"}).status_code == 421


# ------------------------------------------------------------------------------ CORS
def _preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(
        url + "/v1/embeddings",
        timeout=30,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


def test_no_cors_answer_by_default(server):
    r = _preflight(server.url, EVIL)
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": EVIL})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the page cannot read it


def test_cors_answers_only_the_configured_origin(configured):
    r = _preflight(configured.url, APP)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {
        h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")
    }
    r = httpx.post(
        configured.url + "/v1/embeddings",
        json=EMBED,
        timeout=60,
        headers={"Origin": APP, "Authorization": "Bearer s3cret"},
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    r = httpx.post(configured.url + "/v1/embeddings", json=EMBED, timeout=60, headers={"Origin": APP})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == APP  # the page can read why
    r = _preflight(configured.url, EVIL)
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(configured.url + "/v1/models", headers={"Origin": EVIL, "Authorization": "Bearer s3cret"})
    assert "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------------------ options refused at start
def _start(args: list, env: dict | None = None) -> subprocess.CompletedProcess:
    """``edgesdk serve ARGS``; a server that starts instead of refusing is stopped and reported."""
    cmd = [sys.executable, "-m", "edgesdk", "serve", *map(str, args), "--port", str(free_port())]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"`edgesdk serve {' '.join(map(str, args))}` started serving instead of refusing:\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize(
    "args,env,says",
    [
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--api-key", "  "], {}, "--api-key is empty"),
        ([], {"EDGESDK_API_KEY": ""}, "EDGESDK_API_KEY is set but empty"),
        (["--cors-origin", "app.example.com"], {}, "--cors-origin 'app.example.com' is not an origin"),
        (["--allowed-host", "http://minilm.lan/"], {}, "--allowed-host 'http://minilm.lan/' is not a host name"),
    ],
)
def test_option_that_would_open_the_server_is_refused(minilm_bundle, args, env, says):
    t0 = time.monotonic()
    proc = _start([minilm_bundle, "--name", "minilm", *args], env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - t0 < 60
