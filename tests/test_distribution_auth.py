# SPDX-License-Identifier: Apache-2.0
"""The registry interface of issue 36 against real registries (Debian's ``docker-registry``, CNCF distribution
2.8) started here, one per way of authenticating:

* HTTP basic auth (htpasswd, bcrypt): credentials from ``docker login``'s file (``~/.docker/config.json`` and
  ``$DOCKER_CONFIG``, the ``auths`` entry's base64 ``auth``) and from ``EDGESDK_REGISTRY_USER`` / ``_PASSWORD``;
  none, or wrong ones: one line, exit 10;
* token auth (``WWW-Authenticate: Bearer realm=...``): the registry verifies the JWTs of tests/registry_auth.py's
  token service; with credentials push and pull work, anonymous gets nothing (exit 10);
* plain HTTP: a registry on a non-loopback address is refused without ``--insecure`` (exit 3), used with it;
* several bundles of one model in one ``push``: one OCI image index; two bundles of one profile, or of two
  models: exit 3 before anything is uploaded.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from registry_auth import TokenService, htpasswd_line
from test_distribution import REGISTRY, Registry  # two_bundles: tests/conftest.py, once per session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REGISTRY is None, reason="no docker-registry binary (make setup installs Debian's)"),
]
USER, PASSWORD = "ci-bot", "s3cret pass:word"


def run(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESDK_REGISTRY_", "DOCKER_CONFIG"))}
    full = {**base, "EDGESDK_HOME": str(home), "HOME": str(home / "user"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True, env=full)


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def docker_config(directory: Path, registry: str, user: str, password: str, key: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (directory / "config.json").write_text(json.dumps({"auths": {key or registry: {"auth": auth}}}))
    return directory


@pytest.fixture(scope="module")
def basic_registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("basic")
    line = htpasswd_line(USER, PASSWORD)
    if line is None:
        pytest.skip("no bcrypt htpasswd: install apache2-utils (make setup does) or the bcrypt module")
    (root / "htpasswd").write_text(line + "\n")
    r = Registry(root, auth=f"auth:\n  htpasswd:\n    realm: edgesdk-test\n    path: {root / 'htpasswd'}\n")
    yield r
    r.stop()


def test_basic_auth_from_docker_config_and_from_the_environment(basic_registry, two_bundles, tmp_path):
    ref = basic_registry.ref("models/basic:1")
    bundle = str(two_bundles / "cpu-x86_64")
    # no credentials anywhere: one line naming both ways to give them
    one_line(run("push", bundle, ref, home=tmp_path), 10, "asks for a user name and password",
             "docker login", "EDGESDK_REGISTRY_USER")  # fmt: skip
    # ~/.docker/config.json (docker login's file; the key may carry a scheme and a path)
    docker_config(tmp_path / "user" / ".docker", basic_registry.ref("")[6:-1], USER, PASSWORD,
                  key=f"https://{basic_registry.ref('')[6:-1]}/v2/")  # fmt: skip
    pushed = run("push", bundle, ref, "--json", home=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["profiles"] == ["cpu-x86_64"]
    # $DOCKER_CONFIG wins over ~/.docker: a wrong password there is refused, naming where it came from
    wrong = docker_config(tmp_path / "wrong", basic_registry.ref("")[6:-1], USER, "nope")
    one_line(run("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "d1", env={"DOCKER_CONFIG": str(wrong)}),
             10, "refused the credentials from docker config", str(wrong))  # fmt: skip
    # EDGESDK_REGISTRY_USER / _PASSWORD win over the file
    env = {"DOCKER_CONFIG": str(wrong), "EDGESDK_REGISTRY_USER": USER, "EDGESDK_REGISTRY_PASSWORD": PASSWORD}
    got = run("pull", ref, "--profile", "cpu-x86_64", "--json", home=tmp_path / "d2", env=env)
    assert got.returncode == 0, got.stderr
    pulled = Path(json.loads(got.stdout)["path"])
    assert (pulled / "model.gguf").stat().st_size == (two_bundles / "cpu-x86_64" / "model.gguf").stat().st_size
    # only one of the two variables, a config file that is not JSON: exit 3, one line, nothing stored
    one_line(run("pull", ref, home=tmp_path / "d3", env={"EDGESDK_REGISTRY_USER": USER}), 3,
             "set both EDGESDK_REGISTRY_USER and EDGESDK_REGISTRY_PASSWORD")  # fmt: skip
    (wrong / "config.json").write_text("{not json")
    one_line(run("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "d3", env={"DOCKER_CONFIG": str(wrong)}),
             3, "is not JSON")  # fmt: skip
    assert not (tmp_path / "d3" / "bundles").exists() or not any((tmp_path / "d3" / "bundles").iterdir())


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    pytest.importorskip("cryptography")
    root = tmp_path_factory.mktemp("token")
    service = TokenService(root, USER, PASSWORD)
    r = Registry(root / "registry", auth=service.auth_config())
    yield r, service
    r.stop()
    service.stop()


def test_the_token_flow(token_registry, two_bundles, tmp_path):
    registry, service = token_registry
    ref = registry.ref("models/token:1")
    creds = {"EDGESDK_REGISTRY_USER": USER, "EDGESDK_REGISTRY_PASSWORD": PASSWORD}
    one_line(run("push", str(two_bundles / "cpu-x86_64"), ref, home=tmp_path), 10,
             "refused an anonymous token for repository:models/token:pull")  # fmt: skip
    pushed = run("push", str(two_bundles / "cpu-x86_64"), ref, "--json", home=tmp_path, env=creds)
    assert pushed.returncode == 0, pushed.stderr
    # the push asked for push rights; the registry names the actions in either order (seen: pull,push and push,pull)
    scopes = {(r["scope"].rpartition(":")[0], frozenset(r["scope"].rpartition(":")[2].split(",")), r["auth"])
              for r in service.requests}  # fmt: skip
    assert ("repository:models/token", frozenset({"pull", "push"}), "Basic") in scopes
    got = run("pull", ref, "--profile", "cpu-x86_64", "--json", home=tmp_path / "device", env=creds)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["digest"] == json.loads(pushed.stdout)["manifest_digest"]
    one_line(run("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "anon"), 10, "anonymous token")
    bad = {**creds, "EDGESDK_REGISTRY_PASSWORD": "wrong"}
    one_line(run("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "anon", env=bad), 10,
             "refused the credentials from EDGESDK_REGISTRY_USER")  # fmt: skip


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: picks the address of the default route
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_plain_http_off_loopback_needs_insecure(two_bundles, tmp_path):
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this host has no non-loopback address")
    registry = Registry(tmp_path / "reg", host=addr)
    try:
        ref = registry.ref("models/lan:1")
        one_line(run("push", str(two_bundles / "cpu-x86_64"), ref, home=tmp_path), 3,
                 "answers in plain HTTP, not HTTPS", "--insecure")  # fmt: skip
        pushed = run("push", str(two_bundles / "cpu-x86_64"), ref, "--insecure", home=tmp_path)
        assert pushed.returncode == 0, pushed.stderr
        one_line(run("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "device"), 3, "plain HTTP")
        assert not (tmp_path / "device" / "bundles").exists() or not any((tmp_path / "device" / "bundles").iterdir())
        got = run("pull", ref, "--profile", "cpu-x86_64", "--insecure", home=tmp_path / "device")
        assert got.returncode == 0 and Path(got.stdout.strip(), "manifest.json").is_file(), got.stderr
    finally:
        registry.stop()


@pytest.fixture(scope="module")
def plain_registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("plain"))
    yield r
    r.stop()


def test_several_bundles_in_one_push_make_one_index(plain_registry, two_bundles, tmp_path):
    ref = plain_registry.ref("models/multi:1")
    cpu, nano = str(two_bundles / "cpu-x86_64"), str(two_bundles / "orin-nano-8gb")
    # one profile twice, or a directory that is not a bundle: refused before anything is uploaded
    one_line(run("push", cpu, cpu, ref, home=tmp_path), 3, "are both for profile cpu-x86_64")
    one_line(run("push", cpu, str(tmp_path), ref, home=tmp_path), 7)
    req = urllib.request.Request(
        f"http://127.0.0.1:{plain_registry.port}/v2/models/multi/tags/list", headers={"Accept": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError):  # the repository does not exist: nothing was pushed
        urllib.request.urlopen(req)
    out = run("push", cpu, nano, ref, "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["profiles"] == ["cpu-x86_64", "orin-nano-8gb"] and got["profile"] is None
    assert [b["profile"] for b in got["bundles"]] == ["cpu-x86_64", "orin-nano-8gb"]
    assert got["bundles"][1]["uploaded_bytes"] < 1e6  # the GGUF went up once
    index = json.loads(
        urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{plain_registry.port}/v2/models/multi/manifests/1",
                headers={"Accept": "application/vnd.oci.image.index.v1+json"},
            )
        ).read()
    )
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert [m["digest"] for m in index["manifests"]] == [b["manifest_digest"] for b in got["bundles"]]
    for b in got["bundles"]:
        pulled = run("pull", ref, "--profile", b["profile"], "--json", home=tmp_path / "device")
        assert pulled.returncode == 0 and json.loads(pulled.stdout)["digest"] == b["manifest_digest"], pulled.stderr
    # the text output: a line per bundle and the tag's profiles
    text = run("push", cpu, nano, ref, home=tmp_path).stdout.splitlines()
    assert len(text) == 3 and text[-1].startswith("the tag holds cpu-x86_64, orin-nano-8gb: sha256:")
