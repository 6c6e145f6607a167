# SPDX-License-Identifier: Apache-2.0
"""Issue 34 item 7: a restricted model family named by a GGUF's architecture, name, basename or tags is not
talked out of its review by a rewritten ``general.license``. The real Gemma-3-270M GGUF with ``general.license``
set to ``apache-2.0`` (gguf-py's own metadata copier) was PASS in ``check licenses`` and built with exit 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.compliance.gate import scan_licenses
from edgesdk.compliance.models import restricted_family

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize(
    "fields, license_id",
    [
        ({"general.architecture": "gemma3", "general.name": "tiny"}, "LicenseRef-gemma"),
        ({"general.architecture": "llama", "general.name": "MedGemma 4b"}, "LicenseRef-gemma"),
        ({"general.architecture": "qwen3", "general.tags": ("google", "gemma")}, "LicenseRef-gemma"),
        ({"general.architecture": "llama", "general.name": "Meta-Llama-3.1-8B-Instruct"}, "LicenseRef-llama3.1"),
        ({"general.architecture": "llama", "general.basename": "Llama-3.2"}, "LicenseRef-llama3.2"),
        ({"general.architecture": "llama", "general.name": "Llama 3 8B"}, "LicenseRef-llama3"),
        ({"general.architecture": "llama", "general.name": "llama-2-7b-chat"}, "LicenseRef-llama2"),
        ({"general.architecture": "llama4", "general.name": "x"}, "LicenseRef-llama4"),
        # not a family with its own terms: Apache-2.0 TinyLlama, CodeLlama, a llama-architecture Mistral
        ({"general.architecture": "llama", "general.name": "TinyLlama-1.1B-Chat"}, None),
        ({"general.architecture": "llama", "general.name": "CodeLlama-7b"}, None),
        ({"general.architecture": "llama", "general.name": "Mistral-7B-v0.1", "general.tags": ("mistral",)}, None),
        ({"general.architecture": "qwen3", "general.name": "Qwen3-0.6B"}, None),
    ],
)
def test_restricted_family_signals(fields, license_id):
    hit = restricted_family(fields)
    assert (hit[1] if hit else None) == license_id


def _tiny_gguf(path: Path, arch: str, name: str, license_id: str | None, tags: tuple[str, ...] = ()) -> Path:
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    if tags:
        writer.add_tags(list(tags))
    if license_id:
        writer.add_license(license_id)
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_tensor("w", np.zeros((4, 4), dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_contradicting_signals_are_a_review_finding(tmp_path):
    relicensed = _tiny_gguf(tmp_path / "a.gguf", "gemma3", "Gemma 3 tiny", "apache-2.0", ("gemma", "google"))
    result = scan_licenses(relicensed)
    assert result.verdict == "review", [f.headline() for f in result.findings]
    (hit,) = [f for f in result.findings if f.spdx == "LicenseRef-gemma"]
    assert (hit.layer, hit.action, hit.category) == ("model", "review", "restricted-model")
    assert "general.architecture=gemma3" in hit.found and "general.tags='gemma'" in hit.found
    assert "say Gemma, the license says Apache-2.0" in hit.headline()
    assert scan_licenses(relicensed, accepted=["LicenseRef-gemma"]).verdict == "pass"
    # Agreeing signals: Gemma's own license is the one finding (review, as before).
    honest = scan_licenses(_tiny_gguf(tmp_path / "b.gguf", "gemma3", "Gemma 3 tiny", "gemma"))
    assert [f.spdx for f in honest.findings] == ["LicenseRef-gemma"]
    # Nothing says a restricted family: no finding added.
    other = scan_licenses(_tiny_gguf(tmp_path / "c.gguf", "llama", "TinyLlama-1.1B", "apache-2.0"))
    assert other.verdict == "pass" and [f.spdx for f in other.findings] == ["Apache-2.0"]
    # Nothing declared: the signals do not stand in for a declaration (a bundle keeps its "no license" deny).
    bare = tmp_path / "bundle"
    bare.mkdir()
    _tiny_gguf(bare / "model.gguf", "gemma3", "Gemma 3 tiny", None)
    (bare / "manifest.json").write_text("{}")
    undeclared = scan_licenses(bare)
    assert undeclared.verdict == "deny" and [f.spdx for f in undeclared.findings if f.layer == "model"] == [None]


@pytest.mark.slow
def test_the_registry_gemma_relicensed_apache_still_needs_review(gemma_gguf, tmp_path, run_cli):
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(gemma_gguf))
    out = tmp_path / "gemma-3-270m-apache.gguf"
    writer = gguf.GGUFWriter(str(out), arch="gemma3", endianess=reader.endianess)
    new = {"general.license": MetadataDetails(gguf.GGUFValueType.STRING, "apache-2.0")}
    copy_with_new_metadata(reader, writer, new, [])
    assert gguf.GGUFReader(str(out)).get_field("general.license").contents() == "apache-2.0"

    check = run_cli("check", "licenses", str(out))
    assert check.returncode == 2, check.stdout + check.stderr  # was 0: PASS on the word of general.license
    assert "license verdict: REVIEW" in check.stdout
    assert "general.architecture=gemma3" in check.stdout and "the license says Apache-2.0" in check.stdout
    accepted = run_cli("check", "licenses", str(out), "--accept-license", "LicenseRef-gemma", "--summary")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    # The unmodified file: Gemma's license, one finding, no contradiction.
    assert [f.spdx for f in scan_licenses(gemma_gguf).findings] == ["LicenseRef-gemma"]
