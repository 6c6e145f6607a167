# SPDX-License-Identifier: Apache-2.0
"""A waiver that names the model file given to `build` clears the gate (issue 25): the gate sees the model
twice, as the source file (``gemma-3-270m-q4_k_m.gguf``) and as the bundle's copy (``model.gguf``); a waiver
naming the source used to clear the first only, so the build failed on the copy with the waiver "applied".
The bundle's model file now answers to the name of the file it was built from, at build and in `check
licenses` on the finished bundle (manifest ``model.source``); nothing else does (a VLM's projector)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from edgesdk.compliance.gate import run_license_gate, scan_licenses
from edgesdk.errors import LicenseGateError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from waiver_fixtures import license_gguf, waiver_file  # noqa: E402

NAME = "gemma-3-270m-q4_k_m.gguf"


def _stage(tmp_path: Path) -> tuple[Path, Path]:
    source = license_gguf(tmp_path / "models" / NAME)
    stage = tmp_path / "stage"
    stage.mkdir()
    shutil.copy(source, stage / "model.gguf")
    return source, stage


def _gate(stage: Path, source: Path, waivers: Path, tmp_path: Path, components=None):
    return run_license_gate(
        stage,
        model_source=source,
        runtime_distributions=[],
        waivers_path=waivers,
        report_path=tmp_path / "out.license-report.json",
        components=components or {"model.gguf": "model"},
    )


def test_waiver_naming_the_model_file_clears_it_and_the_bundles_copy(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    source, stage = _stage(tmp_path)
    waivers = waiver_file(tmp_path, subject=NAME)
    result = _gate(stage, source, waivers, tmp_path)
    assert result.verdict == "pass"
    model = {f.subject: f.waived_by for f in result.findings if f.layer == "model"}
    assert model == {NAME: "W-1", "model.gguf": "W-1"}
    (applied,) = result.waiver_audit["applied"]
    assert applied["matched"] == [f"model:{NAME}", "model:model.gguf"]
    # `check licenses` on the finished bundle with the same waiver file agrees (the manifest names the source).
    (stage / "manifest.json").write_text(
        json.dumps({"model": {"source": str(source)}, "license": result.to_manifest()})
    )
    assert scan_licenses(stage, waivers_path=waivers).verdict == "pass"
    assert scan_licenses(stage).verdict == "review"  # without the waiver: still a review


def test_waiver_naming_another_file_or_the_projector_does_not_clear_the_model(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    source, stage = _stage(tmp_path)
    with pytest.raises(LicenseGateError):  # an absolute path is not the report's subject: matches nothing
        _gate(stage, source, waiver_file(tmp_path, subject=str(source)), tmp_path)
    report = json.loads((tmp_path / "out.license-report.json").read_text())
    assert [w["subject"] for w in report["waivers"]["unmatched"]] == [str(source)]
    with pytest.raises(LicenseGateError):
        _gate(stage, source, waiver_file(tmp_path, subject="other.gguf"), tmp_path)
    # A VLM: the projector in mmproj.gguf is not the source model file, whatever its license.
    license_gguf(stage / "mmproj.gguf")
    labels = {"model.gguf": "model", "mmproj.gguf": "vision_encoder + projector"}
    with pytest.raises(LicenseGateError, match="mmproj.gguf"):
        _gate(stage, source, waiver_file(tmp_path, subject=NAME), tmp_path, components=labels)


@pytest.mark.slow
def test_build_of_the_gemma_gguf_passes_with_a_waiver_naming_its_file(gemma_gguf, tmp_path: Path) -> None:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    waivers = waiver_file(tmp_path, subject=gemma_gguf.name, reason="Gemma Terms of Use reviewed")
    out = build(gemma_gguf, "cpu-x86_64", tmp_path / "gemma", BuildOptions(progress=False, waivers=str(waivers)))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["license"]["waivers_used"] == ["W-1"] and manifest["license"]["verdict"] == "pass"
    assert scan_licenses(out, waivers_path=waivers).verdict == "pass"
