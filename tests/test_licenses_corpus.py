# SPDX-License-Identifier: Apache-2.0
"""The pitfall corpus (tests/data/licenses/, one directory per case, expectations in
expect.yaml): each case is copied out of the repository (so the repo's REUSE.toml does not
apply) and scanned with the real scanners and the shipped default policy."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
import yaml

from edgesdk import errors
from edgesdk.compliance.gate import scan_licenses

CORPUS = Path(__file__).parent / "data" / "licenses"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "expect.yaml").is_file())


def closed_loopback_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens once the socket is closed


def write_gguf(path: Path, license_id: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_license(license_id)
    writer.add_token_list([f"tok{i}" for i in range(2000)])  # an array the reader must skip
    writer.add_tensor("w", __import__("numpy").zeros((4, 4), dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_onnx(path: Path, license_id: str | None) -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph)
    if license_id:
        helper.set_model_props(model, {"license": license_id, "producer_note": "corpus"})
    onnx.save(model, str(path))


def materialise(case: str, tmp_path: Path) -> tuple[Path, dict]:
    root = tmp_path / case
    shutil.copytree(CORPUS / case, root)
    expect = yaml.safe_load((root / "expect.yaml").read_text())
    for kind, spec in (expect.get("generate") or {}).items():
        target = root / spec["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        (write_gguf if kind == "gguf" else write_onnx)(target, spec["license"])
    return root, expect


def by_file(result) -> dict:
    """Map "layer:subject", each subject and each covered file to its finding."""
    out = {}
    for f in result.findings:
        out[f"{f.layer}:{f.subject}"] = f
        out.setdefault(f.subject, f)
        for rel in f.files:
            out.setdefault(rel, f)
    return out


@pytest.mark.parametrize("case", CASES)
def test_pitfall_case(case: str, tmp_path: Path) -> None:
    root, expect = materialise(case, tmp_path)
    kwargs = {}
    if expect.get("waivers"):
        kwargs["waivers_path"] = root / expect["waivers"]
    if expect.get("scanoss_url") == "closed-loopback-port":
        kwargs["scanoss_url"] = closed_loopback_url()
    if "error" in expect:
        with pytest.raises(getattr(errors, expect["error"])) as info:
            scan_licenses(root, **kwargs)
        assert "\n" not in info.value.one_line()
        return
    result = scan_licenses(root, **kwargs)
    assert result.verdict == expect["verdict"], result.to_report()["findings"]
    found = by_file(result)
    for rel, action in (expect.get("actions") or {}).items():
        assert found[rel].action == action, (rel, found[rel].to_dict())
    for rel, category in (expect.get("categories") or {}).items():
        assert found[rel].category == category, (rel, found[rel].to_dict())
    for rel, spdx in (expect.get("spdx") or {}).items():
        assert found[rel].spdx == spdx, (rel, found[rel].to_dict())
    for rel, chosen in (expect.get("chosen") or {}).items():
        assert found[rel].chosen == chosen, (rel, found[rel].to_dict())
    for lic_file, covered in (expect.get("covers") or {}).items():
        assert set(covered) <= set(found[lic_file].files)
    if "vendored" in expect:
        assert [v["path"] for v in result.vendored] == expect["vendored"]
    for rel, waiver_id in (expect.get("waived") or {}).items():
        assert found[rel].waived_by == waiver_id
        assert found[rel].action != "allow"  # the policy's verdict is kept next to the waiver
    if "expired_waivers" in expect:
        assert [w["id"] for w in result.waiver_audit["expired"]] == expect["expired_waivers"]
    if "unmatched_waivers" in expect:
        assert [w["id"] for w in result.waiver_audit["unmatched"]] == expect["unmatched_waivers"]
    if "with_policy" in expect:
        again = scan_licenses(root, policy_path=root / expect["with_policy"]["file"], **kwargs)
        assert again.verdict == expect["with_policy"]["verdict"]
    if "accept_makes_pass" in expect:
        assert scan_licenses(root, accepted=[expect["accept_makes_pass"]], **kwargs).verdict == "pass"
    if "accept_stays" in expect:
        assert scan_licenses(root, accepted=[expect["accept_stays"]], **kwargs).verdict == expect["verdict"]


def test_corpus_covers_all_ten_pitfalls() -> None:
    pitfalls = set()
    for case in CASES:
        value = yaml.safe_load((CORPUS / case / "expect.yaml").read_text()).get("pitfall")
        if isinstance(value, int):
            pitfalls.add(value)
    assert pitfalls == set(range(1, 11))
