# SPDX-License-Identifier: Apache-2.0
"""``LenientManifest``: a manifest read as found (``check licenses`` on a damaged or edited bundle, ``build --force``
recognising a bundle) never raises; a missing key or one of another type reads as not recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.compliance.components import component_labels
from edgesdk.compliance.gate import scan_licenses
from edgesdk.manifest import SCHEMA, Artifact, ArtifactRecord, LenientManifest, LicenseRecord, component_table


def test_a_manifest_as_written_reads_in_full():
    found = LenientManifest.from_json(
        {
            "schema": SCHEMA,
            "model": {"name": "m", "source": "/models/gemma.gguf"},
            "artifacts": [{"path": "model.gguf", "role": "model"}, {"path": "sbom.cdx.json", "role": "sbom"}],
            "extras": {"vlm": {"components": {"decoder": {"artifact": "model.gguf"}}}},
            "license": {
                "runtime_distributions": ["llama-cpp-python"],
                "accepted": ["LicenseRef-x"],
                "model_license_declared": "Apache-2.0",
            },
        }
    )
    assert found.schema == SCHEMA and found.model_source == "/models/gemma.gguf"
    assert found.artifacts == [ArtifactRecord("model.gguf", "model"), ArtifactRecord("sbom.cdx.json", "sbom")]
    assert found.license == LicenseRecord(["llama-cpp-python"], ["LicenseRef-x"], "Apache-2.0")
    assert component_table(found.extras) == {"model.gguf": ["decoder"]}
    assert component_labels(found.extras, found.artifacts) == {"model.gguf": "decoder"}


@pytest.mark.parametrize(
    "data",
    [
        None,
        5,
        "text",
        [],
        {},
        {"schema": 1, "artifacts": 5, "extras": [], "model": "m", "license": 3},
        {"artifacts": {"path": "x"}, "model": {"source": 7}, "extras": {"vlm": 3, "x": {"components": [1]}}},
        {"artifacts": [3, None, {"path": 5, "role": ["list"]}], "extras": {"f": {"components": {"a": 3, "b": {}}}}},
        {"license": {"runtime_distributions": [], "accepted": 5, "model_license_declared": 5}},
        {"license": {"runtime_distributions": [], "accepted": "MIT", "model_license_declared": ""}},
    ],
)
def test_damage_reads_as_not_recorded(data):
    found = LenientManifest.from_json(data)
    assert found.schema is None and found.model_source is None
    assert found.license == LicenseRecord()
    assert all(a.path is None for a in found.artifacts)
    assert component_labels(found.extras, found.artifacts) == {}


def test_artifact_records_keep_what_component_labels_read():
    assert ArtifactRecord.of(Artifact("a.onnx", "model", "0" * 64, 1)) == ArtifactRecord("a.onnx", "model")
    assert ArtifactRecord.of({"path": "a", "role": None}) == ArtifactRecord("a", "")
    assert ArtifactRecord.of({"path": "a", "role": 2}) == ArtifactRecord("a", "2")
    assert component_labels({}, [{"path": "a", "role": 0}, {"path": "b", "role": [1]}]) == {"a": "file", "b": "[1]"}


def test_the_license_section_is_found_wherever_it_is():
    nested = {"other": [{"x": 1}, {"runtime_distributions": ["a"], "accepted": ["MIT", 3]}]}
    assert LenientManifest.from_json(nested).license == LicenseRecord(["a"], ["MIT"], None)
    assert LenientManifest.from_json([nested]).license == LicenseRecord(["a"], ["MIT"], None)


def test_check_licenses_scans_a_bundle_whose_manifest_has_wrong_types(tmp_path: Path) -> None:
    """Values that made ``scan_licenses`` raise TypeError before the reads moved to LenientManifest."""
    (tmp_path / "manifest.json").write_text(
        json.dumps(
            {
                "artifacts": 5,
                "extras": {"vlm": {"components": {"d": {"artifact": "m.bin"}}}},
                "license": {"runtime_distributions": [], "accepted": 5},
            }
        )
    )
    (tmp_path / "m.bin").write_bytes(b"\0" * 16)
    result = scan_licenses(tmp_path)
    assert result.mode == "bundle" and result.accepted_at_build == []
    assert [c["component"] for c in result.components] == ["d"]
