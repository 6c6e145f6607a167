# SPDX-License-Identifier: Apache-2.0
"""Signed bundles and the trust policy (issue 36, item 3), against the real registry of tests/test_distribution.py
(Debian's ``docker-registry``, CNCF distribution 2.8, on loopback; it has no referrers API, so the signature goes
under cosign's ``sha256-<hex>.sig`` tag):

* ``push --sign KEY`` signs with OpenSSF model-signing plus edgesdk's in-toto statement and attaches both to the
  manifest; ``pull --require-signature --trusted-key PUB`` passes, keeps the signature beside the stored bundle,
  and the signed predicate carries the bundle's license verdict, SBOM digest, parity and manifest_sha256;
* refused (exit 7, one line, nothing in the store): an unsigned bundle under ``--require-signature`` (and under a
  policy file named by ``--policy`` or ``$EDGESDK_TRUST_POLICY``), a signature by an untrusted key, a bundle whose
  file was changed after signing with the old signature attached to it;
* ``edgesdk verify`` on a local directory: good, wrong key, a file added; a missing extra is one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from test_distribution import Registry, cli  # the real registry (two_bundles: tests/conftest.py)

pytest.importorskip("model_signing")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("docker-registry") is None and shutil.which("registry") is None,
        reason="no docker-registry binary (make setup installs Debian's)",
    ),
]


def _keypair(directory: Path, name: str) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    ci, ci_pub = _keypair(d, "ci")
    _, other_pub = _keypair(d, "other")
    return {"ci": ci, "ci_pub": ci_pub, "other_pub": other_pub}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("registry"))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def two_bundles(two_bundles, tmp_path_factory):
    """A copy of tests/conftest.py's two_bundles: signing writes BUNDLE.sig/ beside the bundle, and a push of the
    shared cpu-x86_64 bundle elsewhere would attach it."""
    out = tmp_path_factory.mktemp("signing-bundles")
    for profile in ("cpu-x86_64", "orin-nano-8gb"):
        shutil.copytree(two_bundles / profile, out / profile)
    return out


@pytest.fixture(scope="module")
def signed(registry, two_bundles, keys, tmp_path_factory):
    """The cpu-x86_64 bundle pushed with --sign (the orin-nano-8gb one stays unsigned)."""
    home = tmp_path_factory.mktemp("pusher")
    ref = registry.ref("models/signed:1")
    out = json.loads(cli("push", str(two_bundles / "cpu-x86_64"), ref, "--sign", str(keys["ci"]), "--json",
                         home=home).stdout)  # fmt: skip
    return {"ref": ref, **out}


def _stored(home: Path) -> list[str]:
    base = home / "bundles"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 7, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def test_signed_push_then_pull_with_the_trusted_key(registry, two_bundles, keys, signed, tmp_path):
    bundle = two_bundles / "cpu-x86_64"
    digest = signed["manifest_digest"]
    assert signed["signature"]["tag"] == f"sha256-{digest.split(':')[1]}.sig" and signed["key_id"]
    assert sorted(p.name for p in (two_bundles / "cpu-x86_64.sig").iterdir()) == ["model.sig", "statement.dsse.json"]
    # the registry holds the signature under cosign's tag, an OCI artifact whose subject is the bundle manifest
    req = urllib.request.Request(
        f"http://127.0.0.1:{registry.port}/v2/models/signed/manifests/{signed['signature']['tag']}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    doc = json.loads(urllib.request.urlopen(req).read())
    assert doc["artifactType"] == "application/vnd.edgesdk.signature.v1" and doc["subject"]["digest"] == digest
    assert [x["mediaType"] for x in doc["layers"]] == [
        "application/vnd.dev.sigstore.bundle.v0.3+json",
        "application/vnd.dsse.envelope.v1+json",
    ]
    got = cli("pull", signed["ref"], "--profile", "cpu-x86_64", "--require-signature", "--trusted-key",
              str(keys["ci_pub"]), "--json", home=tmp_path)  # fmt: skip
    pulled = json.loads(got.stdout)
    assert pulled["how"] == "pulled" and pulled["digest"] == digest
    hexd = digest.split(":")[1]
    assert _stored(tmp_path) == [hexd, f"{hexd}.sig"]
    assert [r["signed"] for r in json.loads(cli("ls", "--json", home=tmp_path).stdout)] == [True]
    # the signed predicate carries the bundle's license verdict, SBOM digest, parity and manifest_sha256
    ver = cli("verify", pulled["path"], "--signature", str(tmp_path / "bundles" / f"{hexd}.sig"), "--trusted-key",
              str(keys["ci_pub"]), "--json", home=tmp_path)  # fmt: skip
    predicate = json.loads(ver.stdout)["predicate"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert predicate["license"]["verdict"] == manifest["license"]["verdict"] == "pass"
    assert predicate["license"]["accepted"] == ["LicenseRef-gemma"]
    sbom = next(a for a in manifest["artifacts"] if a["role"] == "sbom")
    assert predicate["sbom"] == {
        "path": "sbom.cdx.json",
        "mediaType": "application/vnd.cyclonedx+json",
        "digest": {"sha256": sbom["sha256"]},
    }
    assert predicate["parity"] == manifest["parity"] and predicate["manifest_sha256"] == manifest["manifest_sha256"]
    # pulled again: already in the store, the signature checked again
    again = json.loads(cli("pull", signed["ref"], "--profile", "cpu-x86_64", "--require-signature",
                           "--trusted-key", str(keys["ci_pub"]), "--json", home=tmp_path).stdout)  # fmt: skip
    assert again["how"] == "already in the store"
    removed = cli("rm", digest, home=tmp_path).stdout
    assert digest in removed and _stored(tmp_path) == []


def test_an_unsigned_bundle_is_refused_under_the_policy(registry, two_bundles, keys, tmp_path):
    ref = registry.ref("models/unsigned:1")
    cli("push", str(two_bundles / "orin-nano-8gb"), ref, home=tmp_path / "pusher")
    proc = cli("pull", ref, "--profile", "orin-nano-8gb", "--require-signature", "--trusted-key",
               str(keys["ci_pub"]), home=tmp_path, ok=False)  # fmt: skip
    _refused(proc, "is not signed", "requires a signature")
    assert _stored(tmp_path) == []
    # the same through a policy file: --policy, and $EDGESDK_TRUST_POLICY (what load("oci://...") and serve read)
    policy = tmp_path / "trust.yaml"
    shutil.copy(keys["ci_pub"], tmp_path / "ci.pub.pem")
    policy.write_text("require_signature: true\ntrusted_keys:\n  - ci.pub.pem\n")
    _refused(cli("pull", ref, "--profile", "orin-nano-8gb", "--policy", str(policy), home=tmp_path, ok=False),
             str(policy))  # fmt: skip
    env_pull = subprocess.run(
        [sys.executable, "-m", "edgesdk", "pull", ref, "--profile", "orin-nano-8gb"],
        capture_output=True, text=True, env={**_env(tmp_path), "EDGESDK_TRUST_POLICY": str(policy)},
    )  # fmt: skip
    _refused(env_pull, "is not signed")
    assert _stored(tmp_path) == []
    # no policy: the unsigned bundle is pulled as before
    assert json.loads(cli("pull", ref, "--profile", "orin-nano-8gb", "--json", home=tmp_path).stdout)["how"] == "pulled"
    # a policy file that asks for a signature but trusts no key, or has an unknown key: exit 3, one line
    policy.write_text("require_signature: true\n")
    bad = cli("pull", ref, "--profile", "orin-nano-8gb", "--policy", str(policy), home=tmp_path, ok=False)
    assert bad.returncode == 3 and "needs at least one trusted key" in bad.stderr
    policy.write_text("require_signature: true\ntrusted_key: [ci.pub.pem]\n")
    bad = cli("pull", ref, "--profile", "orin-nano-8gb", "--policy", str(policy), home=tmp_path, ok=False)
    assert bad.returncode == 3 and "unknown key(s) trusted_key" in bad.stderr


def _env(home: Path) -> dict[str, str]:
    import os

    return {**os.environ, "EDGESDK_HOME": str(home)}


def test_a_signature_by_an_untrusted_key_is_refused(keys, signed, tmp_path):
    proc = cli("pull", signed["ref"], "--profile", "cpu-x86_64", "--require-signature", "--trusted-key",
               str(keys["other_pub"]), home=tmp_path, ok=False)  # fmt: skip
    _refused(proc, "model.sig: signed by key", "which is not a trusted key")
    assert _stored(tmp_path) == []
    # --trusted-key without --require-signature: a signature present must still be by a trusted key
    proc = cli("pull", signed["ref"], "--profile", "cpu-x86_64", "--trusted-key", str(keys["other_pub"]),
               home=tmp_path, ok=False)  # fmt: skip
    _refused(proc, "not a trusted key")
    assert _stored(tmp_path) == []


def test_a_file_changed_after_signing_is_refused(registry, two_bundles, keys, signed, tmp_path):
    from edgesdk.bundle import write_manifest
    from edgesdk.distribution.oci import Client, Reference
    from edgesdk.distribution.store import attach_signature

    # an attacker's bundle: the signed one with another SBOM and a manifest rewritten to match (it opens cleanly)
    evil = tmp_path / "evil"
    shutil.copytree(two_bundles / "cpu-x86_64", evil)
    sbom = evil / "sbom.cdx.json"
    sbom.write_bytes(sbom.read_bytes().replace(b"{", b"{ ", 1))
    layout = json.loads((evil / "manifest.json").read_text())
    import hashlib

    for a in layout["artifacts"]:
        if a["path"] == "sbom.cdx.json":
            a["sha256"], a["bytes"] = hashlib.sha256(sbom.read_bytes()).hexdigest(), sbom.stat().st_size
    write_manifest(evil, layout)
    shutil.copytree(two_bundles / "cpu-x86_64.sig", tmp_path / "evil.sig")
    # locally: the signature is by the trusted key but over other files
    _refused(cli("verify", str(evil), "--trusted-key", str(keys["ci_pub"]), home=tmp_path, ok=False),
             "is not the file that was signed")  # fmt: skip
    # push refuses to attach a signature of another build
    ref = registry.ref("models/signed:evil")
    stale = cli("push", str(evil), ref, home=tmp_path, ok=False)
    assert stale.returncode == 3 and "signs another build" in stale.stderr
    # pushed anyway, with the old signature attached by hand to the new manifest
    shutil.rmtree(tmp_path / "evil.sig")
    pushed = json.loads(cli("push", str(evil), ref, "--json", home=tmp_path).stdout)
    manifest_body = urllib.request.urlopen(
        urllib.request.Request(
            f"http://127.0.0.1:{registry.port}/v2/models/signed/manifests/{pushed['manifest_digest']}",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
    ).read()
    attach_signature(Client(Reference.parse(ref)), pushed["manifest_digest"], len(manifest_body),
                     two_bundles / "cpu-x86_64.sig")  # fmt: skip
    home = tmp_path / "device"
    proc = cli("pull", ref, "--profile", "cpu-x86_64", "--require-signature", "--trusted-key", str(keys["ci_pub"]),
               home=home, ok=False)  # fmt: skip
    _refused(proc, "is not the file that was signed")
    assert "manifest.json" in proc.stderr or "sbom.cdx.json" in proc.stderr
    assert _stored(home) == []


def test_verify_a_local_bundle(two_bundles, keys, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(two_bundles / "orin-nano-8gb", b)
    cli("sign", str(b), "--key", str(keys["ci"]), home=tmp_path)
    ok = cli("verify", str(b), "--trusted-key", str(keys["ci_pub"]), home=tmp_path)
    assert ok.stdout.startswith(f"verified: {b} signed by {keys['ci_pub']}") and "license pass" in ok.stdout
    _refused(cli("verify", str(b), "--trusted-key", str(keys["other_pub"]), home=tmp_path, ok=False),
             "not a trusted key")  # fmt: skip
    (b / "extra.txt").write_text("not signed")  # a file the bundle does not list: model-signing sees it
    _refused(cli("verify", str(b), "--trusted-key", str(keys["ci_pub"]), home=tmp_path, ok=False),
             "Extra files found", "extra.txt")  # fmt: skip
    (b / "extra.txt").unlink()
    shutil.rmtree(tmp_path / "b.sig")
    _refused(cli("verify", str(b), "--trusted-key", str(keys["ci_pub"]), home=tmp_path, ok=False), "is not signed")


def test_without_the_sign_extra_it_is_one_line(monkeypatch, capsys, tmp_path):
    import importlib.util

    from edgesdk import cli as edgesdk_cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "model_signing" else real(n, *a))
    with pytest.raises(SystemExit) as exc:
        edgesdk_cli.main(["sign", str(tmp_path), "--key", str(tmp_path / "k.pem")])
    err = capsys.readouterr().err
    assert exc.value.code == 10 and err.count("\n") == 1
    assert "edgesdk sign needs the sign extra: pip install 'edgesdk[sign]'" in err and "model_signing" in err


def test_offline_the_kept_signature_is_checked_again(two_bundles, keys, signed, tmp_path):
    reg = Registry(tmp_path / "reg")
    ref = reg.ref("models/offline-signed:1")
    home = tmp_path / "home"
    policy = ("--require-signature", "--trusted-key", str(keys["ci_pub"]))
    try:
        pushed = json.loads(cli("push", str(two_bundles / "cpu-x86_64"), ref, "--json", home=home).stdout)
        assert pushed["signature"] is not None  # BUNDLE.sig/ (written by the `signed` fixture) is attached
        cli("pull", ref, "--profile", "cpu-x86_64", *policy, home=home)
    finally:
        reg.stop()
    again = cli("pull", ref, "--profile", "cpu-x86_64", *policy, home=home)
    assert "offline: the store's copy" in again.stderr
    _refused(cli("pull", ref, "--profile", "cpu-x86_64", "--require-signature", "--trusted-key",
                 str(keys["other_pub"]), home=home, ok=False), "not a trusted key")  # fmt: skip
    hexd = pushed["manifest_digest"].split(":")[1]
    shutil.rmtree(home / "bundles" / f"{hexd}.sig")
    _refused(cli("pull", ref, "--profile", "cpu-x86_64", *policy, home=home, ok=False), "has no signature")


def test_load_with_verify_key_enforces_the_signature(registry, two_bundles, keys, signed, tmp_path, monkeypatch):
    """``edgesdk.load(ref_or_dir, verify_key=PUB)``: a bundle signed by that key loads; unsigned, signed by another
    key, or changed after signing is refused (exit 7) before anything is loaded or stored."""
    import edgesdk
    from edgesdk.errors import BundleIntegrityError

    monkeypatch.setenv("EDGESDK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGESDK_TRUST_POLICY", raising=False)
    loaded = []
    monkeypatch.setattr("edgesdk.runtime.session.load", lambda b, **kw: loaded.append(Path(b)) or "session")
    from edgesdk.profiler.device import detect_device

    if detect_device().best_match != "cpu-x86_64":  # load("oci://...") takes this host's profile
        pytest.skip("this host does not match cpu-x86_64, the profile of the signed tag")
    # from the registry: the signed tag loads with the right key, not with another; nothing stored on refusal
    assert edgesdk.load(signed["ref"], verify_key=keys["ci_pub"]) == "session"
    assert loaded[-1].parent == tmp_path / "home" / "bundles"
    monkeypatch.setenv("EDGESDK_HOME", str(tmp_path / "other"))
    with pytest.raises(BundleIntegrityError, match="not a trusted key") as exc:
        edgesdk.load(signed["ref"], verify_key=str(keys["other_pub"]))
    assert exc.value.exit_code == 7 and _stored(tmp_path / "other") == []
    unsigned = registry.ref("models/unsigned-load:1")
    shutil.copytree(two_bundles / "cpu-x86_64", tmp_path / "plain")  # without its BUNDLE.sig/
    cli("push", str(tmp_path / "plain"), unsigned, home=tmp_path / "pusher")
    with pytest.raises(BundleIntegrityError, match="is not signed"):
        edgesdk.load(unsigned, verify_key=[keys["ci_pub"]])
    assert _stored(tmp_path / "other") == []
    # a local directory: its BUNDLE.sig/ must verify with the key
    b = tmp_path / "local"
    shutil.copytree(two_bundles / "cpu-x86_64", b)
    shutil.copytree(two_bundles / "cpu-x86_64.sig", tmp_path / "local.sig")
    n = len(loaded)
    assert edgesdk.load(b, verify_key=keys["ci_pub"]) == "session" and loaded[-1] == b
    with pytest.raises(BundleIntegrityError, match="not a trusted key"):
        edgesdk.load(b, verify_key=keys["other_pub"])
    (b / "extra.txt").write_text("added after signing")
    with pytest.raises(BundleIntegrityError, match="extra.txt"):
        edgesdk.load(b, verify_key=keys["ci_pub"])
    with pytest.raises(BundleIntegrityError, match="is not signed"):
        edgesdk.load(two_bundles / "orin-nano-8gb", verify_key=keys["ci_pub"])
    assert len(loaded) == n + 1  # none of the refused ones reached the runtime
