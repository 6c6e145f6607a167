# SPDX-License-Identifier: Apache-2.0
"""Hand-off to fleet updaters (issue 36, item 5):

* ``edgesdk export --mender``: a Mender module-image artifact written by Debian's ``mender-artifact`` (the
  Makefile's set-up installs it; skipped without it), signed with an EC P-256 key in PKCS#8 (as ``edgesdk sign``
  keys are), accepted by ``mender-artifact validate`` with the public key and refused with another; its payload
  is the bundle (and its signature), byte for byte; bad input is one line;
* ``edgesdk rollout check NEW --current OLD`` on two Gemma-3-270M bundles: the same model passes (exit 0, with a
  profiler compare); a new bundle whose recorded parity failed, or whose perplexity is 1.2x the current one's, is
  a regression (exit 2, each named); kinds that differ and tampered bundles are refused with their codes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
MENDER = shutil.which("mender-artifact")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)


def _keys(d: Path) -> tuple[Path, Path, Path]:
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    (d / "k.pem").write_bytes(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    for name, k in (("k.pub.pem", key), ("other.pub.pem", other)):
        (d / name).write_bytes(k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return d / "k.pem", d / "k.pub.pem", d / "other.pub.pem"


@pytest.mark.skipif(MENDER is None, reason="no mender-artifact (Debian package; make setup installs it)")
def test_export_mender_writes_a_signed_artifact_mender_validates(two_bundles, tmp_path):
    pytest.importorskip("cryptography")
    key, pub, other = _keys(tmp_path)
    bundle = two_bundles / "orin-nano-8gb"
    out = tmp_path / "gemma.mender"
    proc = cli("export", str(bundle), "--mender", "-o", str(out), "--device-type", "jetson-orin-nano",
               "--device-type", "jetson-orin-nx", "--key", str(key), "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert got["signed"] and got["type"] == "edgesdk-bundle" and got["meta_data"]["bundle_id"] == manifest["bundle_id"]
    assert not list(tmp_path.glob(".gemma.mender.*"))  # the temporary directory is gone
    ok = subprocess.run([MENDER, "validate", str(out), "-k", str(pub)], capture_output=True, text=True)
    assert ok.returncode == 0 and "validated successfully" in ok.stdout + ok.stderr
    bad = subprocess.run([MENDER, "validate", str(out), "-k", str(other)], capture_output=True, text=True)
    assert bad.returncode != 0
    info = subprocess.run([MENDER, "read", str(out), "-k", str(pub)], capture_output=True, text=True).stdout
    assert "jetson-orin-nano" in info and "jetson-orin-nx" in info
    ((provides, version),) = got["provides"].items()
    assert provides.startswith("edgesdk.gemma") and version == manifest["bundle_id"]
    assert f"{provides}: {version}" in info and "Type:   edgesdk-bundle" in info
    # the payload is the bundle, file for file (a Mender artifact is a tar: header, then data/0000.tar.gz)
    with tarfile.open(out) as outer:
        data = outer.extractfile("data/0000.tar.gz").read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(data)) as payload:
        inner = payload.extractfile("bundle.tar").read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(inner)) as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
        assert t.extractfile(f"{bundle.name}/manifest.json").read() == (bundle / "manifest.json").read_bytes()  # type: ignore[union-attr]
    assert names == sorted(f"{bundle.name}/{p.relative_to(bundle)}" for p in bundle.rglob("*") if p.is_file())
    # unsigned, without --key: still validated
    plain = cli("export", str(bundle), "--mender", "-o", str(tmp_path / "plain.mender"), "--device-type", "x")
    assert plain.returncode == 0 and "unsigned" in plain.stdout and "validated by mender-artifact" in plain.stdout
    # bad input: one line each, nothing written
    one_line(cli("export", str(bundle), "--mender", "-o", str(out), "--device-type", "x"), 4, "output exists")
    one_line(cli("export", str(bundle), "--mender", "-o", str(tmp_path / "a.tar"), "--device-type", "x"), 3,
             "ends in .mender")  # fmt: skip
    one_line(cli("export", str(bundle), "--mender", "-o", str(tmp_path / "b.mender")), 3, "--device-type is required")
    one_line(cli("export", str(bundle), "-o", str(tmp_path / "b.mender"), "--device-type", "x"), 3, "--mender")
    one_line(cli("export", str(bundle), "--mender", "-o", str(tmp_path / "b.mender"), "--device-type", "x",
                 "--key", str(pub)), 3, "is not a PEM private key")  # fmt: skip
    one_line(cli("export", str(tmp_path), "--mender", "-o", str(tmp_path / "b.mender"), "--device-type", "x"), 7)
    assert not (tmp_path / "b.mender").exists() and not (tmp_path / "a.tar").exists()


def _variant(src: Path, dest: Path, parity: dict) -> Path:
    """A copy of ``src`` whose manifest records ``parity`` (rewritten with its self-hash, so it opens cleanly)."""
    from edgesdk.bundle import write_manifest

    shutil.copytree(src, dest)
    layout = json.loads((dest / "manifest.json").read_text())
    layout["parity"] = {**layout["parity"], **parity}
    write_manifest(dest, layout)
    return dest


def test_rollout_check(two_bundles, tmp_path):
    pytest.importorskip("llama_cpp")
    current = two_bundles / "cpu-x86_64"
    ok = cli("rollout", "check", str(two_bundles / "orin-nano-8gb"), "--current", str(current), "--iterations", "5",
             "--max-regression", "300%", "--min-agreement", "1", "--json")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    got = json.loads(ok.stdout)
    assert got["verdict"] == "pass" and got["kind"] == "llm" and got["parity_vs_current"]["greedy_identical"] == 1.0
    assert got["performance"]["rows"] and not got["regressions"]
    # regressions the manifests show: a failed parity check, perplexity 1.2x the current bundle's
    cur = _variant(current, tmp_path / "cur", {"ppl": {"ppl": 20.0}, "ppl_ratio": 1.0})
    worse = _variant(current, tmp_path / "new", {"ppl": {"ppl": 24.0}, "ppl_ratio": 1.2,
                                                 "fp16": {"min_cosine": 0.9, "passed": False}})  # fmt: skip
    one = tmp_path / "one-prompt.txt"  # the live comparison is not what these two calls check: one prompt, not four
    one.write_text("The sea is\n")
    bad = cli("-q", "rollout", "check", str(worse), "--current", str(cur), "--max-regression", "none",
              "--inputs", str(one))  # fmt: skip
    one_line(bad, 2, "rollout check: regression", "own parity check fp16 failed",
             "perplexity 24.000 is 1.200x the current bundle's 20.000")  # fmt: skip
    assert "performance: not measured" in bad.stdout
    # --max-ppl-ratio 1.25 lets the perplexity through; the failed check still stops it
    looser = cli("rollout", "check", str(worse), "--current", str(cur), "--max-regression", "none",
                 "--max-ppl-ratio", "1.25", "--inputs", str(one), "--json")  # fmt: skip
    assert looser.returncode == 2 and json.loads(looser.stdout)["regressions"] == [
        "the new bundle's own parity check fp16 failed at build time"
    ]
    # refused with their own codes: a tampered bundle (7), a missing one (3), bad inputs / thresholds (3)
    (cur / "sbom.cdx.json").write_text("{}")
    one_line(cli("rollout", "check", str(current), "--current", str(cur)), 7, "sbom.cdx.json")
    one_line(cli("rollout", "check", str(current), "--current", str(tmp_path / "nothing")), 3, "bundle not found")
    empty = tmp_path / "inputs.txt"
    empty.write_text("\n\n")
    one_line(cli("rollout", "check", str(current), "--current", str(current), "--inputs", str(empty)), 3,
             "--inputs holds no lines")  # fmt: skip
    one_line(cli("rollout", "check", str(current), "--current", str(current), "--max-regression", "lots"), 3,
             "--max-regression")  # fmt: skip
