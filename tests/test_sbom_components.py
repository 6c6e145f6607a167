# SPDX-License-Identifier: Apache-2.0
"""Per-component SBOM entries: each component file of a multi-file bundle (a VLM's mmproj, decoder and
preprocessor config) is listed with its own license and SHA-256 in the CycloneDX and SPDX SBOMs and in
the license report. Checked on a real VLM build (the random-weight tiny LLaVA of tests/vlm_fixtures.py)
and on two GGUFs that declare different licenses."""

from __future__ import annotations

import json

import pytest
from waiver_fixtures import license_gguf

from edgesdk.compliance.components import MODEL_FALLBACK, component_labels
from edgesdk.compliance.gate import scan_licenses
from edgesdk.compliance.report import to_html, to_markdown
from edgesdk.compliance.sbom import build_sbom, build_spdx, check_spdx, validate_sbom

LABELS = {
    "mmproj.gguf": "vision_encoder + projector",
    "model.gguf": "decoder",
    "preprocessor_config.json": "image_preprocessor",
}


def test_labels_come_from_format_components_then_artifact_roles():
    extras = {
        "vlm": {
            "components": {
                "vision_encoder": {"artifact": "mmproj.gguf"},
                "projector": {"artifact": "mmproj.gguf", "type": "mlp"},
                "decoder": {"artifact": "model.gguf"},
            }
        },
        "llm": {"n_ctx": 512},
    }
    artifacts = [
        {"path": "model.gguf", "role": "model"},
        {"path": "mmproj.gguf", "role": "mmproj"},
        {"path": "preprocessor_config.json", "role": "config"},
        {"path": "sbom.cdx.json", "role": "sbom"},
        {"path": "license-report.json", "role": "license-report"},
    ]
    assert component_labels(extras, artifacts) == {
        "mmproj.gguf": "vision_encoder + projector",
        "model.gguf": "decoder",
        "preprocessor_config.json": "config",
    }


def test_each_component_keeps_its_own_license_in_both_sboms(tmp_path):
    pytest.importorskip("gguf")
    bundle = tmp_path / "b"
    bundle.mkdir()
    license_gguf(bundle / "mmproj.gguf", "mit")
    license_gguf(bundle / "model.gguf", "apache-2.0")
    (bundle / "preprocessor_config.json").write_text('{"size": {"height": 64, "width": 64}}')
    result = scan_licenses(bundle, bundle=True, components=LABELS)
    assert result.verdict == "pass", [f.to_dict() for f in result.findings]
    parts = {c["path"]: c for c in result.components}
    assert set(parts) == set(LABELS)
    assert (parts["mmproj.gguf"]["license"], parts["model.gguf"]["license"]) == ("MIT", "Apache-2.0")
    assert parts["mmproj.gguf"]["license_source"] == "GGUF general.license*"
    # the config has no declaration of its own: the model's license (both GGUFs') covers it
    assert parts["preprocessor_config.json"]["license"] == result.model_expression
    assert parts["preprocessor_config.json"]["license_source"] == MODEL_FALLBACK
    import hashlib

    for rel, part in parts.items():
        assert part["sha256"] == hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
        assert part["component"] == LABELS[rel]

    cdx_text = build_sbom("b", result.findings, result.components, result.vendored, result.model_expression)
    assert validate_sbom(cdx_text) is None
    cdx = json.loads(cdx_text)
    model = next(c for c in cdx["components"] if c["bom-ref"] == "model")
    files = {c["name"]: c for c in model["components"]}
    assert files["mmproj.gguf"]["licenses"] == [{"expression": "MIT"}]
    assert files["model.gguf"]["licenses"] == [{"expression": "Apache-2.0"}]
    assert files["mmproj.gguf"]["hashes"] == [{"alg": "SHA-256", "content": parts["mmproj.gguf"]["sha256"]}]
    props = {p["name"]: p["value"] for p in files["mmproj.gguf"]["properties"]}
    assert props["edgesdk:component"] == "vision_encoder + projector"

    spdx = json.loads(build_spdx("b", result.findings, result.components, result.vendored, result.model_expression))
    assert check_spdx(spdx) == []
    pkgs = {p["name"]: p for p in spdx["packages"]}
    assert pkgs["mmproj.gguf"]["licenseDeclared"] == "MIT" and pkgs["model.gguf"]["licenseConcluded"] == "Apache-2.0"
    assert pkgs["preprocessor_config.json"]["checksums"] == [
        {"algorithm": "SHA256", "checksumValue": parts["preprocessor_config.json"]["sha256"]}
    ]
    model_id = pkgs["b model"]["SPDXID"]
    contained = {
        r["relatedSpdxElement"]
        for r in spdx["relationships"]
        if r["spdxElementId"] == model_id and r["relationshipType"] == "CONTAINS"
    }
    assert {pkgs[n]["SPDXID"] for n in LABELS} <= contained
    assert "vision_encoder + projector" in to_markdown(result) and 'id="components"' in to_html(result)


