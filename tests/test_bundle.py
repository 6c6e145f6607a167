# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

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
    B.write_manifest(
        s2, {"bundle_id": "y", "format": "onnx", "artifacts": [B.artifact_entry(s2, "model.bin", "model")]}
    )
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


# ------------------------------------------------------------------------------------------ verification gaps


def _rewrite(root, edit):
    """Edit the manifest and write it back through write_manifest (a correct self-hash: a careful forger)."""
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    data.pop("manifest_sha256")
    B.write_manifest(root, data)


def test_symlinked_artifact_with_updated_hash_is_refused(tmp_path):
    (tmp_path / "b").mkdir()
    b = _fake_bundle(tmp_path / "b")
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"outside the bundle")
    (b / "model.bin").unlink()
    os.symlink(outside, b / "model.bin")
    _rewrite(b, lambda m: m["artifacts"][0].update(sha256=B.sha256_file(outside), bytes=outside.stat().st_size))
    with pytest.raises(BundleIntegrityError, match="model.bin: is a symbolic link"):
        B.open_bundle(b)


def test_symlinked_directory_on_the_path_is_refused(tmp_path):
    b = tmp_path / "b"
    (b).mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "w.bin").write_bytes(b"w")
    os.symlink(tmp_path / "elsewhere", b / "sub")
    B.write_manifest(b, {"format": "onnx", "artifacts": [B.artifact_entry(b, "sub/w.bin", "model")]})
    with pytest.raises(BundleIntegrityError, match=r"sub/w.bin: is a symbolic link \(sub\)"):
        B.open_bundle(b)


def test_hard_linked_artifact_is_refused(tmp_path):
    (tmp_path / "b").mkdir()
    b = _fake_bundle(tmp_path / "b")
    os.link(b / "model.bin", tmp_path / "alias.bin")
    with pytest.raises(BundleIntegrityError, match="2 hard links"):
        B.open_bundle(b)


def test_fifo_and_symlinked_manifest_are_refused_without_hanging(tmp_path):
    (tmp_path / "b").mkdir()
    b = _fake_bundle(tmp_path / "b")
    (b / "model.bin").unlink()
    os.mkfifo(b / "model.bin")
    with pytest.raises(BundleIntegrityError, match="is a FIFO"):
        B.open_bundle(b)
    (tmp_path / "c").mkdir()
    c = _fake_bundle(tmp_path / "c")
    os.replace(c / "manifest.json", tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", c / "manifest.json")
    with pytest.raises(BundleIntegrityError, match="manifest.json: is a symbolic link"):
        B.open_bundle(c)


def test_unlisted_file_is_never_read(tmp_path):
    b = _fake_bundle(tmp_path)
    bundle = B.open_bundle(b)
    assert bundle.read_bytes("tokenizer.json") is None and bundle.file("tokenizer.json") is None  # absent: fine
    (b / "tokenizer.json").write_text("{}")  # present but not listed: refused
    with pytest.raises(BundleIntegrityError, match="tokenizer.json is present but not listed"):
        bundle.read_bytes("tokenizer.json")
    with pytest.raises(BundleIntegrityError, match="not listed"):
        bundle.file("tokenizer.json")
    assert bundle.read_bytes("model.bin") == b"weights"
    (b / "model.bin").write_bytes(b"weightz")  # swapped after open_bundle: hashed again on read
    with pytest.raises(BundleIntegrityError, match="sha256 mismatch"):
        bundle.read_bytes("model.bin")


@pytest.fixture
def minilm_copy(minilm_orin_bundle, tmp_path):
    out = tmp_path / "minilm"
    shutil.copytree(minilm_orin_bundle, out)
    return out


def test_tokenizer_dropped_from_manifest_then_altered_is_refused(minilm_copy):
    import edgesdk

    _rewrite(minilm_copy, lambda m: m.update(artifacts=[a for a in m["artifacts"] if a["path"] != "tokenizer.json"]))
    tok = json.loads((minilm_copy / "tokenizer.json").read_text())
    tok["model"]["vocab"]["hello"] = 0
    (minilm_copy / "tokenizer.json").write_text(json.dumps(tok))
    with (
        edgesdk.load(minilm_copy) as s,
        pytest.raises(BundleIntegrityError, match="tokenizer.json is present but not listed"),
    ):
        s.embed("hello world")


def test_pooling_mode_edited_is_refused(minilm_copy, run_cli):
    import edgesdk

    with edgesdk.load(minilm_copy) as s:
        assert s.bundle.manifest.embedding.pooling == "mean"
    m = json.loads((minilm_copy / "manifest.json").read_text())
    m["extras"]["embedding"]["pooling"] = "cls"
    (minilm_copy / "manifest.json").write_text(json.dumps(m, indent=2))
    with pytest.raises(BundleIntegrityError, match="manifest_sha256 mismatch"):
        edgesdk.load(minilm_copy)
    res = run_cli("run", minilm_copy, "--input", "hello")
    assert res.returncode == 7 and "manifest_sha256 mismatch" in res.stderr


# ------------------------------------------------------------------------------------------ staging and lock


def _owner_file(staging, pid, host=None):
    staging.mkdir()
    (staging / "junk.bin").write_bytes(b"x" * 100)
    staging.with_name(staging.name + ".owner").write_text(
        json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": 0, "proc_start": None})
    )


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_staging_of_dead_builds_is_removed_only_ours_only_stale(tmp_path):
    out = tmp_path / "out"
    _owner_file(tmp_path / ".out.staging-dead", _dead_pid())
    _owner_file(tmp_path / ".out.staging-live", os.getpid())
    _owner_file(tmp_path / ".out.staging-otherhost", _dead_pid(), host="some-other-host")
    (tmp_path / ".out.staging-nomarker").mkdir()
    (tmp_path / ".other.staging-dead").mkdir()  # another output's: not even looked at
    staging = B.make_staging(out, force=False)
    names = {p.name for p in tmp_path.iterdir()}
    assert ".out.staging-dead" not in names and ".out.staging-dead.owner" not in names
    assert {".out.staging-live", ".out.staging-otherhost", ".out.staging-nomarker", ".other.staging-dead"} <= names
    assert (tmp_path / (staging.name + ".owner")).is_file()
    B.discard_staging(staging)
    assert not staging.exists() and not (tmp_path / (staging.name + ".owner")).exists()


def test_dead_force_build_puts_the_old_bundle_back(tmp_path):
    out = tmp_path / "out"
    backup = tmp_path / f".out.old-{_dead_pid()}"
    backup.mkdir()
    _fake_bundle(backup)
    B.make_staging(out, force=True)
    assert B.open_bundle(out).bundle_id == "x" and not backup.exists()


def test_second_writer_of_one_output_fails_with_exit_4(tmp_path):
    out = tmp_path / "out"
    with B.output_lock(out) as lock:
        assert lock.is_file()
        with pytest.raises(OutputExistsError, match=rf"another edgesdk build is writing {out} \(pid {os.getpid()}"):
            with B.output_lock(out):
                pass
    assert not lock.exists()
    with B.output_lock(out):  # free again
        pass
    assert list(tmp_path.iterdir()) == []
