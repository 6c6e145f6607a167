# SPDX-License-Identifier: Apache-2.0
"""The format registry: a toy format registered here is planned, built and loaded through the same
paths as the built-in ones; the planner is pure; the GGUF header reader needs no gguf-py."""

from __future__ import annotations

import builtins
import dataclasses
import io
import json
import sys

import numpy as np
import pytest

import edgesdk
from edgesdk import formats
from edgesdk.build import build, make_plan
from edgesdk.errors import InputError
from edgesdk.host import HostFacts
from edgesdk.inspect import inspect_model
from edgesdk.plan import plan_build
from edgesdk.profiles import resolve_profile
from edgesdk.runtime.backends import get_loader
from edgesdk.types import BuildOptions, Decision


class _ToyBackend:
    name, provider, device = "toy", "toy", "cpu"

    def __init__(self, scale: float):
        from edgesdk.runtime.backend import TensorSpec

        self.scale = scale
        self.inputs = (TensorSpec("x", "float32", (None,)),)
        self.outputs = (TensorSpec("y", "float32", (None,)),)

    def run(self, feeds):
        return {"y": feeds["x"] * np.float32(self.scale)}

    def report(self):
        return {"backend": "toy"}

    def close(self):
        pass


def load_toy(bundle, ctx):
    return _ToyBackend(json.loads(bundle.artifact_path("model").read_text())["scale"])


class ToyFormat:
    name = "toy"
    stages = ("write", "license_gate", "package")
    runtime_loader = f"{__name__}:load_toy"
    runtime_requires = ("numpy", "numpy")
    profiler_backend = None
    selectable = True

    def check_source(self, facts):
        if facts.kind != "onnx":
            raise InputError("toy takes ONNX sources only")

    def claims(self, facts, profile):
        return None

    def plan_precision(self, facts, profile, options):
        return Decision("precision", "fp32", "toys are exact")

    def plan(self, facts, profile, options, host, precision):
        return [Decision("toy.scale", 2.0, "doubling is easy to check")]

    def build(self, ctx):
        with ctx.stage("write"):
            (ctx.staging / "toy.json").write_text(json.dumps({"scale": ctx.plan.decision("toy.scale")}))
            ctx.add_artifact("toy.json", "model")
            ctx.manifest.io = {
                "inputs": [{"name": "x", "dtype": "float32", "shape": [None]}],
                "outputs": [{"name": "y", "dtype": "float32", "shape": [None]}],
            }


@pytest.fixture
def toy_format():
    fmt = formats.register(ToyFormat())
    yield fmt
    formats.unregister("toy")