def test_a_bundle_without_component_labels_still_lists_its_weight_files(tmp_path):
    pytest.importorskip("gguf")
    license_gguf(tmp_path / "model.gguf", "apache-2.0")
    result = scan_licenses(tmp_path, bundle=True)
    assert [(c["path"], c["component"], c["license"]) for c in result.components] == [
        ("model.gguf", "weights", "Apache-2.0")
    ]


@pytest.fixture(scope="module")
def vlm_bundle(vlm_q8_bundle):
    """tests/conftest.py's tiny LLaVA Q8_0 build, once per session (read-only: copy it before changing it)."""
    return vlm_q8_bundle


@pytest.mark.slow
def test_vlm_bundle_sboms_and_report_list_each_component(vlm_bundle, run_cli):
    manifest = json.loads((vlm_bundle / "manifest.json").read_text())
    sha = {a["path"]: a["sha256"] for a in manifest["artifacts"]}
    want = {
        "mmproj.gguf": "vision_encoder + projector",
        "model.gguf": "decoder",
        "preprocessor_config.json": "image_preprocessor",
    }

    cdx_text = (vlm_bundle / "sbom.cdx.json").read_text()
    assert validate_sbom(cdx_text) is None
    model = next(c for c in json.loads(cdx_text)["components"] if c["bom-ref"] == "model")
    files = {c["name"]: c for c in model["components"]}
    assert set(want) <= set(files)
    for rel, label in want.items():
        props = {p["name"]: p["value"] for p in files[rel]["properties"]}
        assert props["edgesdk:component"] == label
        assert files[rel]["hashes"] == [{"alg": "SHA-256", "content": sha[rel]}]
        assert files[rel]["licenses"] == [{"expression": "Apache-2.0"}]  # the fixture's card: apache-2.0
    # the GGUFs carry general.license (written from the model card); the config is covered by the model's
    assert {p["name"]: p["value"] for p in files["mmproj.gguf"]["properties"]}[
        "edgesdk:license-source"
    ] == "GGUF general.license*"

    spdx = json.loads((vlm_bundle / "sbom.spdx.json").read_text())
    assert check_spdx(spdx) == []
    pkgs = {p["name"]: p for p in spdx["packages"]}
    for rel, label in want.items():
        assert pkgs[rel]["checksums"] == [{"algorithm": "SHA256", "checksumValue": sha[rel]}]
        assert pkgs[rel]["licenseConcluded"] == "Apache-2.0" and pkgs[rel]["summary"] == f"component: {label}"

    report = json.loads((vlm_bundle / "license-report.json").read_text())
    listed = {c["path"]: c for c in report["components"]}
    assert {rel: (c["component"], c["sha256"]) for rel, c in listed.items()} == {
        rel: (label, sha[rel]) for rel, label in want.items()
    }

    # edgesdk check licenses on the bundle reads the components from its manifest
    proc = run_cli("check", "licenses", str(vlm_bundle), "--json")
    assert proc.returncode == 0, proc.stderr
    again = {c["path"]: c["component"] for c in json.loads(proc.stdout)["components"]}
    assert again == want
