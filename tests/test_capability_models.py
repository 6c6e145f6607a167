# SPDX-License-Identifier: Apache-2.0
"""Real ONNX models for the capability/TensorRT tests (random weights, real architectures, real exporters),
plus checks that they are what the other tests assume. Imported by test_capability*.py / test_tensorrt*.py.

- CNN: Conv-BN-ReLU-MaxPool-Conv-ReLU-GlobalAvgPool-Flatten-Linear, static 1x3x32x32.
- DLA CNN: only DLA-native layers (Conv, BN, ReLU, MaxPool), static shapes.
- LSTM: nn.LSTM + Linear, dynamic batch and sequence.
- BERT: transformers BertModel (2 layers, hidden 64), dynamic batch and sequence, opset 17.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")


def _stamp_license(path: Path) -> Path:
    # Our own random-weight models: Apache-2.0 like the project, declared where the license gate reads it.
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, {"license": "Apache-2.0"})
    onnx.save(model, str(path))
    return path


def _export(module, args, path: Path, names: list[str], dynamic: dict | None = None) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(), args, str(path), input_names=names, opset_version=17, dynamo=False, dynamic_axes=dynamic
        )
    return _stamp_license(path)


def make_cnn(path: Path, dla_only: bool = False) -> Path:
    torch.manual_seed(0)
    nn = torch.nn
    layers = [
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
    ]

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            y = self.features(x)
            return y if dla_only else self.fc(torch.flatten(self.pool(y), 1))

    return _export(Cnn(), (torch.randn(1, 3, 32, 32),), path, ["x"])


def make_lstm(path: Path) -> Path:
    torch.manual_seed(0)

    class Rnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.out(y[:, -1])

    return _export(Rnn(), (torch.randn(1, 5, 8),), path, ["x"], {"x": {0: "batch", 1: "sequence"}})


def make_bert(path: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000
    )
    model = transformers.BertModel(cfg).eval()
    ids = torch.ones(1, 16, dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return _export(model, (ids, ids), path, ["input_ids", "attention_mask"], axes)


def make_custom_op(path: Path) -> Path:
    """Relu -> com.example::Mystery -> Relu: an op no TensorRT table, CUDA EP or CPU EP has."""
    h = onnx.helper
    tp = onnx.TensorProto
    graph = h.make_graph(
        [
            h.make_node("Relu", ["x"], ["a"]),
            h.make_node("Mystery", ["a"], ["b"], domain="com.example"),
            h.make_node("Relu", ["b"], ["y"]),
        ],
        "custom",
        [h.make_tensor_value_info("x", tp.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", tp.FLOAT, [1, 4])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.example", 1)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def make_lstm_layout1(path: Path) -> Path:
    """A hand-built LSTM node with layout=1 (batch-first), which TensorRT 10's parser rejects."""
    import numpy as np

    h = onnx.helper
    tp = onnx.TensorProto
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((1, 16, 3)).astype("float32"), "W")
    r = onnx.numpy_helper.from_array(rng.standard_normal((1, 16, 4)).astype("float32"), "R")
    node = h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=4, layout=1)
    graph = h.make_graph(
        [node],
        "lstm",
        [h.make_tensor_value_info("x", tp.FLOAT, [2, 5, 3])],
        [h.make_tensor_value_info("y", tp.FLOAT, None)],
        initializer=[w, r],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


MAKERS = {
    "cnn": make_cnn,
    "dla_cnn": lambda p: make_cnn(p, dla_only=True),
    "lstm": make_lstm,
    "bert": make_bert,
    "custom": make_custom_op,
    "lstm_layout1": make_lstm_layout1,
}


def build_all(tmp_path_factory) -> dict[str, Path]:
    """Export every model once per test session (other test modules call this from their own fixture;
    the fixed directory under the session's base temp makes them share one export of each model)."""
    d = tmp_path_factory.getbasetemp() / "capability-models"
    d.mkdir(exist_ok=True)
    paths = {k: d / f"{k}.onnx" for k in MAKERS}
    for key, path in paths.items():
        if not path.is_file():
            MAKERS[key](path)
    return paths


@pytest.fixture(scope="session")
def capability_models(tmp_path_factory) -> dict[str, Path]:
    return build_all(tmp_path_factory)


def test_models_are_what_the_tests_assume(capability_models):
    ops = {k: {n.op_type for n in onnx.load(str(p)).graph.node} for k, p in capability_models.items()}
    assert {"Conv", "MaxPool", "GlobalAveragePool", "Gemm"} <= ops["cnn"]
    assert ops["dla_cnn"] <= {"Conv", "Relu", "MaxPool"}  # BatchNorm folded into Conv by the exporter
    assert "LSTM" in ops["lstm"]
    assert {"MatMul", "Softmax", "LayerNormalization", "Erf"} <= ops["bert"]
    bert_inputs = onnx.load(str(capability_models["bert"])).graph.input
    assert all(d.dim_param for i in bert_inputs for d in i.type.tensor_type.shape.dim)  # fully dynamic
