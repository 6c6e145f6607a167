# SPDX-License-Identifier: Apache-2.0
"""The manifest is typed and checked: malformed manifests are exit 7 naming the file, never an internal
error; the schema version is enforced; the self-hash covers the fields that steer the runtime; the
shipped JSON Schema agrees with the dataclasses."""

from __future__ import annotations

import json

import pytest

from edgesdk import bundle as B
from edgesdk.errors import BundleIntegrityError
from edgesdk.manifest import (
    SCHEMA_VERSION,
    Artifact,
    EmbeddingConfig,
    LLMConfig,
    Manifest,
    content_hash,
    json_schema,
    manifest_field_names,
)


def _bundle(root, **extra):
    (root / "model.bin").write_bytes(b"weights")
    m = Manifest(
        format="onnx",
        precision="fp32",
        bundle_id="b1",
        artifacts=[B.artifact_entry(root, "model.bin", "model")],
        embedding=EmbeddingConfig(pooling="mean", normalize=True),
        **extra,
    )
    B.write_manifest(root, m)
    return root


def _raw(root):
    return json.loads((root / "manifest.json").read_text())


def _write_rehashed(root, data):
    """Write ``data`` with a correct self-hash: what a careful forger (or a hand-written manifest) gives."""
    data = dict(data)
    data["manifest_sha256"] = content_hash(data)
    (root / "manifest.json").write_text(json.dumps(data))


def test_roundtrip_and_typed_fields(tmp_path):
    b = B.open_bundle(_bundle(tmp_path, llm=LLMConfig(n_ctx=512, n_gpu_layers="all", threads=2, details={"layers": 4})))
    m = b.manifest
    assert isinstance(m, Manifest) and m.schema_version == SCHEMA_VERSION and len(m.manifest_sha256) == 64
    assert m.artifacts == [Artifact("model.bin", "model", m.artifacts[0].sha256, 7)]
    assert m.embedding == EmbeddingConfig("mean", True) and m.llm.n_ctx == 512 and m.llm.details == {"layers": 4}
    raw = _raw(tmp_path)
    assert raw["extras"]["embedding"] == {"pooling": "mean", "normalize": True}  # JSON layout kept
    assert raw["extras"]["llm"]["layers"] == 4 and raw["schema"] == "edgesdk.bundle/1"


