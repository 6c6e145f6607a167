# SPDX-License-Identifier: Apache-2.0
"""Bundles on an OCI registry (issue 36, items 1-2), against a real CNCF distribution registry (Debian's
``docker-registry``, which the Makefile's set-up installs) on loopback:

* push of two profiles of one model under one tag: an OCI image index with one entry per profile, the second
  push uploading only what the registry lacks (the GGUF is shared);
* pull by profile and ``--profile auto`` (this host's detected profile) into the store, verified; the pulled
  bundle loads and generates what the original does; ``edgesdk.load("oci://...")``;
* a tampered blob in the registry: refused (exit 7), nothing in the store; an interrupted pull resumes;
  offline, the store's copy is used and said so; ``ls`` / ``rm``; bad references and an unreachable registry
  are one line with their exit codes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REGISTRY = shutil.which("docker-registry") or shutil.which("registry")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REGISTRY is None, reason="no docker-registry binary (make setup installs Debian's)"),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Registry:
    """A real registry (Debian's docker-registry) on ``host`` (loopback by default); ``auth``: the config's
    ``auth:`` section (tests/registry_auth.py: htpasswd or token)."""

    def __init__(self, root: Path, auth: str = "", host: str = "127.0.0.1") -> None:
        self.root = root
        self.host = host
        root.mkdir(parents=True, exist_ok=True)
        self.port = _port()
        cfg = root / "config.yml"
        cfg.write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: {host}:{self.port}\nlog:\n  level: error\n{auth}"
        )
        self.proc = subprocess.Popen(
            [REGISTRY, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex((host, self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError("the registry did not start")

    def ref(self, tail: str) -> str:
        return f"oci://{self.host}:{self.port}/{tail}"

    def blob(self, digest: str) -> Path:
        hexd = digest.split(":")[1]
        return self.root / "data" / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("registry"))
    yield r
    r.stop()


def cli(*args: str, home: Path, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGESDK_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True, env=env)
    if ok:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_push_two_profiles_then_pull_each_verified_and_loadable(registry, two_bundles, tmp_path):
    ref = registry.ref("models/gemma:270m")
    first = json.loads(cli("push", str(two_bundles / "cpu-x86_64"), ref, "--json", home=tmp_path).stdout)
    second = json.loads(cli("push", str(two_bundles / "orin-nano-8gb"), ref, "--json", home=tmp_path).stdout)
    assert first["profiles"] == ["cpu-x86_64"] and second["profiles"] == ["cpu-x86_64", "orin-nano-8gb"]
    assert first["uploaded_bytes"] == first["bytes"] > 200e6
    assert second["uploaded_bytes"] < 1e6  # the GGUF blob is the registry's already
    # the tag is an OCI image index, one entry per profile
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{registry.port}/v2/models/gemma/manifests/270m",
        headers={"Accept": "application/vnd.oci.image.index.v1+json"},
    )
    index = json.loads(urllib.request.urlopen(req).read())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert [m["annotations"]["io.edgesdk.profile"] for m in index["manifests"]] == ["cpu-x86_64", "orin-nano-8gb"]
    got = json.loads(cli("pull", ref, "--profile", "orin-nano-8gb", "--json", home=tmp_path).stdout)
    assert got["profile"] == "orin-nano-8gb" and got["how"] == "pulled" and got["digest"] == second["manifest_digest"]
    pulled = Path(got["path"])
    assert (pulled / "model.gguf").stat().st_size == (two_bundles / "orin-nano-8gb" / "model.gguf").stat().st_size
    assert not list((tmp_path / "bundles").glob(".partial-*"))
    # auto: the profile this host matches (the same detection as `edgesdk profiler detect`)
    from edgesdk.profiler.device import detect_device

    host = detect_device().best_match
    auto = cli("pull", ref, "--json", home=tmp_path, ok=host in ("cpu-x86_64", "orin-nano-8gb"))
    if host in ("cpu-x86_64", "orin-nano-8gb"):
        assert json.loads(auto.stdout)["profile"] == host
    else:
        assert auto.returncode == 3 and f"no bundle for profile {host}" in auto.stderr
    # the pulled bundle generates what the built one does
    env_home = os.environ.get("EDGESDK_HOME")
    os.environ["EDGESDK_HOME"] = str(tmp_path)
    try:
        import edgesdk

        with edgesdk.load(str(two_bundles / "cpu-x86_64")) as s:
            want = s.generate("The sea is", max_tokens=8, temperature=0).text
        with edgesdk.load(pulled) as s:
            assert s.generate("The sea is", max_tokens=8, temperature=0).text == want
    finally:
        if env_home is None:
            os.environ.pop("EDGESDK_HOME", None)
        else:
            os.environ["EDGESDK_HOME"] = env_home
    listed = json.loads(cli("ls", "--json", home=tmp_path).stdout)
    assert {r["profile"] for r in listed} >= {"orin-nano-8gb"} and all(r["references"] == [ref] for r in listed)
    removed = cli("rm", got["digest"][:19], home=tmp_path).stdout
    assert got["digest"] in removed and not pulled.exists()


def test_a_tampered_blob_is_refused_and_nothing_is_stored(registry, two_bundles, tmp_path):
    ref = registry.ref("models/tamper:1")
    pushed = json.loads(cli("push", str(two_bundles / "cpu-x86_64"), ref, "--json", home=tmp_path).stdout)
    manifest = json.loads(registry.blob(pushed["manifest_digest"]).read_bytes())
    small = next(x for x in manifest["layers"] if x["annotations"]["org.opencontainers.image.title"] == "sbom.cdx.json")
    blob = registry.blob(small["digest"])
    original = blob.read_bytes()
    try:
        blob.write_bytes(original.replace(b"{", b"[", 1))  # same size, other bytes
        proc = cli("pull", ref, "--profile", "cpu-x86_64", home=tmp_path, ok=False)
        assert proc.returncode == 7, proc.stderr
        assert f"blob {small['digest']}" in proc.stderr and "not used" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not [p for p in (tmp_path / "bundles").iterdir() if not p.name.startswith(".partial-")]
    finally:
        blob.write_bytes(original)
    # an interrupted pull resumes: the partial directory keeps what arrived, a partial file continues by Range
    partial = next((tmp_path / "bundles").glob(".partial-*"))
    gguf = two_bundles / "cpu-x86_64" / "model.gguf"
    (partial / "model.gguf.partial").write_bytes(gguf.read_bytes()[: 50 << 20])
    got = json.loads(cli("pull", ref, "--profile", "cpu-x86_64", "--json", home=tmp_path).stdout)
    assert got["how"] == "pulled" and Path(got["path"], "model.gguf").read_bytes() == gguf.read_bytes()


def test_offline_uses_the_stores_copy_and_errors_are_one_line(two_bundles, tmp_path):
    reg = Registry(tmp_path / "reg")
    ref = reg.ref("models/offline:1")
    home = tmp_path / "home"
    try:
        cli("push", str(two_bundles / "cpu-x86_64"), ref, home=home)
        first = cli("pull", ref, "--profile", "cpu-x86_64", home=home).stdout.strip()
    finally:
        reg.stop()
    again = cli("pull", ref, "--profile", "cpu-x86_64", home=home)
    assert again.stdout.strip() == first and "offline: the store's copy" in again.stderr
    fresh = cli("pull", ref, "--profile", "cpu-x86_64", home=tmp_path / "empty", ok=False)
    assert fresh.returncode == 10 and fresh.stderr.count("\n") == 1 and "is not reachable" in fresh.stderr
    bad = cli("pull", "oci://Registry/UPPER:tag", home=home, ok=False)
    assert bad.returncode == 3 and "not an OCI reference" in bad.stderr and "Traceback" not in bad.stderr
    missing = cli("rm", "sha256:0000000000000000", home=home, ok=False)
    assert missing.returncode == 3 and "nothing in the store matches" in missing.stderr
