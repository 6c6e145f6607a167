# SPDX-License-Identifier: Apache-2.0
"""Issue 24: device profiles are validated against a shipped JSON Schema with ``jsonschema`` (no home-made
schema language), and a bad profile is still one line naming the file, the key and what was expected."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import tomllib
from jsonschema import Draft202012Validator

from edgesdk.errors import ProfileError
from edgesdk.profiles import list_profiles, profile_schema, resolve_profile, validate_profile_data

REPO = Path(__file__).resolve().parent.parent


def test_the_schema_is_shipped_valid_and_accepts_every_shipped_profile():
    schema = profile_schema()
    Draft202012Validator.check_schema(schema)
    assert schema == json.loads((REPO / "edgesdk" / "data" / "profile.schema.json").read_text())
    validator = Draft202012Validator(schema)
    profiles = list_profiles()
    assert len(profiles) >= 10
    for p in profiles:
        assert not list(validator.iter_errors(p.data)), p.name


def test_jsonschema_is_a_ranged_dependency():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("jsonschema"))
    assert "==" not in spec and ">=" in spec and "<" in spec


def _mutated(change) -> dict:
    data = copy.deepcopy(resolve_profile("a10").data)
    change(data)
    return data


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["device"]["memory"].__setitem__("bandwidth_gbps", "fast"),
            "device.memory.bandwidth_gbps: expected a figure mapping {value, source, status?} or null, got str",
        ),
        (lambda d: d.__setitem__("kernels", None), "kernels: expected a mapping, got NoneType"),
        (lambda d: d.pop("kernels"), "kernels: missing (expected a mapping)"),
        (lambda d: d["device"].__setitem__("foo", 1), "device.foo: unknown key"),
        (
            lambda d: d["device"].__setitem__("kind", "tpu"),
            "device.kind: expected one of 'jetson', 'gpu', 'cpu', got 'tpu'",
        ),
        (lambda d: d.__setitem__("aliases", ["x", 3]), "aliases[1]: expected string, got int 3"),
        (lambda d: d.__setitem__("schema_version", 2), "schema_version: expected 1, got 2"),
        (
            lambda d: d["policy"].__setitem__("formats", ["onnx", "tflite"]),
            "policy.formats[1]: expected one of 'onnx', 'tensorrt', 'gguf', got 'tflite'",
        ),
        (
            lambda d: d["device"]["memory"].__setitem__("unified", "yes"),
            "device.memory.unified: expected boolean, got str 'yes'",
        ),
        (
            lambda d: d["policy"].__setitem__("memory_headroom_fraction", "lots"),
            "policy.memory_headroom_fraction: expected number, got str 'lots'",
        ),
        (
            lambda d: (d.__setitem__("name", 5), d["device"].__setitem__("foo", 1)),
            "name: expected string, got int 5 (+1 more)",
        ),
        (
            lambda d: d["policy"].__setitem__("memory_headroom_fraction", 1.5),  # a range: checked after the schema
            "policy.memory_headroom_fraction: expected a number in [0, 1), got 1.5",
        ),
    ],
)
def test_messages_are_one_line_naming_file_key_and_expectation(change, message):
    with pytest.raises(ProfileError) as err:
        validate_profile_data(_mutated(change), "mine.yaml")
    line = err.value.one_line()
    assert "\n" not in line and line == f"mine.yaml: invalid profile: {message}"
