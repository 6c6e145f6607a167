# SPDX-License-Identifier: Apache-2.0
"""The backend contract: the worked example in runtime/backend.py runs as written, every backend conforms
to the protocols, and input checks (written once) turn bad feeds into one-line exit-3 errors."""

from __future__ import annotations

import re
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

import edgesdk.runtime.backend as contract
from edgesdk.errors import InputError, ShapeError
from edgesdk.runtime.backend import Backend, LLMBackend, LoadContext, TensorSpec, check_feeds, normalize_dtype


def _docstring_example() -> str:
    doc = contract.__doc__
    start = doc.index("runs this very text::") + len("runs this very text::")
    block = doc[start : doc.index("To ship it,")]
    return textwrap.dedent(block)


def test_docstring_example_runs_as_written():
    scope: dict = {}
    exec(compile(_docstring_example(), "edgesdk/runtime/backend.py (docstring example)", "exec"), scope)
    backend = scope["ScaleBackend"](1.5)
    assert isinstance(backend, Backend) and not isinstance(backend, LLMBackend)
    # The example's loader, given a context with the default telemetry hook, records and loads.
    ctx = LoadContext(bundle=None, profile=None)
    loaded = scope["load_scale"](None, ctx)
    assert loaded.scale == np.float32(2.0) and ctx.fallbacks[0]["to"] == "numpy"
    with pytest.raises(ShapeError, match=r"input 'x': dimension 1 must be 4, got 3"):
        check_feeds(loaded.inputs, {"x": np.ones((2, 3), np.float32)})


def test_example_backend_served_through_a_session(tmp_path, monkeypatch):
    """The example backend behind edgesdk's Session: run() checks feeds once, report() carries its report."""
    from edgesdk.runtime.session import Session

    scope: dict = {}
    exec(_docstring_example(), scope)
    ctx = LoadContext(bundle=None, profile=None, on_fallback=None)
    backend = scope["load_scale"](None, ctx)

    class _Bundle:  # just what Session reads from a bundle
        manifest = SimpleNamespace(
            model=SimpleNamespace(task="feature-extraction"), profile=SimpleNamespace(name="cpu")
        )
        precision, bundle_id, model_name, format, path = "fp32", "b1", "scale", "numpy", tmp_path

    session = Session(_Bundle(), backend, ctx, 0.0)
    assert session.run({"x": [[1.0, 1.0, 1.0, 1.0]]})["y"].tolist() == [[2.0] * 4]
    rep = session.report()
    assert rep["backend_report"]["calls"] == 1 and rep["fallbacks"][0]["from"] == "numpy-gpu"
    with pytest.raises(Exception, match="needs an LLM bundle"):
        session.generate("hi")


@pytest.mark.parametrize(
    "spelling,expected",
    [
        ("tensor(float)", "float32"),
        ("tensor(int64)", "int64"),
        ("float32", "float32"),
        ("tensor(double)", "float64"),
        ("tensor(float16)", "float16"),
        ("tensor(bool)", "bool"),
        (np.int32, "int32"),
        ("tensor(bfloat16)", "bfloat16"),
    ],
)
def test_dtype_spellings_are_normalised(spelling, expected):
    assert normalize_dtype(spelling) == expected


SPECS = (TensorSpec("input_ids", "tensor(int64)", [1, "sequence"]), TensorSpec("mask", "int64", (None, None)))


@pytest.mark.parametrize(
    "feeds,needle",
    [
        ({"input_ids": np.ones((1, 4), np.int64)}, r"missing \['mask'\]"),
        ({"input_ids": np.ones((1, 4), np.int64), "mask": np.ones((1, 4)), "extra": 1}, r"unexpected \['extra'\]"),
        ({"input_ids": np.ones(4, np.int64), "mask": np.ones((1, 4), np.int64)}, r"'input_ids': expected rank 2"),
        ({"input_ids": np.ones((2, 4), np.int64), "mask": np.ones((2, 4), np.int64)}, r"dimension 0 must be 1, got 2"),
        ({"input_ids": np.full((1, 4), 0.5), "mask": np.ones((1, 4), np.int64)}, r"expected dtype int64, got float64"),
        ({"input_ids": np.array([["a", "b"]]), "mask": np.ones((1, 2), np.int64)}, r"expected dtype int64, got <U1"),
        ([np.ones((1, 4))], r"must be a mapping"),
    ],
)
def test_bad_feeds_are_one_line_input_errors(feeds, needle):
    with pytest.raises(InputError, match=needle) as info:
        check_feeds(SPECS, feeds)
    assert info.value.exit_code == 3 and "\n" not in info.value.one_line()


def test_good_feeds_are_cast_within_their_kind():
    out = check_feeds(SPECS, {"input_ids": np.ones((1, 3), np.int32), "mask": [[1, 1, 0]]})
    assert out["input_ids"].dtype == np.int64 and out["mask"].dtype == np.int64
    assert check_feeds((TensorSpec("ids", "int64", None),), {"ids": [[1, 2], [3, 4]]})["ids"].shape == (2, 2)


def test_onnxruntime_backend_conforms_and_run_checks_inputs(tmp_path):
    """A real ONNX Runtime backend: TensorSpecs say float32 where ORT says tensor(float); bad feeds exit 3."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "m.onnx"))
    recorded = []
    backend = OnnxRuntimeBackend(tmp_path / "m.onnx", ["CPUExecutionProvider"], lambda *a: recorded.append(a))
    assert isinstance(backend, Backend) and not isinstance(backend, LLMBackend)
    assert backend.inputs == (TensorSpec("x", "float32", ("batch", 3)),)
    assert backend.outputs == (TensorSpec("y", "float32", ("batch", 3)),)
    feeds = check_feeds(backend.inputs, {"x": [[-1, 0, 2]]})
    assert backend.run(feeds)["y"].tolist() == [[0.0, 0.0, 2.0]]
    with pytest.raises(ShapeError, match=r"dimension 1 must be 3, got 2"):
        check_feeds(backend.inputs, {"x": np.ones((1, 2), np.float32)})
    backend.close()


def test_no_backend_module_validates_feeds_itself():
    """Input checks are written once (backend.check_feeds): no backend carries its own copy."""
    import inspect

    from edgesdk.runtime.backends import onnxruntime, tensorrt, torch_eager

    for module in (onnxruntime, tensorrt, torch_eager):
        assert not re.search(r"def check_feeds", inspect.getsource(module)), module.__name__
