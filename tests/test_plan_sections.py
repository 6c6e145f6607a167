# SPDX-License-Identifier: Apache-2.0
"""Typed plan sections (issue 22 item 1): each format returns its own dataclass (OnnxPlan, TensorRTPlan with an
EngineTarget, GgufPlan, VlmPlan), builders read attributes, and ``Plan.decisions`` / ``--explain`` / the plan's JSON
are derived from the sections, unchanged: ``tests/data/plans_before_typed_sections.json`` holds the plans main
produced before the sections (commit 48d6d96, model facts left out), and every decision there must come out
the same, in the same order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.formats.gguf.plan import GgufPlan, QuantCandidate
from edgesdk.formats.onnx.plan import OnnxPlan, ShapeBuckets
from edgesdk.formats.tensorrt.plan import EngineTarget, TensorRTPlan
from edgesdk.host import HostFacts
from edgesdk.plan import BuildOptions, inspect_model, plan_build
from edgesdk.profiles import resolve_profile
from edgesdk.types import Decision, OptimizeMethod, Plan, PlanSection

GOLDEN = json.loads((Path(__file__).parent / "data" / "plans_before_typed_sections.json").read_text())


def _plan(source: Path, key: str) -> Plan:
    _, profile, fmt, prec = key.split("/")
    options = BuildOptions(
        format=None if fmt == "None" else fmt, precision=None if prec == "None" else prec, progress=False
    )
    return plan_build(inspect_model(source), resolve_profile(profile), options, HostFacts())


def _same_as_before(plan: Plan, key: str) -> None:
    now, before = plan.to_dict(), GOLDEN[key]
    assert {k: now[k] for k in ("profile", "format", "precision", "ep_chain", "parity")} == {
        k: before[k] for k in ("profile", "format", "precision", "ep_chain", "parity")
    }
    # every decision of the plan before, unchanged and in order (a decision added since, e.g. another
    # module's, may sit between them)
    it = iter(now["decisions"])
    for d in before["decisions"]:
        assert any(d == n for n in it), f"{key}: decision {d['key']} changed or moved"
    assert all(f"  {d['key']}" in plan.explain() for d in before["decisions"])  # --explain: the same decisions


@pytest.mark.parametrize("key", [k for k in GOLDEN if k.startswith("minilm/")])
def test_onnx_and_tensorrt_plans_are_typed_and_unchanged(minilm_dir, key):
    plan = _plan(minilm_dir, key)
    _same_as_before(plan, key)
    section = plan.section
    assert isinstance(section, OnnxPlan) and isinstance(section.optimize, OptimizeMethod)
    # one EP chain and one set of thresholds: the section's (Plan.ep_chain / Plan.parity and the plan JSON read it)
    assert plan.ep_chain == section.ep_chain and plan.parity == section.parity
    assert plan.profile_ep_chain == [] and plan.profile_parity == {}
    if plan.format == "tensorrt":
        assert isinstance(section, TensorRTPlan) and isinstance(section.target, EngineTarget)
        assert section.target.profile == plan.profile and section.onnx_precision == "fp32"
        assert section.engine_build == "deferred to the device"
        assert section.precision_flags == ["fp16"] == [plan.precision]  # the plan's precision, not re-derived
    elif "h200" in key:
        assert isinstance(section.shape_buckets, ShapeBuckets) and section.eager_fallback == "safetensors+config"


@pytest.mark.parametrize("key", [k for k in GOLDEN if k.startswith("gemma/")])
def test_gguf_plan_is_typed_and_unchanged(gemma_gguf, key):
    plan = _plan(gemma_gguf, key)
    _same_as_before(plan, key)
    section = plan.section
    assert isinstance(section, GgufPlan) and section.quant_type == "Q4_K_M" and section.context_length > 0
    assert all(isinstance(c, QuantCandidate) for c in section.parity_fallback)
    # a GGUF plan steers by neither: the JSON keeps the profile's ONNX Runtime chain only for old readers
    assert not hasattr(section, "ep_chain") and plan.ep_chain == plan.profile_ep_chain


def test_sections_round_trip_through_their_decisions(minilm_dir):
    for key in ("minilm/orin/tensorrt/None", "minilm/h200/None/None"):
        section = _plan(minilm_dir, key).section
        again = type(section).from_decisions(section.decisions())
        assert again == section and again.decisions() == section.decisions()


@pytest.mark.parametrize("key", [k for k in GOLDEN if k.startswith("minilm/")])
def test_the_plan_decides_the_thresholds_of_every_parity_fallback(minilm_dir, key):
    """Issue 40, item 2: the verify stage reads its thresholds from the section (``thresholds``), for the artifact's
    precision and each precision a parity fallback reaches; the build no longer asks the profile
    (``BuildContext.thresholds_for`` is gone). They are the profile's, as before."""
    from edgesdk.formats.onnx.plan import next_precision
    from edgesdk.profiles import parity_thresholds

    plan = _plan(minilm_dir, key)
    section, profile = plan.section, resolve_profile(key.split("/")[1])
    assert isinstance(section, OnnxPlan)
    first = section.onnx_precision or plan.precision
    chain = [first]
    while (nxt := next_precision(chain[-1], profile.precision_order)) is not None:
        chain.append(nxt)
    assert list(section.parity_by_precision) == chain
    assert section.thresholds(first) == section.parity
    for precision in chain:
        assert section.thresholds(precision) == parity_thresholds(profile, precision)


def test_a_registered_formats_decisions_stay_untyped_and_readable():
    section = PlanSection.from_decisions([Decision("toy.scale", 2.0, "why"), Decision("toy.mode", "x", "because")])
    assert [d.key for d in section.decisions()] == ["toy.scale", "toy.mode"] and section.value("toy.scale") == 2.0


def test_decision_value_is_json_not_any():
    from edgesdk import types

    assert Decision.__annotations__["value"] == "JSONValue"  # the alias: JSON scalars, sequences and mappings
    assert "Any" not in types.JSONValue and "Any" not in types.JSONScalar
    assert "value" not in {f for f in Plan.__dataclass_fields__} and "ep_chain" not in Plan.__dataclass_fields__
