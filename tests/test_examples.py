# SPDX-License-Identifier: Apache-2.0
"""Each example folder carries its expected numbers; check them against what the planner and builds do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgesdk.plan import inspect_model, plan_build
from edgesdk.profiles import resolve_profile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["minilm", "resnet"])
def test_expected_files_are_consistent(name):
    exp = yaml.safe_load((EXAMPLES / name / "expected.yaml").read_text())
    for build in exp["builds"].values():
        assert resolve_profile(build["profile"]).name == build["profile"]
        assert build["parity"]["measured_min_cosine"] >= build["parity"]["min_cosine"]


def test_minilm_plans_match_expected(minilm_dir):
    exp = yaml.safe_load((EXAMPLES / "minilm" / "expected.yaml").read_text())
    facts = inspect_model(minilm_dir)
    for build in exp["builds"].values():
        plan = plan_build(facts, resolve_profile(build["profile"]))
        assert (plan.format, plan.precision) == (build["format"], build["precision"])


def test_minilm_orin_bundle_meets_expected_parity(minilm_orin_bundle):
    exp = yaml.safe_load((EXAMPLES / "minilm" / "expected.yaml").read_text())["builds"]["orin"]
    m = json.loads((minilm_orin_bundle / "manifest.json").read_text())
    assert m["parity"][exp["precision"]]["min_cosine"] >= exp["parity"]["min_cosine"]
