# SPDX-License-Identifier: Apache-2.0
"""Eager fallbacks: a model whose ONNX export fails on an op is kept as a torch.export program and run by
the torch backend, with the forcing op, the recorded fast-path fallbacks and the cost in the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.capability.tables import eager_cost_estimate  # noqa: E402
from edgesdk.errors import BackendUnavailableError, ModelError  # noqa: E402
from edgesdk.plan import BuildOptions  # noqa: E402
from edgesdk.profiles import resolve_profile  # noqa: E402
from edgesdk.runtime.fastpaths import fast_paths  # noqa: E402


class CumMaxHead(torch.nn.Module):
    """Linear + running maximum: ``aten::cummax`` has no ONNX symbolic at opset 17 (checked with torch 2.13)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.cummax(self.proj(x), dim=-1).values


@pytest.fixture(scope="module")
def torch_bundle(tmp_path_factory) -> tuple[Path, torch.nn.Module, torch.Tensor]:
    from edgesdk.build import build

    module = CumMaxHead().eval()
    x = torch.randn(2, 8)
    out = tmp_path_factory.mktemp("torch") / "cummax-orin"
    build(
        module,
        "orin-agx-64gb",
        out,
        BuildOptions(
            format="tensorrt",
            progress=False,
            extra={"module": module, "example_inputs": (x,), "input_names": ["x"], "license": "Apache-2.0"},
        ),
    )
    return out, module, x


@pytest.mark.slow
def test_export_failure_keeps_a_torch_export_program(torch_bundle):
    out, _, _ = torch_bundle
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "torch"
    assert {a["role"] for a in manifest["artifacts"]} >= {"exported-program", "model-card"}
    fb = manifest["extras"]["torch_fallback"]
    assert fb["forcing_ops"] == ["aten::cummax"]
    assert "aten::cummax" in fb["graph_ops"]  # the op is also in the kept program
    assert fb["cost"]["measured_here"]["eager_ms_p50"] > 0
    assert fb["cost"]["estimated_on_gpu"]["eager_vs_compile_cuda_graphs"] == round(3.07 / 0.61, 2)
    assert manifest["parity"]["torch-export"]["max_abs_diff"] == 0.0


@pytest.mark.slow
def test_torch_backend_runs_it_eagerly_and_says_why(torch_bundle):
    import edgesdk

    out, module, x = torch_bundle
    with edgesdk.load(out) as session:
        got = session.run({"x": x.numpy()})
        session.run({"x": x.numpy()})
        report = session.report()
    np.testing.assert_allclose(got["output_0"], module(x).detach().numpy(), rtol=0, atol=0)
    assert report["backend"] == "torch"
    br = report["backend_report"]
    assert br["mode"] == "eager" and br["forcing_ops"] == ["aten::cummax"]
    assert br["cost"]["measured_here_ms_p50"] > 0 and br["cost"]["runs_measured"] >= 1
    if not torch.cuda.is_available():
        assert {(f["from"], f["to"]) for f in report["fallbacks"]} == {
            ("torch.compile", "eager"),
            ("cuda-graphs", "eager"),
            ("flash-attention", "eager"),
        }


def test_fast_paths_follow_the_profile_kernel_table():
    orin = fast_paths(resolve_profile("orin-agx-64gb"), device_is_cuda=True)
    assert orin["flash_attention"]["use"] is False and "#449" in orin["flash_attention"]["reason"]
    assert orin["triton"]["use"] is False and "aarch64" in orin["triton"]["reason"]
    assert orin["cuda_graphs"]["use"] is False and "not recommended" in orin["cuda_graphs"]["reason"]
    h200 = fast_paths(resolve_profile("h200"), device_is_cuda=True)
    assert all(v["use"] for v in h200.values())
    cpu_here = fast_paths(resolve_profile("h200"), device_is_cuda=False)
    assert not any(v["use"] for v in cpu_here.values())


def test_kernel_table_for_bare_sm():
    from edgesdk.capability.tables import kernel_feature

    assert kernel_feature("flash_attention", "8.7")[0] is False
    assert kernel_feature("flash_attention", "9.0")[0] is True
    assert kernel_feature("triton", "8.7", arch="aarch64")[0] is False
    assert kernel_feature("fp8", "8.6")[0] is False and kernel_feature("fp8", "8.9")[0] is True
    assert kernel_feature("cuda_graphs", "8.7", platform="tegra234")[1] is False


def test_eager_cost_estimate_is_the_facts_measurement():
    fp16 = eager_cost_estimate("fp16")
    assert (fp16["eager_ms"], fp16["compile_cuda_graphs_ms"]) == (4.61, 0.23)
    assert fp16["eager_vs_compile_cuda_graphs"] == 20.04
    assert "H200" in fp16["source"]


@pytest.mark.slow
def test_corrupt_program_is_a_one_line_backend_error(torch_bundle, tmp_path):
    import shutil

    import edgesdk

    out, _, _ = torch_bundle
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "model.pt2").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BackendUnavailableError, match="cannot load torch.export program"):
        edgesdk.load(broken, verify=False)


def test_export_failure_without_example_inputs_is_a_model_error(tmp_path):
    from edgesdk.formats.torch.export import build_torch_fallback

    class Ctx:  # the smallest context build_torch_fallback reads before giving up
        options = BuildOptions(extra={"module": CumMaxHead()})

    with pytest.raises(ModelError, match="no module with example inputs"):
        build_torch_fallback(Ctx(), RuntimeError("Exporting the operator 'aten::cummax' is not supported"))
