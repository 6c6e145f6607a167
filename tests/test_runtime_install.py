# SPDX-License-Identifier: Apache-2.0
"""The pieces that let the no-extras install do its job, tested in the dev environment (fast):
one-line errors naming an extra, refusing two ONNX Runtime builds, reading ONNX license fields
without the ``onnx`` package, and license checks that follow whichever ONNX Runtime build is installed.
tests/test_wheel_install.py runs the same paths from the real wheel in a fresh venv."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

from edgesdk import extras
from edgesdk.compliance import distributions
from edgesdk.compliance.models import onnx_findings, read_onnx_metadata
from edgesdk.errors import ExternalToolError, MissingExtraError


def test_require_names_the_extra_the_command_and_the_missing_modules():
    with pytest.raises(MissingExtraError) as info:
        extras.require("build", ("json", "no_such_module_xyz", "another_missing_one"), "edgesdk build")
    err = info.value
    assert err.exit_code == 10 and err.extra == "build"
    assert err.one_line() == (
        "edgesdk build needs the build extra: pip install 'edgesdk[build]' "
        "(missing: no_such_module_xyz, another_missing_one)"
    )
    extras.require("gguf", "json", "a GGUF bundle")  # present: no error, nothing imported beyond lookup
    with pytest.raises(ValueError):
        extras.require("nonsense", "json", "x")


def test_require_does_not_import_the_module():
    name = "edgesdk.textable"
    sys.modules.pop(name, None)
    extras.require("build", name, "x")
    assert name not in sys.modules


def test_every_extra_named_in_pyproject_is_known():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    optional = set(pyproject["project"]["optional-dependencies"]) - {"all", "dev"}
    assert optional == set(extras.EXTRAS)
    all_extras = pyproject["project"]["optional-dependencies"]["all"][0]
    assert "gpu" not in all_extras  # [gpu] replaces onnxruntime; it never rides along with [all]
    base = " ".join(pyproject["project"]["dependencies"])
    assert "onnxruntime-gpu" not in base and "opentelemetry-sdk" not in base
    for group in [pyproject["project"]["dependencies"], *pyproject["project"]["optional-dependencies"].values()]:
        for req in group:
            if req.split("=")[0].split(">")[0].split("<")[0].strip().startswith(("opentelemetry", "numpy", "protobuf")):
                assert "==" not in req, req


def test_two_onnxruntime_builds_are_refused(monkeypatch):
    monkeypatch.setattr(extras, "installed_onnxruntimes", lambda: ["onnxruntime", "onnxruntime-gpu"])
    with pytest.raises(ExternalToolError) as info:
        extras.check_onnxruntime()
    line = info.value.one_line()
    assert "onnxruntime and onnxruntime-gpu are both installed" in line
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install --no-deps onnxruntime-gpu" in line
    monkeypatch.setattr(extras, "installed_onnxruntimes", lambda: ["onnxruntime-gpu"])
    extras.check_onnxruntime()


def _onnx_model(props: dict[str, str]) -> bytes:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    weights = helper.make_tensor("w", TensorProto.FLOAT, [4096], [0.5] * 4096)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y], initializer=[weights])
    model = helper.make_model(graph, doc_string="d" * 300)
    model.model_version = 2**40  # a multi-byte varint before the metadata
    helper.set_model_props(model, props)
    assert onnx.load_from_string(model.SerializeToString()).metadata_props  # round-trips in onnx itself
    return model.SerializeToString()


def test_onnx_metadata_read_from_the_wire_format_matches_onnx(tmp_path):
    props = {
        "license": "Apache-2.0",
        "license_link": "https://www.apache.org/licenses/LICENSE-2.0",
        "ünïcode": "välue",
        "empty": "",
    }
    path = tmp_path / "m.onnx"
    path.write_bytes(_onnx_model(props))
    assert read_onnx_metadata(path) == props
    (finding,) = onnx_findings(path, tmp_path)
    assert finding.spdx == "Apache-2.0"


@pytest.mark.parametrize("payload", [bytes(range(256)) * 4, b"\x08", b"\x72\x7f" + b"x" * 10])
def test_onnx_metadata_reader_rejects_garbage(tmp_path, payload):
    path = tmp_path / "bad.onnx"
    path.write_bytes(payload)
    with pytest.raises(ValueError):
        read_onnx_metadata(path)
    (finding,) = onnx_findings(path, tmp_path)
    assert finding.spdx is None and "unreadable ONNX" in finding.note


def test_truncated_model_is_unreadable(tmp_path):
    data = _onnx_model({"license": "MIT"})
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:-5])
    with pytest.raises(ValueError):
        read_onnx_metadata(path)


def test_runtime_closure_uses_the_installed_onnxruntime_build():
    """A bundle built where onnxruntime-gpu was installed names it; a device with plain onnxruntime (or the
    other way round) is checked against the build it actually has."""
    installed = extras.installed_onnxruntimes()
    if not installed:
        pytest.skip("no ONNX Runtime installed")
    other = "onnxruntime" if installed[0] == "onnxruntime-gpu" else "onnxruntime-gpu"
    found, missing = distributions.closure([other])
    assert not missing
    names = {distributions.canonical(d.metadata["Name"]) for d in found}
    assert installed[0] in names and other not in names
    found, missing = distributions.closure(["no-such-distribution-xyz"])
    assert missing == ["no-such-distribution-xyz"] and md  # unrelated names are still reported missing
