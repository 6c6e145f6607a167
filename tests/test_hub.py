# SPDX-License-Identifier: Apache-2.0
"""``edgesdk build org/name``: a Hugging Face model id from the local cache, or downloaded (issue 39, item 13).

The cache here is built as huggingface_hub lays it out (``models--org--name/{blobs,refs/main,snapshots/<rev>}``,
each snapshot file a relative symlink into ``blobs/``) from the real all-MiniLM-L6-v2 files; HF_HUB_CACHE points at
it. No test touches the network: a download is huggingface_hub's public functions replaced in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgesdk import hub
from edgesdk.errors import ModelError

REVISION = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "sentence-transformers/all-MiniLM-L6-v2"


def populate(cache: Path, repo_id: str, files: Path, revision: str = REVISION, ref: bool = True) -> Path:
    """``files`` (a model directory) stored in ``cache`` as the hub stores a download; the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in files.rglob("*") if p.is_file()):
        rel = f.relative_to(files)
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture(scope="module")
def hf_cache(minilm_dir, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    populate(cache, REPO_ID, minilm_dir)
    return cache


@pytest.fixture
def env(monkeypatch, hf_cache, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no local path named like the id
    return monkeypatch


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys):
    """The real CLI entry point in this process (so the replaced huggingface_hub functions are the ones called)."""
    from edgesdk.cli import main

    def _run(*args: str) -> Result:
        capsys.readouterr()
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return _run


# ------------------------------------------------------------------------------------------- where it looks


def test_cache_dir_follows_the_hub_variables(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub.cache_dir() == tmp_path / "c"


def test_which_arguments_are_model_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.model_id("org/name") == "org/name"
    assert hub.model_id("hf://org/name") == "org/name"
    assert hub.model_id("Org_1/my.model-v2") == "Org_1/my.model-v2"
    for path in ("model", "a/b/c", "./org/name", "/org/name", "out/model.onnx", "x/y.gguf", "a--b/c", "a/..b", "-a/b"):
        assert hub.model_id(path) is None, path
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub.model_id("org/name") is None  # a local directory of that name wins
    assert hub.model_id("hf://org/name") == "org/name"  # unless the hub is asked for
    with pytest.raises(ModelError, match="not a Hugging Face model id"):
        hub.model_id("hf://a/b/c")


def test_refs_main_names_the_snapshot(tmp_path, minilm_dir):
    cache = tmp_path / "hub"
    small = tmp_path / "src"
    small.mkdir()
    (small / "config.json").write_text("{}")
    populate(cache, "a/b", small, revision="1" * 40)
    populate(cache, "a/b", small, revision="2" * 40)  # refs/main now names the second
    assert hub.cached("a/b", cache) == (cache / "models--a--b" / "snapshots" / ("2" * 40), "2" * 40)
    (cache / "models--a--b" / "refs" / "main").unlink()
    assert hub.cached("a/b", cache) is None  # two snapshots and no ref: which one is unknown
    populate(cache, "c/d", small, revision="3" * 40, ref=False)
    assert hub.cached("c/d", cache) == (cache / "models--c--d" / "snapshots" / ("3" * 40), "3" * 40)
    assert hub.cached("e/f", cache) is None


# ------------------------------------------------------------------------------------------- edgesdk build


def test_build_plan_from_the_cache(env, hf_cache, cli):
    r = cli("build", REPO_ID, "--profile", "orin", "--plan-only", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    snapshot = hf_cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / REVISION
    assert plan["model"]["source"] == str(snapshot)
    assert plan["model"]["name"] == "all-MiniLM-L6-v2"  # not the revision hash
    assert plan["model"]["task"] == "feature-extraction"
    assert plan["model"]["extra"]["hub"] == {"id": REPO_ID, "revision": REVISION, "source": REPO_ID}
    assert plan["format"] == "onnx"


def test_hf_scheme_is_printed_as_written(env, cli):
    r = cli("build", f"hf://{REPO_ID}", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 0, r.stderr
    assert f"model hf://{REPO_ID}: revision {REVISION[:12]} from the Hugging Face cache" in r.stderr
    r = cli("build", f"hf://{REPO_ID}", "--profile", "cpu", "--plan-only", "--name", "minilm", "--json")
    assert json.loads(r.stdout)["model"]["name"] == "minilm"  # --name still wins
    assert json.loads(r.stdout)["model"]["extra"]["hub"]["source"] == f"hf://{REPO_ID}"


def test_a_local_directory_wins_over_the_id(env, tmp_path, minilm_dir, cli):
    local = tmp_path / "sentence-transformers" / "all-MiniLM-L6-v2"
    shutil.copytree(minilm_dir, local, ignore=shutil.ignore_patterns("*.safetensors"))
    (local / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    r = cli("build", REPO_ID, "--profile", "cpu", "--plan-only", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["model"]["source"] == REPO_ID  # the relative path, not the cache
    assert "Hugging Face cache" not in r.stderr


def test_offline_miss_is_one_line_exit_3_naming_the_cache(env, hf_cache, cli):
    r = cli("build", "nobody/nothing", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model not found: nobody/nothing:")
    assert str(hf_cache) in lines[0] and "HF_HUB_OFFLINE is set" in lines[0]
    r = cli("build", "hf://nobody/nothing", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3 and "model not found: hf://nobody/nothing:" in r.stderr
    r = cli("build", "hf://a/b/c", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3 and "hf://a/b/c: not a Hugging Face model id" in r.stderr


def test_a_missing_model_file_is_still_model_not_found(env, cli):
    r = cli("build", "out/model.onnx", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3 and "model not found: out/model.onnx" in r.stderr
    assert "Hugging Face" not in r.stderr


# ------------------------------------------------------------------------------------------- downloads


@pytest.fixture
def fake_hub(monkeypatch, tmp_path, minilm_dir):
    """huggingface_hub's list_repo_files/snapshot_download replaced: the repo is MiniLM plus files the build
    never reads; a download populates the cache as the real one would and records its arguments."""
    import huggingface_hub

    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    calls: list = []
    repo_files = [str(p.relative_to(minilm_dir)) for p in minilm_dir.rglob("*") if p.is_file()]
    repo_files += ["pytorch_model.bin", "tf_model.h5", "onnx/model.onnx"]

    def list_repo_files(repo_id, **kw):
        if repo_id != REPO_ID:
            from huggingface_hub.errors import RepositoryNotFoundError

            raise RepositoryNotFoundError("404 Client Error.\n\nRepository Not Found for url: ...")
        return repo_files

    def snapshot_download(repo_id, *, cache_dir=None, ignore_patterns=None, **kw):
        calls.append({"repo_id": repo_id, "cache_dir": Path(cache_dir), "ignore_patterns": ignore_patterns})
        return str(populate(Path(cache_dir), repo_id, minilm_dir, revision="f" * 40))

    monkeypatch.setattr(huggingface_hub, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return cache, calls


def test_an_id_not_in_the_cache_is_downloaded_once(fake_hub, cli):
    cache, calls = fake_hub
    r = cli("build", REPO_ID, "--profile", "cpu", "--plan-only", "--json")
    assert r.exit_code == 0, r.stderr
    assert f"not in the Hugging Face cache {cache}: downloading {REPO_ID}" in r.stderr
    assert len(calls) == 1 and calls[0]["cache_dir"] == cache
    assert {"*.h5", "onnx/*", "*.bin"} <= set(calls[0]["ignore_patterns"])  # safetensors there: no pickle
    assert json.loads(r.stdout)["model"]["extra"]["hub"]["revision"] == "f" * 40
    r = cli("build", REPO_ID, "--profile", "cpu", "--plan-only")
    assert r.exit_code == 0 and len(calls) == 1  # the second time from the cache
    assert "from the Hugging Face cache" in r.stderr


def test_a_failed_download_is_one_line_exit_3(fake_hub, cli):
    cache, calls = fake_hub
    r = cli("build", "nobody/nothing", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3 and calls == []
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "model not found: nobody/nothing:" in lines[0] and str(cache) in lines[0]
    assert "no such repository" in lines[0]


def test_a_repository_without_config_json_is_refused_before_downloading(fake_hub, monkeypatch, cli):
    import huggingface_hub

    cache, calls = fake_hub
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id, **kw: ["a-Q4_K_M.gguf", "README.md"])
    r = cli("build", "org/some-GGUF", "--profile", "cpu", "--plan-only")
    assert r.exit_code == 3 and calls == []
    assert "has no config.json" in r.stderr and "1 .gguf files" in r.stderr


# ------------------------------------------------------------------------------------------- a real build


@pytest.mark.slow
def test_a_real_build_of_a_cached_id(hf_cache, tmp_path, run_cli):
    """The whole `edgesdk build org/name` in a subprocess, from the symlinked snapshot, then `edgesdk run`."""
    env = {"HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    r = run_cli("build", REPO_ID, "--profile", "cpu", "-o", "out/minilm", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"model {REPO_ID}: revision {REVISION[:12]} from the Hugging Face cache" in r.stderr
    manifest = json.loads((tmp_path / "out" / "minilm" / "manifest.json").read_text())
    assert manifest["model"]["name"] == "all-MiniLM-L6-v2"
    assert manifest["model"]["extra"]["hub"] == {"id": REPO_ID, "revision": REVISION, "source": REPO_ID}
    assert manifest["license"]["verdict"] == "pass"
    r = run_cli("run", "out/minilm", "--input", "hello", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