MALFORMED = {
    "missing sha256": lambda m: m["artifacts"][0].pop("sha256"),
    "missing path": lambda m: m["artifacts"][0].pop("path"),
    "artifacts an object": lambda m: m.update(artifacts={"path": "model.bin"}),
    "artifacts a string": lambda m: m.update(artifacts="model.bin"),
    "artifacts missing": lambda m: m.pop("artifacts"),
    "artifact a string": lambda m: m.update(artifacts=["model.bin"]),
    "sha256 not hex": lambda m: m["artifacts"][0].update(sha256="zz" * 32),
    "sha256 a number": lambda m: m["artifacts"][0].update(sha256=7),
    "bytes a string": lambda m: m["artifacts"][0].update(bytes="7"),
    "bytes negative": lambda m: m["artifacts"][0].update(bytes=-1),
    "path absolute": lambda m: m["artifacts"][0].update(path="/etc/passwd"),
    "path listed twice": lambda m: m["artifacts"].append(dict(m["artifacts"][0])),
    "model a list": lambda m: m.update(model=[1]),
    "extras a string": lambda m: m.update(extras="x"),
    "pooling unknown": lambda m: m["extras"]["embedding"].update(pooling="max"),
    "normalize a string": lambda m: m["extras"]["embedding"].update(normalize="yes"),
    "n_ctx negative": lambda m: m["extras"].update(llm={"n_ctx": -5}),
    "backend_chain a string": lambda m: m.update(runtime={"backend_chain": "CPU"}),
    "io inputs not objects": lambda m: m.update(io={"inputs": [1]}),
    "schema_version missing": lambda m: m.pop("schema_version"),
    "schema_version a number": lambda m: m.update(schema_version=1.0),
    "manifest_sha256 missing": lambda m: m.pop("manifest_sha256"),
    "top level a list": None,
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_is_integrity_error_naming_the_file(tmp_path, case):
    root = _bundle(tmp_path)
    data = _raw(root)
    if MALFORMED[case] is None:
        (root / "manifest.json").write_text("[1, 2]")
    else:
        MALFORMED[case](data)
        if case != "manifest_sha256 missing":
            _write_rehashed(root, data)
        else:
            (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleIntegrityError) as err:
        B.open_bundle(root)
    assert str(root / "manifest.json") in err.value.one_line() and err.value.exit_code == 7
    assert "\n" not in err.value.one_line()


@pytest.mark.parametrize(
    "body", [b"[" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"\xff\xfe{}", b"", b"{not json", b"null"]
)
def test_unparsable_manifest_is_integrity_error(tmp_path, body):
    root = _bundle(tmp_path)
    (root / "manifest.json").write_bytes(body)
    with pytest.raises(BundleIntegrityError, match="manifest.json"):
        B.open_bundle(root)


def test_deep_nesting_through_the_cli_is_exit_7(tmp_path, run_cli):
    (tmp_path / "b").mkdir()
    root = _bundle(tmp_path / "b")
    (root / "manifest.json").write_text("[" * 100_000)
    res = run_cli("run", root, "--input", "hello")
    assert res.returncode == 7, res.stderr
    assert res.stderr.count("\n") == 1 and "manifest.json" in res.stderr and "Traceback" not in res.stderr


def test_newer_major_is_refused_older_minor_and_unknown_fields_accepted(tmp_path):
    root = _bundle(tmp_path)
    data = _raw(root)
    _write_rehashed(root, {**data, "schema_version": "2.0"})
    with pytest.raises(
        BundleIntegrityError,
        match=r"schema_version: 2.0 is newer than this edgesdk reads \(1.x\): "
        "upgrade edgesdk",
    ):
        B.open_bundle(root)
    _write_rehashed(root, {**data, "schema_version": "1.7", "signatures": [{"by": "ci"}]})
    b = B.open_bundle(root)
    assert b.manifest.schema_version == "1.7" and b.manifest.other == {"signatures": [{"by": "ci"}]}
    # ... and the unknown field is covered by the hash like every other one
    tampered = {**_raw(root), "signatures": []}
    (root / "manifest.json").write_text(json.dumps(tampered))
    with pytest.raises(BundleIntegrityError, match="manifest_sha256 mismatch"):
        B.open_bundle(root)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["extras"]["embedding"].update(pooling="cls"),
        lambda m: m["extras"]["embedding"].update(normalize=False),
        lambda m: m["runtime"].update(backend_chain=["CUDAExecutionProvider"]),
        lambda m: m.update(format="gguf"),
        lambda m: m["artifacts"].pop(),
    ],
)
def test_edits_to_steering_fields_are_refused(tmp_path, edit):
    root = _bundle(tmp_path)
    data = _raw(root)
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleIntegrityError, match="manifest_sha256 mismatch"):
        B.open_bundle(root)


def test_schema_and_dataclasses_agree():
    schema = json_schema()
    assert set(schema["properties"]) == set(manifest_field_names())
    assert set(schema["required"]) == {"schema", "schema_version", "manifest_sha256", "artifacts"}
    assert schema["properties"]["schema_version"]["pattern"] == r"^1\.[0-9]+$"
    assert set(schema["$defs"]["artifact"]["properties"]) == set(Artifact.__dataclass_fields__)
    assert set(schema["$defs"]["artifact"]["required"]) == {"path", "sha256"}
    assert schema["$defs"]["embedding"]["properties"]["pooling"]["enum"] == ["mean", "cls"]
    llm_typed = {k for k in LLMConfig.__dataclass_fields__ if k != "details"}
    assert set(schema["$defs"]["llm"]["properties"]) == llm_typed


def test_jsonschema_agrees_with_the_dataclass_checker(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")  # a dev tool only: the runtime never needs it
    validator = jsonschema.Draft202012Validator(json_schema())
    root = _bundle(tmp_path, llm=LLMConfig(n_ctx=64))
    good = _raw(root)
    assert not list(validator.iter_errors(good))
    for case, edit in MALFORMED.items():
        if edit is None or case in ("path listed twice", "path absolute", "manifest_sha256 missing"):
            continue  # value rules the schema states in words (uniqueness, relative paths)
        bad = json.loads(json.dumps(good))
        edit(bad)
        assert list(validator.iter_errors(bad)), f"schema accepts a manifest with {case}"
