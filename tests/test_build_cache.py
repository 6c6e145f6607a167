# SPDX-License-Identifier: Apache-2.0
"""The shared build cache (issue 36, item 4): ``edgesdk build ... --cache oci://REGISTRY/NS/NAME`` against a real
registry on loopback (Debian's ``docker-registry``). The builds repackage the registry Gemma GGUF (1-2 s each):

* a miss builds and pushes under ``cache-<key>``; the same build on a fresh store (another "machine": a new
  ``EDGESDK_HOME`` and output directory, same bundle name) hits and writes the same bundle, file for file;
* another profile, option or output name is another key (a miss);
* a cached blob changed in the registry: exit 7, nothing at the output, nothing in the store;
* a registry that is away: a warning and a normal build; bad ``--cache`` values and ``--plan-only --cache``:
  exit 3, one line; a hit onto an existing output without ``--force``: exit 4.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_distribution import REGISTRY, Registry

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REGISTRY is None, reason="no docker-registry binary (make setup installs Debian's)"),
]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    r = Registry(tmp_path_factory.mktemp("cache-registry"))
    yield r
    r.stop()


def build(source: Path, out: Path, cache: str, home: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGESDK_HOME": str(home)}
    cmd = [sys.executable, "-m", "edgesdk", "build", str(source), "--profile", "cpu-x86_64", "-o", str(out),
           "--accept-license", "LicenseRef-gemma", "--no-progress", "--cache", cache, *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def as_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["cache"]


def same_tree(a: Path, b: Path) -> bool:
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all(filecmp.cmp(a / f, b / f, shallow=False) for f in fa)


def test_a_miss_pushes_and_a_fresh_store_hits(registry, gemma_gguf, tmp_path):
    cache = registry.ref("cache/gemma")
    first = as_json(build(gemma_gguf, tmp_path / "ci1" / "gemma", cache, tmp_path / "home1", "--json"))
    assert first["hit"] is False and first["pushed"] is True and first["reference"].endswith(f":cache-{first['key']}")
    assert first["key_record"]["source_sha256"] and "source" not in first["key_record"]["plan"]["model"]
    again = as_json(build(gemma_gguf, tmp_path / "ci2" / "gemma", cache, tmp_path / "home2", "--json"))
    assert again["hit"] is True and again["key"] == first["key"] and again["digest"] == first["digest"]
    assert same_tree(tmp_path / "ci1" / "gemma", tmp_path / "ci2" / "gemma")
    assert not list((tmp_path / "ci2").glob(".gemma*"))  # no staging or lock left
    # the text output says hit / miss on stderr, the build summary on stdout as without the cache
    text = build(gemma_gguf, tmp_path / "ci3" / "gemma", cache, tmp_path / "home3")
    assert text.returncode == 0 and "build cache: hit" in text.stderr and text.stdout.startswith("bundle: ")
    # another option, profile or output name is another key
    other = as_json(build(gemma_gguf, tmp_path / "ci4" / "gemma", cache, tmp_path / "home4", "--json", "--name", "g2"))
    assert other["hit"] is False and other["key"] != first["key"]
    renamed = as_json(build(gemma_gguf, tmp_path / "ci5" / "gemma-b", cache, tmp_path / "home5", "--json"))
    assert renamed["hit"] is False and renamed["key"] != first["key"]
    # a hit onto an existing output needs --force, as a build does
    exists = build(gemma_gguf, tmp_path / "ci2" / "gemma", cache, tmp_path / "home6")
    assert exists.returncode == 4 and exists.stderr.count("\n") == 1 and "exists" in exists.stderr
    forced = as_json(build(gemma_gguf, tmp_path / "ci2" / "gemma", cache, tmp_path / "home6", "--json", "--force"))
    assert forced["hit"] is True


def test_a_tampered_cache_entry_is_refused(registry, gemma_gguf, tmp_path):
    cache = registry.ref("cache/tamper")
    first = as_json(build(gemma_gguf, tmp_path / "a" / "gemma", cache, tmp_path / "h1", "--json"))
    manifest = json.loads(registry.blob(first["digest"]).read_bytes())
    layer = next(x for x in manifest["layers"] if x["annotations"]["org.opencontainers.image.title"] == "sbom.cdx.json")
    blob = registry.blob(layer["digest"])
    original = blob.read_bytes()
    try:
        blob.write_bytes(original.replace(b"{", b"[", 1))
        proc = build(gemma_gguf, tmp_path / "b" / "gemma", cache, tmp_path / "h2")
        assert proc.returncode == 7 and proc.stderr.count("\n") == 1 and "not used" in proc.stderr, proc.stderr
        assert not (tmp_path / "b" / "gemma").exists()
        assert not [p for p in (tmp_path / "h2" / "bundles").iterdir() if not p.name.startswith(".partial-")]
    finally:
        blob.write_bytes(original)


def test_an_unreachable_cache_builds_and_bad_values_are_one_line(gemma_gguf, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    away = as_json(build(gemma_gguf, tmp_path / "o" / "gemma", f"oci://127.0.0.1:{port}/c/x", tmp_path / "h", "--json"))
    assert away["hit"] is False and away["pushed"] is False and "not reachable" in away["note"]
    assert (tmp_path / "o" / "gemma" / "manifest.json").is_file()
    for value, needle in (
        ("http://127.0.0.1:5000/c/x", "expected oci://REGISTRY/NAMESPACE/NAME"),
        ("oci://127.0.0.1:5000/c/x:tag", "name a repository, not a tag"),
        ("oci://Bad/UPPER", "not an OCI reference"),
    ):
        proc = build(gemma_gguf, tmp_path / "bad" / "gemma", value, tmp_path / "h")
        assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
        assert not (tmp_path / "bad").exists()
    env = {**os.environ, "EDGESDK_HOME": str(tmp_path / "h")}
    plan_only = subprocess.run([sys.executable, "-m", "edgesdk", "build", str(gemma_gguf), "--profile", "cpu-x86_64",
                                "--plan-only", "--cache", "oci://127.0.0.1:5000/c/x"],
                               capture_output=True, text=True, env=env)  # fmt: skip
    assert plan_only.returncode == 3 and "--plan-only builds nothing, so --cache" in plan_only.stderr
