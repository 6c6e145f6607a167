# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

import json

import pytest

from edgesdk import bundle as B
from edgesdk.errors import BundleIntegrityError, InputError, OutputExistsError


def _fake_bundle(root):
    (root / "model.bin").write_bytes(b"weights")
    art = B.artifact_entry(root, "model.bin", "model")
    B.write_manifest(root, {"bundle_id": "x", "format": "onnx", "artifacts": [art]})
    return root


def test_staging_refuses_existing_output_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(OutputExistsError):
        B.make_staging(out, force=False)
    assert (out / "keep.txt").read_text() == "user data"


def test_commit_is_atomic_and_force_replaces(tmp_path):
    out = tmp_path / "out"
    s1 = B.make_staging(out, force=False)
    _fake_bundle(s1)
    B.commit_staging(s1, out, force=False)
    assert B.open_bundle(out).bundle_id == "x"
    s2 = B.make_staging(out, force=True)
    (s2 / "model.bin").write_bytes(b"new")
    B.write_manifest(s2, {"bundle_id": "y", "format": "onnx",
                          "artifacts": [B.artifact_entry(s2, "model.bin", "model")]})
    B.commit_staging(s2, out, force=True)
    assert B.open_bundle(out).bundle_id == "y"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging/backup dirs left behind"


def test_tampered_artifact_is_refused(tmp_path):
    b = _fake_bundle(tmp_path)
    (b / "model.bin").write_bytes(b"weightz")
    with pytest.raises(BundleIntegrityError, match="sha256 mismatch"):
        B.open_bundle(b)


def test_path_escape_and_bad_manifest(tmp_path):
    b = _fake_bundle(tmp_path)
    m = json.loads((b / "manifest.json").read_text())
    m["artifacts"][0]["path"] = "../etc/passwd"
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleIntegrityError, match="escapes"):
        B.open_bundle(b)
    (b / "manifest.json").write_text("{not json")
    with pytest.raises(BundleIntegrityError, match="not valid JSON"):
        B.open_bundle(b)
    with pytest.raises(InputError, match="bundle not found"):
        B.open_bundle(tmp_path / "missing")