@pytest.fixture
def tiny_onnx(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    path = tmp_path / "relu.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what the installed onnxruntime loads (onnx writes a newer IR by default)
    model.metadata_props.add(key="license", value="apache-2.0")  # the license gate needs a declared license
    onnx.save(model, str(path))
    return path


def test_builtin_formats_are_listed_by_the_registry():
    assert formats.format_names(selectable=True) == ["onnx", "tensorrt", "gguf", "vlm"]
    assert "torch" in formats.format_names()
    for fmt in formats.all_formats():
        assert isinstance(fmt, formats.Format) and fmt.stages[-2:] == ("license_gate", "package")
    with pytest.raises(InputError, match="unknown format 'nope'"):
        formats.get_format("nope")


def test_a_registered_format_is_planned_built_and_loaded(toy_format, tiny_onnx, tmp_path):
    assert "toy" in formats.format_names(selectable=True)
    plan = make_plan(tiny_onnx, "cpu", BuildOptions(format="toy", progress=False))
    assert plan.format == "toy" and plan.precision == "fp32" and plan.decision("toy.scale") == 2.0
    out = build(tiny_onnx, "cpu", tmp_path / "b", BuildOptions(format="toy", progress=False), plan=plan)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "toy" and {"write", "license_gate"} <= set(manifest["build"]["stage_s"])
    assert get_loader("toy") is load_toy
    with edgesdk.load(out) as session:
        res = session.run({"x": np.array([1.0, -2.0], dtype=np.float32)})
    assert res["y"].tolist() == [2.0, -4.0]


def test_a_registered_format_checks_its_source(toy_format, minilm_dir):
    with pytest.raises(InputError, match="toy takes ONNX sources only"):
        plan_build(inspect_model(minilm_dir), resolve_profile("cpu"), BuildOptions(format="toy"))


class _Claimer(ToyFormat):
    """A toy that claims every ONNX source, asked at ``claim_priority`` (None: no attribute at all)."""

    name = "claimer"

    def claims(self, facts, profile):
        return Decision("format", self.name, "claims every ONNX file") if facts.kind == "onnx" else None


def _claimer(priority):
    fmt = _Claimer()
    if priority is not None:
        fmt.claim_priority = priority
    return fmt


def _onnx_facts(task="other"):
    from edgesdk.types import ModelFacts

    return ModelFacts(source="/m.onnx", kind="onnx", task=task, name="m", graph={})


def test_claims_are_asked_by_priority_then_registry_order():
    names = [f.name for f in formats.claim_order()]
    assert names == ["tensorrt", "gguf", "torch", "vlm", "onnx"]  # the specific ones in registry order, then onnx
    assert formats.claim_priority(formats.get_format("onnx")) == formats.CATCH_ALL < formats.SPECIFIC


@pytest.mark.parametrize("priority,wins", [(formats.SPECIFIC + 1, True), (formats.CATCH_ALL + 1, True), (None, False)])
def test_a_registered_format_with_a_higher_priority_claims_first(priority, wins):
    formats.register(_claimer(priority))
    try:
        plan = plan_build(_onnx_facts(), resolve_profile("cpu"), BuildOptions(), HostFacts())
        order = [f.name for f in formats.claim_order()]
    finally:
        formats.unregister("claimer")
    # without the attribute: the documented default (CATCH_ALL), asked after the built-in catch-all, as before
    assert plan.format == ("claimer" if wins else "onnx")
    assert (order[0] == "claimer") if priority == formats.SPECIFIC + 1 else order.index("claimer") > order.index("gguf")


def test_a_claim_priority_that_is_not_an_int_is_refused():
    formats.register(_claimer("high"))
    try:
        with pytest.raises(TypeError, match="claim_priority must be an int"):
            formats.claim_order()
    finally:
        formats.unregister("claimer")


def test_onnx_catches_what_no_other_format_claims():
    from edgesdk.types import ModelFacts

    cpu = resolve_profile("cpu")
    llm = ModelFacts(source="/m", kind="hf", task="text-generation", name="m")
    onnx = formats.get_format("onnx")
    # onnx claims anything it is asked about (it no longer knows its siblings' tasks) ...
    assert onnx.claims(llm, cpu) is not None and onnx.claims(_onnx_facts("vision"), cpu) is not None
    # ... and is asked last: an LLM goes to GGUF first, what nobody else takes to ONNX
    assert next(c for f in formats.claim_order() if (c := f.claims(llm, cpu))).value == "gguf"
    for task in ("other", "feature-extraction", "vision"):
        assert plan_build(_onnx_facts(task), cpu, BuildOptions(), HostFacts()).format == "onnx"


def test_cli_format_choice_comes_from_the_registry(run_cli):
    res = run_cli("build", "--help")
    assert "[onnx|tensorrt|gguf|vlm]" in res.stdout


def _params(decorators):
    """The click parameters the decorators add to a command, in --help order."""
    import click

    command = lambda **kw: None  # noqa: E731
    for deco in reversed(decorators):
        command = deco(command)
    return [p.name for p in click.command()(command).params]


def test_build_options_of_a_format_come_from_its_package():
    from edgesdk.commands.build import build_cmd

    shared = {"model", "profile", "output", "fmt", "precision", "model_name", "explain", "plan_only", "as_json"}
    owned = {}
    for cls in formats.option_classes():
        names = _params(cls.click_options())
        assert names == [f.name for f in dataclasses.fields(cls)]  # one field per click option, same name
        owned.update(dict.fromkeys(names, cls.__name__))
    assert owned == {
        "seq_len": "OnnxOptions",
        "max_seq_len": "OnnxOptions",
        "max_batch": "OnnxOptions",
        "shapes": "TensorRTOptions",
        "dla": "TensorRTOptions",
        "quant_type": "GgufOptions",
        "context_length": "GgufOptions",
        "chat_template": "GgufOptions",
        "draft": "GgufOptions",
        "vision_runtime": "VlmOptions",
    }
    params = [p.name for p in build_cmd.params]
    assert shared <= set(params) and set(owned) <= set(params)
    assert [p for p in params if p in owned] == list(owned)  # in registry order, after --name
    assert params.index("model_name") + 1 == params.index("seq_len")


@dataclasses.dataclass
class _ToyOptions(formats.FormatOptions):
    toy_gain: float | None = None

    @staticmethod
    def click_options():
        import click

        return [click.option("--toy-gain", type=float, help="Toy: gain.")]

    def check_plan(self, fmt):
        if self.toy_gain is not None and fmt != "toy":
            raise InputError(f"--toy-gain is for toy builds; this plan builds {fmt}")


def test_a_registered_format_adds_a_build_option_in_its_own_package(monkeypatch):
    import click
    from click.testing import CliRunner

    import edgesdk.commands.build as cmd

    toy = ToyFormat()
    toy.options = _ToyOptions
    formats.register(toy)
    try:
        classes = formats.option_classes()
    finally:
        formats.unregister("toy")
    assert classes[-1] is _ToyOptions
    monkeypatch.setattr(cmd, "FORMAT_OPTIONS", classes)  # what build_cmd is made from when the CLI is imported
    seen = {}

    @click.command()
    @cmd.format_options
    def command(**values):
        seen["given"] = [c.from_values(values) for c in classes]
        seen["options"] = BuildOptions()
        for given in seen["given"]:
            given.apply(seen["options"])

    res = CliRunner().invoke(command, ["--toy-gain", "2.5", "--quant-type", "Q8_0"])
    assert res.exit_code == 0, res.output
    options = seen["options"]
    assert options.quant_type == "Q8_0" and options.dla is None and options.seq_len == 128
    assert options.option("toy_gain") == 2.5 == options.extra["toy_gain"]  # no BuildOptions field: extra
    with pytest.raises(InputError, match="--toy-gain is for toy builds; this plan builds onnx"):
        for given in seen["given"]:
            given.check_plan("onnx")
    assert "--toy-gain FLOAT" in CliRunner().invoke(command, ["--help"]).output


def test_build_options_are_checked_and_handed_over_as_before(tiny_onnx, monkeypatch):
    from click.testing import CliRunner

    import edgesdk.build as B
    from edgesdk.cli import cli

    def run(*args):
        return CliRunner().invoke(cli, ["build", str(tiny_onnx), "--profile", "cpu", "--plan-only", *args])

    unknown = run("--quant-typ", "Q4_K_M")  # a misspelt format option: click's usage error, as before
    assert unknown.exit_code == 2 and "No such option '--quant-typ'. Did you mean '--quant-type'?" in unknown.output
    for args, message in [
        (("--dla", "--format", "gguf"), "--dla/--no-dla apply to TensorRT engines; --format gguf has none"),
        (("--shapes", "x:1:1:1", "--format", "vlm"), "--shapes sets TensorRT optimization profiles; --format vlm has"),
        (("--shapes", "x"), "--shapes 'x': expected NAME:MIN:OPT:MAX"),
        (("--chat-template", "chatml"), "chat template with a GGUF build; this plan builds onnx"),
        (("--shapes", "x:1:1:1"), "--shapes sets TensorRT optimization profiles; this plan builds onnx"),
    ]:
        res = run(*args)
        assert isinstance(res.exception, InputError) and message in str(res.exception), (args, res.exception)
    handed = []
    monkeypatch.setattr(B, "make_plan", lambda model, profile, options: handed.append(options) or 1 / 0)
    run("--seq-len", "64", "--max-batch", "4", "--no-dla", "--quant-type", "Q8_0", "--vision-runtime", "gguf")
    o = handed[0]
    assert (o.seq_len, o.max_batch, o.max_seq_len, o.dla, o.shapes) == (64, 4, None, False, None)
    assert (o.quant_type, o.vision_runtime, o.context_length, o.chat_template, o.extra) == (
        "Q8_0",
        "gguf",
        None,
        None,
        {},
    )
    run("--shapes", "x:1x4:2x4:8x4", "--format", "tensorrt")
    assert handed[1].shapes == {"x": {"min": [1, 4], "opt": [2, 4], "max": [8, 4]}} and handed[1].seq_len == 128


class _ToyFileFormat(ToyFormat):
    """A toy that reads ``.toy`` files (and would read pickles, were it asked)."""

    name = "toyfile"

    def facts(self, path):
        from edgesdk.types import ModelFacts

        if path.suffix not in (".toy", ".pt"):
            return None
        return ModelFacts(source=str(path), kind="toy", task="other", name=path.stem)


def test_model_files_are_read_by_the_format_that_knows_them(tiny_onnx, gemma_gguf, tmp_path):
    from edgesdk.errors import ModelError

    assert formats.read_facts(tiny_onnx).kind == "onnx" and formats.read_facts(gemma_gguf).kind == "gguf"
    assert inspect_model(tiny_onnx) == formats.get_format("onnx").facts(tiny_onnx)
    assert inspect_model(gemma_gguf) == formats.get_format("gguf").facts(gemma_gguf)
    toy, pt = tmp_path / "m.toy", tmp_path / "m.pt"
    toy.write_text("toy")
    pt.write_text("not a pickle")
    assert formats.read_facts(toy) is None
    with pytest.raises(ModelError, match=r"m\.toy: unsupported model file type \.toy") as err:
        inspect_model(toy)
    assert err.value.hint == "expected a Hugging Face directory, .onnx or .gguf"
    formats.register(_ToyFileFormat())
    try:
        assert inspect_model(toy).kind == "toy"  # a registered format reads its own files
        with pytest.raises(ModelError, match="pickle checkpoints are not accepted"):
            inspect_model(pt)  # refused before any format reads it
    finally:
        formats.unregister("toyfile")


def test_the_format_packages_import_no_heavy_library():
    import subprocess

    code = (
        "import sys; import edgesdk.formats as f; f.all_formats(); f.claim_order(); f.option_classes(); "
        "print(sorted(m for m in ('click', 'numpy', 'onnx', 'onnxruntime', 'torch', 'transformers', 'gguf', "
        "'llama_cpp', 'yaml') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


@pytest.mark.parametrize("profile,fmt", [("cpu-x86_64", None), ("orin", None), ("orin", "tensorrt"), ("h200", None)])
def test_plan_build_reads_no_file_and_probes_nothing(minilm_dir, monkeypatch, profile, fmt):
    facts = inspect_model(minilm_dir)
    prof = resolve_profile(profile)
    expected = plan_build(facts, prof, BuildOptions(format=fmt), HostFacts()).to_dict()

    def refuse(*args, **kwargs):
        raise AssertionError(f"plan_build opened a file: {args[:1]}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(io, "open", refuse)
    monkeypatch.setattr("pathlib.Path.open", refuse)
    monkeypatch.setattr("edgesdk.host.probe", refuse)
    assert plan_build(facts, prof, BuildOptions(format=fmt), HostFacts()).to_dict() == expected


def test_tensorrt_engine_build_follows_the_host_facts_passed_in(minilm_dir):
    from edgesdk.host import GpuInfo

    facts, orin = inspect_model(minilm_dir), resolve_profile("orin")
    here = plan_build(facts, orin, BuildOptions(format="tensorrt"), HostFacts())
    assert here.decision("engine_build") == "deferred to the device"
    a_matching_host = HostFacts(tensorrt="10.3.0", gpus=(GpuInfo(index=0, name="Orin", sm="8.7"),))
    assert (
        plan_build(facts, orin, BuildOptions(format="tensorrt"), a_matching_host).decision("engine_build")
        == "this host"
    )


def test_cli_build_plans_once_and_builds_the_plan_it_showed(tiny_onnx, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import edgesdk.build as B
    from edgesdk.cli import cli

    calls = []
    real = B.plan_build
    monkeypatch.setattr(B, "plan_build", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "b"
    res = CliRunner().invoke(
        cli,
        [
            "build",
            str(tiny_onnx),
            "--profile",
            "cpu",
            "--precision",
            "fp32",
            "-o",
            str(out),
            "--explain",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    assert len(calls) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    shown = [
        line.split()[0]
        for line in res.output.splitlines()
        if line.startswith("  ") and not line.strip().startswith("because")
    ]
    assert shown == [d["key"] for d in manifest["plan"]["decisions"]]


def test_gguf_header_reader_needs_no_gguf_package(gemma_gguf, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    for name in [m for m in sys.modules if m.startswith("edgesdk.formats.gguf")]:
        monkeypatch.delitem(sys.modules, name)
    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.formats.gguf.facts import gguf_facts

    header = read_gguf_header(gemma_gguf)
    assert header.scalar("general.architecture") == "gemma3" and header.array_length("tokenizer.ggml.tokens")
    assert gguf_facts(gemma_gguf)["file_type"] == "Q4_K_M"


def test_ggml_block_sizes_match_gguf_py():
    gguf = pytest.importorskip("gguf")
    from edgesdk.contracts.gguf_header import GGML_BLOCK_SIZES
    from edgesdk.contracts.gguf_types import FTYPES

    theirs = {int(t): tuple(v) for t, v in gguf.GGML_QUANT_SIZES.items()}
    assert {t: v for t, v in GGML_BLOCK_SIZES.items() if t in theirs} == {
        t: v for t, v in theirs.items() if t in GGML_BLOCK_SIZES
    }
    assert set(theirs) - set(GGML_BLOCK_SIZES) == set(), "a ggml type gguf-py knows is missing here"
    assert all(gguf.LlamaFileType(v).name.removeprefix("MOSTLY_").removeprefix("ALL_") == k for k, v in FTYPES.items())
