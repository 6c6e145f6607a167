# SPDX-License-Identifier: Apache-2.0
"""The vision CNN example end to end: a ResNet-shaped classifier (real architecture, random weights)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def resnet_dir(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("make_model", REPO / "examples/resnet/make_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make(tmp_path_factory.mktemp("resnet") / "model", tiny=True)


def test_resnet_plans_fp16_on_orin_and_fp32_on_cpu(resnet_dir):
    from edgesdk.plan import inspect_model, plan_build
    from edgesdk.profiles import resolve_profile

    facts = inspect_model(resnet_dir)
    assert facts.task == "image-classification"
    assert plan_build(facts, resolve_profile("orin")).precision == "fp16"
    cpu = plan_build(facts, resolve_profile("cpu"))
    assert cpu.precision == "fp32"
    assert "convolutions" in next(d.reason for d in cpu.decisions if d.key == "precision")


@pytest.mark.slow
def test_resnet_build_and_run_from_cli(resnet_dir, tmp_path, run_cli):
    out = tmp_path / "rn-orin"
    res = run_cli("build", resnet_dir, "--profile", "orin", "-o", out, "--no-progress")
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["parity"]["fp16"]["passed"] and m["model"]["task"] == "image-classification"
    x = tmp_path / "x.npz"
    np.savez(x, pixel_values=np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32))
    res = run_cli("run", out, "--inputs", x, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["outputs"]["logits"]["shape"] == [1, 10]
    bad = tmp_path / "bad.npz"
    np.savez(bad, pixel_values=np.zeros((3, 224, 224), dtype=np.float32))
    res = run_cli("run", out, "--inputs", bad)
    assert res.returncode == 3 and "rank" in res.stderr and len(res.stderr.strip().splitlines()) == 1
