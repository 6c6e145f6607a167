# SPDX-License-Identifier: Apache-2.0
"""Load options as dataclasses (edgesdk/runtime/options.py): per backend kind, unknown keys refused in one line
(exit 3), the loader gets exactly the options that were set. Bundles here are a manifest and a placeholder
file (the loader is replaced), so no runtime is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgesdk
from edgesdk import bundle as B
from edgesdk.errors import InputError
from edgesdk.manifest import LLMConfig, Manifest
from edgesdk.runtime import session as S
from edgesdk.runtime.options import (
    GgufLoadOptions,
    LoadOptions,
    OnnxLoadOptions,
    VlmLoadOptions,
    all_option_names,
    options_class,
    parse_load_options,
)


def _bundle(root: Path, fmt: str) -> Path:
    root.mkdir(parents=True)
    name = {"onnx": "model.onnx", "gguf": "model.gguf"}[fmt]
    (root / name).write_bytes(b"placeholder: the loader is replaced in these tests")
    B.write_manifest(
        root,
        Manifest(
            format=fmt,
            precision="fp32" if fmt == "onnx" else "F16",
            bundle_id=root.name,
            artifacts=[B.artifact_entry(root, name, "model")],
            llm=LLMConfig(n_ctx=256, threads=2) if fmt == "gguf" else None,
        ),
    )
    return root


@pytest.fixture
def loaded(monkeypatch):
    """Replace the loader: record the LoadContext options it gets (the typed object), return a stand-in backend."""
    seen: list[LoadOptions] = []

    class _Backend:
        name = provider = device = "stand-in"
        inputs = outputs = ()

        def close(self) -> None: ...

    def _get_loader(fmt):
        def _load(bundle, ctx):
            seen.append(ctx.options)
            return _Backend()

        return _load

    monkeypatch.setattr(S, "get_loader", _get_loader)
    return seen


@pytest.mark.parametrize("fmt", ["onnx", "gguf"])
def test_unknown_key_is_one_line_naming_it_and_the_known_ones(tmp_path, fmt, loaded):
    root = _bundle(tmp_path / fmt, fmt)
    with pytest.raises(InputError) as info:
        edgesdk.load(root, n_gpu_layer=8)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("unknown load option n_gpu_layer (known: ")
    known = msg.split("(known: ", 1)[1].split(";")[0].rstrip(")").split(", ")
    assert known == sorted(options_class(fmt).names())
    hint = "did you mean n_gpu_layers?" if fmt == "gguf" else "n_gpu_layers applies to gguf, vlm bundles, not onnx"
    assert hint in msg
    assert InputError.exit_code == 3  # docs/exit-codes.md: bad input
    assert loaded == []  # refused before any loader ran


def test_an_option_of_another_backend_kind_is_refused(tmp_path, loaded):
    onnx, gguf = _bundle(tmp_path / "onnx", "onnx"), _bundle(tmp_path / "gguf", "gguf")
    with pytest.raises(InputError, match=r"^unknown load option n_ctx \(known: .*n_ctx applies to gguf, vlm"):
        edgesdk.load(onnx, n_ctx=512)
    with pytest.raises(InputError, match=r"^unknown load options cuda_graphs, providers \(known: "):
        edgesdk.load(gguf, providers=["CPUExecutionProvider"], cuda_graphs=True)
    with pytest.raises(
        InputError,
        match=r"^OnnxLoadOptions is for onnx, tensorrt, torch bundles, not gguf: use "
        r"GgufLoadOptions$",
    ):
        edgesdk.load(gguf, options=OnnxLoadOptions(threads=2))
    with pytest.raises(InputError, match="not both"):
        edgesdk.load(gguf, options=GgufLoadOptions(n_ctx=64), threads=2)
    assert loaded == []


def test_the_loader_gets_the_typed_options_that_were_set(tmp_path, loaded):
    onnx, gguf = _bundle(tmp_path / "onnx", "onnx"), _bundle(tmp_path / "gguf", "gguf")
    edgesdk.load(onnx, threads=2, providers=["CPUExecutionProvider"], cuda_graphs=None)
    edgesdk.load(gguf, n_ctx=512, n_gpu_layers="all", flash_attn=False, verbose=True)
    given = GgufLoadOptions(n_batch=64, n_ubatch=32)
    edgesdk.load(gguf, options=given)
    edgesdk.load(gguf)
    # the loader gets the format's dataclass itself, never a dict made from it (issue 40 item 1)
    assert [type(o) for o in loaded] == [OnnxLoadOptions, GgufLoadOptions, GgufLoadOptions, GgufLoadOptions]
    assert loaded[2] is given
    assert loaded == [
        OnnxLoadOptions(threads=2, providers=["CPUExecutionProvider"]),  # None: the default
        GgufLoadOptions(verbose=True, n_ctx=512, n_gpu_layers="all", flash_attn=False),
        GgufLoadOptions(n_batch=64, n_ubatch=32),
        GgufLoadOptions(),
    ]
    assert loaded[1].flash_attn is False and loaded[0].cuda_graphs is None  # "not given" stays None


def test_a_loader_narrows_the_shared_options_to_its_kind():
    shared = LoadOptions(threads=3, verbose=True, extra={"beam": 4})
    narrowed = GgufLoadOptions.narrow(shared)
    assert type(narrowed) is GgufLoadOptions and (narrowed.threads, narrowed.verbose) == (3, True)
    assert narrowed.extra == {"beam": 4} and narrowed.n_ctx is None
    own = VlmLoadOptions(n_ctx=64)
    assert VlmLoadOptions.narrow(own) is own and OnnxLoadOptions.narrow(None) == OnnxLoadOptions()
    with pytest.raises(InputError, match=r"^GgufLoadOptions is for gguf bundles, not onnx, tensorrt, torch: use "):
        OnnxLoadOptions.narrow(GgufLoadOptions(n_ctx=64))


@pytest.mark.parametrize("threads", [-4, 0, True, 2.5, "2"])
def test_threads_must_be_a_positive_integer_in_every_kind(threads):
    for cls in (LoadOptions, OnnxLoadOptions, GgufLoadOptions, VlmLoadOptions):
        with pytest.raises(InputError, match=r"^threads must be a positive integer \(CPU threads\), got "):
            cls(threads=threads)


def test_kinds_and_names():
    assert options_class("onnx") is options_class("tensorrt") is options_class("torch") is OnnxLoadOptions
    assert options_class("gguf") is GgufLoadOptions and options_class("vlm") is VlmLoadOptions
    assert options_class("someone-elses-format") is LoadOptions
    assert S.LOAD_OPTIONS == all_option_names()
    assert {"threads", "verbose"} <= set(VlmLoadOptions.names()) and "extra" not in LoadOptions.names()
    # a registered format's own names (its load_options attribute) pass through to its loader
    opts = parse_load_options({"threads": 1, "beam": 4}, "someone-elses-format", ("beam",))
    assert opts.to_dict() == {"threads": 1, "beam": 4}
