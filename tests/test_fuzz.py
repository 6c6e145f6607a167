# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzzing (hypothesis) of the parsers that take user files: device profiles, license
policies, waivers, bundle manifests (through the public ``open_bundle``), GGUF headers and trace files.

The property everywhere: whatever the bytes, the parser either accepts them or raises an
:class:`~edgesdk.errors.EdgeSDKError` subclass with its documented exit code, never another
exception; a profile that validates can also be planned with.

A short run by default (CI); ``EDGESDK_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py`` for a long
one (the examples per property).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgesdk.errors import (  # noqa: E402
    BundleIntegrityError,
    EdgeSDKError,
    InputError,
    ModelError,
    ProfileError,
    ResourceError,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("EDGESDK_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 200,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

# JSON-like values: what YAML or JSON can hold (plus NaN/inf floats).
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


def leaf_paths(node, prefix=()):
    """Every path into a nested dict/list (the containers too)."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaf_paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaf_paths(v, (*prefix, i))


def mutate(data, path, value):
    """A copy of ``data`` with the node at ``path`` replaced by ``value`` (or deleted when value is DELETE)."""
    out = copy.deepcopy(data)
    if not path:
        return {} if value is DELETE else value
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


DELETE = object()


def mutations(base):
    paths = list(leaf_paths(base))
    return st.tuples(st.sampled_from(paths), st.one_of(values, st.just(DELETE))).map(lambda pv: mutate(base, *pv))


def expect_edgesdk_error(fn, *allowed: type[EdgeSDKError]):
    """Run ``fn``; any exception must be one of ``allowed`` (EdgeSDKError subclasses) with a one-line message."""
    try:
        return fn()
    except EdgeSDKError as exc:
        assert isinstance(exc, allowed), f"{type(exc).__name__} (exit {exc.exit_code}): {exc.one_line()}"
        assert exc.one_line() and "\n" not in exc.one_line()
        return None


# --------------------------------------------------------------------------------------------- profiles

CPU = yaml.safe_load((REPO / "profiles" / "cpu-x86_64.yaml").read_text())


def _facts():
    from edgesdk.types import ModelFacts

    onnx = ModelFacts(
        source="m.onnx",
        kind="onnx",
        task="feature-extraction",
        name="m",
        params=10**6,
        weight_bytes=4 * 10**6,
        extra={"inputs": ["input_ids"], "external_data": []},
    )
    gguf = ModelFacts(
        source="m.gguf",
        kind="gguf",
        task="text-generation",
        name="m",
        architecture="llama",
        family="llama",
        params=10**8,
        weight_bytes=2 * 10**8,
        extra={
            "layers": 4,
            "kv_heads": 2,
            "head_dim": 64,
            "hidden": 256,
            "ffn": 512,
            "ctx_train": 2048,
            "n_vocab": 1000,
            "file_type": "F16",
            "tensor_bytes": 2 * 10**8,
        },
    )
    return onnx, gguf


@FUZZ
@given(mutations(CPU))
def test_profile_validation_then_planning_never_crashes(data):
    from edgesdk.plan import plan_build
    from edgesdk.profiles import Profile, validate_profile_data

    ok = expect_edgesdk_error(lambda: validate_profile_data(data, "fuzz.yaml") or True, ProfileError)
    if not ok:
        return
    prof = Profile(name=str(data["name"]), path=REPO / "profiles" / "cpu-x86_64.yaml", data=data)
    for facts in _facts():
        # A validated profile plans, or says why not: bad input (3) or does not fit (8).
        expect_edgesdk_error(lambda f=facts: plan_build(f, prof), InputError, ResourceError)


@FUZZ
@given(st.one_of(st.text(max_size=300), values.map(lambda v: yaml.safe_dump(v))))
def test_profile_file_of_any_text_is_a_profile_error(text):
    from edgesdk.profiles import load_profile_file

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        expect_edgesdk_error(lambda: load_profile_file(path), ProfileError)


# --------------------------------------------------------------------------------------------- policy, waivers

POLICY = {"licenses": {"LicenseRef-acme": "allow"}, "license_categories": {"MIT": "permissive"}}
WAIVERS = {
    "waivers": [
        {
            "subject": "pkg:pypi/foo",
            "license": "GPL-3.0-only",
            "reason": "vendored for tests",
            "approved_by": "legal@example.com",
            "expires": "2099-01-01",
        }
    ]
}


def _write(obj_or_text, name: str, d: str) -> Path:
    path = Path(d) / name
    if isinstance(obj_or_text, str):
        path.write_bytes(obj_or_text.encode("utf-8", "surrogatepass"))
    else:
        path.write_text(yaml.safe_dump(obj_or_text))
    return path


@FUZZ
@given(st.one_of(mutations(POLICY), values, st.text(max_size=200)))
def test_license_policy_of_any_shape_is_input_error(data):
    from edgesdk.compliance.policy import load_policy

    with tempfile.TemporaryDirectory() as d:
        path = _write(data, "policy.yaml", d)
        expect_edgesdk_error(lambda: load_policy(path), InputError)


@FUZZ
@given(st.one_of(mutations(WAIVERS), values, st.text(max_size=200)))
def test_waivers_of_any_shape_are_input_error(data):
    from edgesdk.compliance.waivers import load_waivers

    with tempfile.TemporaryDirectory() as d:
        path = _write(data, "waivers.yaml", d)
        expect_edgesdk_error(lambda: load_waivers(path), InputError)


# --------------------------------------------------------------------------------------------- manifests


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    pytest.importorskip("onnx")
    from test_adversarial import tiny_onnx

    from edgesdk.build import build
    from edgesdk.types import BuildOptions

    src = tiny_onnx(tmp_path_factory.mktemp("src") / "model.onnx")
    out = tmp_path_factory.mktemp("b") / "bundle"
    return build(
        src, "cpu-x86_64", out, BuildOptions(progress=False, precision="fp32", parity_samples=4, calibration_samples=2)
    )


def test_manifest_mutations_open_or_fail_with_exit_7(tiny_bundle, tmp_path):
    from edgesdk.bundle import open_bundle

    base = json.loads((tiny_bundle / "manifest.json").read_text())

    @FUZZ
    @given(st.one_of(mutations(base), values, st.text(max_size=100)))
    def prop(data):
        copy_dir = Path(tempfile.mkdtemp(dir=tmp_path))
        try:
            shutil.copytree(tiny_bundle, copy_dir, dirs_exist_ok=True)
            text = data if isinstance(data, str) else json.dumps(data, allow_nan=True)
            (copy_dir / "manifest.json").write_bytes(text.encode("utf-8", "surrogatepass"))
            expect_edgesdk_error(lambda: open_bundle(copy_dir, verify=True), BundleIntegrityError)
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)

    prop()


# --------------------------------------------------------------------------------------------- GGUF header


def _gguf_header() -> bytes:
    """A small, valid GGUF v3 header: 3 key/values, one F32 tensor of 4 elements, aligned data."""

    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = (
        s("general.architecture")
        + struct.pack("<I", 8)
        + s("llama")
        + s("llama.block_count")
        + struct.pack("<II", 4, 2)
        + s("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, 2)
        + s("a")
        + s("b")
    )
    tensor = s("w") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<I", 0) + struct.pack("<Q", 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 3) + kv + tensor
    head += b"\0" * (-len(head) % 32)
    return head + struct.pack("<4f", 1, 2, 3, 4)


GGUF = _gguf_header()


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=256).map(lambda b: b"GGUF" + b),
        st.tuples(st.integers(0, len(GGUF) - 1), st.binary(min_size=1, max_size=8)).map(
            lambda t: GGUF[: t[0]] + t[1] + GGUF[t[0] + len(t[1]) :]
        ),
        st.integers(0, len(GGUF)).map(lambda n: GGUF[:n]),
    )
)
def test_gguf_header_reader_and_facts_raise_model_error_only(blob):
    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.formats.gguf.facts import gguf_facts

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        path.write_bytes(blob)
        expect_edgesdk_error(lambda: read_gguf_header(path), ModelError)
        expect_edgesdk_error(lambda: gguf_facts(path), ModelError)


def test_the_seed_gguf_header_is_valid(tmp_path):
    from edgesdk.contracts.gguf_header import read_gguf_header

    (tmp_path / "m.gguf").write_bytes(GGUF)
    h = read_gguf_header(tmp_path / "m.gguf")
    assert h.scalar("general.architecture") == "llama" and h.tensors[0].n_elements == 4


# --------------------------------------------------------------------------------------------- traces

SPAN = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "x"}}]},
            "scopeSpans": [
                {
                    "scope": {"name": "edgesdk"},
                    "spans": [
                        {
                            "traceId": "0" * 32,
                            "spanId": "1" * 16,
                            "name": "chat m",
                            "kind": 3,
                            "startTimeUnixNano": "1",
                            "endTimeUnixNano": "2",
                            "attributes": [
                                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                                {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "3"}},
                            ],
                        }
                    ],
                }
            ],
        }
    ]
}


@FUZZ
@given(
    st.one_of(
        mutations(SPAN),
        values,
        st.text(max_size=200),
        st.lists(mutations(SPAN), min_size=1, max_size=3).map(
            lambda docs: "\n".join(json.dumps(d, allow_nan=True) for d in docs)
        ),
    )
)
def test_trace_checker_reads_any_file_or_raises_trace_file_error(data):
    from edgesdk.tracecheck import check_trace_file
    from edgesdk.tracecheck.otlp_json import TraceFileError

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        text = data if isinstance(data, str) else json.dumps(data, allow_nan=True)
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        expect_edgesdk_error(lambda: check_trace_file(path), TraceFileError)
