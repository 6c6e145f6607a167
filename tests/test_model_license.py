# SPDX-License-Identifier: Apache-2.0
"""`edgesdk build --model-license`: a first-party model that declares no license gets one from the
builder, recorded in the manifest and the SBOM and judged by the same policy; a LicenseRef for a
company's own terms needs a policy entry, and the error says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_profiler import make_mlp_bundle  # tests/ is on sys.path (rootdir conftest)


@pytest.fixture(scope="module")
def unlicensed_onnx(tmp_path_factory) -> Path:
    """A real ONNX graph with no license anywhere (no metadata_props, no card)."""
    src = make_mlp_bundle(tmp_path_factory.mktemp("unlicensed") / "src") / "model.onnx"
    from edgesdk.compliance.models import read_onnx_metadata

    assert "license" not in read_onnx_metadata(src)
    return src


def _license_section(manifest: dict) -> dict:
    from edgesdk.compliance.gate import _manifest_license_section

    return _manifest_license_section(manifest)


def _error(done) -> str:
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.slow
def test_without_a_declared_license_the_deny_names_the_option(unlicensed_onnx, tmp_path, run_cli):
    done = run_cli("build", unlicensed_onnx, "--profile", "cpu-x86_64", "-o", tmp_path / "b", "--no-progress")
    assert done.returncode == 2
    line = _error(done)
    assert "no license" in line and "--model-license SPDX-OR-LicenseRef" in line
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_declared_license_is_recorded_in_manifest_and_sbom_and_checked_later(unlicensed_onnx, tmp_path, run_cli):
    out = tmp_path / "b"
    done = run_cli(
        "build", unlicensed_onnx, "--profile", "cpu-x86_64", "-o", out, "--no-progress", "--model-license", "apache-2.0"
    )
    assert done.returncode == 0, done.stderr
    section = _license_section(json.loads((out / "manifest.json").read_text()))
    assert section["model_license_declared"] == "Apache-2.0" and section["model_license"] == "Apache-2.0"
    sbom = json.loads((out / "sbom.cdx.json").read_text())
    (model,) = [c for c in sbom["components"] if c["type"] == "machine-learning-model"]
    assert model["licenses"] == [{"expression": "Apache-2.0"}]
    assert {"name": "edgesdk:model-license-declared", "value": "Apache-2.0"} in model["properties"]
    from edgesdk.compliance.sbom import validate_sbom

    assert validate_sbom((out / "sbom.cdx.json").read_text()) is None
    checked = run_cli("check", "licenses", out, "--json")  # no option: the manifest carries the declaration
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["model_license_declared"] == "Apache-2.0"
    assert [f["source"] for f in report["findings"] if f["layer"] == "model"] == [
        "--model-license (declared by whoever built the bundle)"
    ]


@pytest.mark.slow
def test_proprietary_license_ref_needs_a_policy_entry(unlicensed_onnx, tmp_path, run_cli):
    out = tmp_path / "b"
    denied = run_cli(
        "build",
        unlicensed_onnx,
        "--profile",
        "cpu-x86_64",
        "-o",
        out,
        "--no-progress",
        "--model-license",
        "LicenseRef-acme-proprietary",
    )
    assert denied.returncode == 2
    line = _error(denied)
    assert "licenses: {LicenseRef-acme-proprietary: allow}" in line and "--license-policy FILE" in line
    assert not out.exists() and not (tmp_path / "b.license-report.json").exists()  # refused before building
    policy = tmp_path / "policy.yaml"
    policy.write_text("licenses:\n  LicenseRef-acme-proprietary: allow\n")
    done = run_cli(
        "build",
        unlicensed_onnx,
        "--profile",
        "cpu-x86_64",
        "-o",
        out,
        "--no-progress",
        "--model-license",
        "LicenseRef-acme-proprietary",
        "--license-policy",
        policy,
    )
    assert done.returncode == 0, done.stderr
    assert (
        _license_section(json.loads((out / "manifest.json").read_text()))["model_license"]
        == "LicenseRef-acme-proprietary"
    )
    assert run_cli("check", "licenses", out, "--policy", policy).returncode == 0
    assert run_cli("check", "licenses", out).returncode == 2  # the default policy still denies it


def test_free_text_is_not_a_license_expression(unlicensed_onnx, tmp_path, run_cli):
    done = run_cli(
        "build", unlicensed_onnx, "--profile", "cpu-x86_64", "-o", tmp_path / "b", "--model-license", "our own terms"
    )
    assert done.returncode == 3
    assert "not an SPDX license expression or LicenseRef-<id>" in _error(done)


def test_declaration_adds_to_what_the_model_declares():
    """A card or metadata license stays: --model-license cannot replace it (both are judged)."""
    from edgesdk.compliance.gate import scan_licenses

    here = Path(__file__).resolve().parent
    result = scan_licenses(here / "test_model_license.py", model_license="MIT", bundle=False)
    exprs = [f.spdx for f in result.findings if f.layer == "model"]
    assert "MIT" in exprs and result.model_license_declared == "MIT"
