# SPDX-License-Identifier: Apache-2.0
"""Adversarial corpus: malformed models, profiles, policies, waivers, bundles, run inputs and traces,
each run through the real ``edgesdk`` CLI in a subprocess.

Every case asserts the documented exit code (docs/exit-codes.md), exactly one ``error:`` line on
stderr, no traceback, and no partial bundle (nor staging folder) at the output path. The small
fixed files live in tests/data/adversarial/; everything else is generated here from them.
``test_corpus_summary`` prints the tally that docs/security.md records.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "adversarial"
CPU_PROFILE = REPO / "profiles" / "cpu-x86_64.yaml"
TIMEOUT_S = 120  # a FIFO or a bomb must not hang: the case fails on timeout


@dataclass
class Case:
    name: str
    kind: str  # model | profile | policy | waiver | bundle | input | trace
    args: list[str]  # {out} {model} {bundle} are filled in
    code: int
    builds: bool = True  # writes to {out}: check for a partial bundle


# --------------------------------------------------------------------------------------------- generators


def tiny_onnx(path: Path, *, external: bool = False, nan: bool = False, op: str = "MatMul") -> Path:
    """x[N,4] @ W[4,4] -> y, license in metadata_props; ``external``: W in ``<name>.data`` beside it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    if nan:
        w[:] = np.nan
    inits = [numpy_helper.from_array(w, "W")] if op == "MatMul" else []
    node = helper.make_node(op, ["x", "W"] if op == "MatMul" else ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.metadata_props.add(key="license", value="apache-2.0")
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def retarget_external(path: Path, location: str, length: int | None = None) -> Path:
    """Rewrite the external-data location (and length) of W in an externally-stored tiny model."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
        if entry.key == "length" and length is not None:
            entry.value = str(length)
    path.write_bytes(model.SerializeToString())
    return path


def hf_dir(
    path: Path,
    config: object = None,
    *,
    raw_config: str | bytes | None = None,
    files: dict[str, str] | None = None,
    safetensors_header: object = None,
) -> Path:
    """A Hugging Face-shaped directory: config.json, a tiny safetensors file, extra files."""
    path.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": 8,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "intermediate_size": 16,
            "vocab_size": 30,
        }
    raw = raw_config if raw_config is not None else json.dumps(config)
    (path / "config.json").write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    header = (
        safetensors_header
        if safetensors_header is not None
        else {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    )
    blob = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(16))
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def profile_variant(path: Path, edit) -> Path:
    """The CPU profile with ``edit(data)`` applied, written as YAML."""
    import yaml

    data = yaml.safe_load(CPU_PROFILE.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set(dotted: str, value):
    def edit(data):
        node = data
        *head, last = dotted.split(".")
        for key in head:
            node = node[key]
        node[last] = value

    return edit


def gguf_bytes(n_tensors: int, n_kv: int, tail: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + tail


# --------------------------------------------------------------------------------------------- corpus


def build_corpus(root: Path) -> list[Case]:
    """Generate every case's files under ``root``; return the cases."""
    m = root / "models"
    p = root / "profiles"
    p.mkdir(parents=True, exist_ok=True)
    ok = tiny_onnx(m / "ok" / "model.onnx")
    cases: list[Case] = []

    def build(name, kind, model, *extra, code=3):
        cases.append(
            Case(
                name,
                kind,
                [
                    "build",
                    str(model),
                    "-p",
                    "cpu-x86_64",
                    "-o",
                    "{out}",
                    "--no-progress",
                    "--precision",
                    "fp32",
                    *map(str, extra),
                ],
                code,
            )
        )

    def build_p(name, prof, code=3, model=ok):
        cases.append(
            Case(
                name,
                "profile",
                ["build", str(model), "-p", str(prof), "-o", "{out}", "--no-progress", "--precision", "fp32"],
                code,
            )
        )

    # ---- model files
    (m / "random.onnx").write_bytes(np.random.default_rng(1).bytes(4096))
    build("onnx-random-bytes", "model", m / "random.onnx")
    (m / "empty.onnx").write_bytes(b"")
    build("onnx-empty", "model", m / "empty.onnx")
    (m / "truncated.onnx").write_bytes(ok.read_bytes()[:60])
    build("onnx-truncated", "model", m / "truncated.onnx")
    # licensed, so the graph is what fails (a model that declares no license is denied first: exit 2)
    build("onnx-graph-ort-rejects", "model", DATA / "unknown_op.onnx", "--model-license", "Apache-2.0")
    esc = retarget_external(tiny_onnx(m / "esc" / "model.onnx", external=True), "../secret.data")
    shutil.copyfile(m / "esc" / "model.onnx.data", m / "secret.data")
    build("onnx-external-data-escapes-dir", "model", esc)
    build(
        "onnx-external-data-absolute",
        "model",
        retarget_external(tiny_onnx(m / "abs" / "model.onnx", external=True), str(m / "secret.data")),
    )
    missing = tiny_onnx(m / "missing" / "model.onnx", external=True)
    (m / "missing" / "model.onnx.data").unlink()
    build("onnx-external-data-missing", "model", missing)
    build(
        "onnx-external-data-truncated",
        "model",
        retarget_external(tiny_onnx(m / "trunc" / "model.onnx", external=True), "model.onnx.data", 10_000),
    )
    link = tiny_onnx(m / "link" / "model.onnx", external=True)
    (m / "link" / "model.onnx.data").unlink()
    (m / "link" / "model.onnx.data").symlink_to(m / "secret.data")
    build("onnx-external-data-symlink-out", "model", link)
    fifo = m / "fifo" / "model.onnx"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    build("onnx-fifo", "model", fifo)
    build("model-missing", "model", m / "nope.onnx")
    (m / "weights.bin").write_bytes(b"\x80\x04")
    build("model-pickle-file", "model", m / "weights.bin")
    build("hf-config-list", "model", hf_dir(m / "cfg-list", [1, 2, 3]))
    build("hf-config-string", "model", hf_dir(m / "cfg-str", "big"))
    build("hf-config-not-json", "model", hf_dir(m / "cfg-nojson", raw_config="{hidden_size: 8"))
    build("hf-config-deep-nesting", "model", hf_dir(m / "cfg-deep", raw_config="[" * 200_000))
    build("hf-config-not-utf8", "model", hf_dir(m / "cfg-bin", raw_config=b"\xff\xfe{\x00"))
    for key, value in (
        ("hidden_size", "big"),
        ("num_attention_heads", -4),
        ("num_hidden_layers", 0),
        ("vocab_size", 1.5),
        ("max_position_embeddings", True),
        ("architectures", "BertModel"),
    ):
        cfg = {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": 8,
            "num_attention_heads": 2,
            key: value,
        }
        build(f"hf-config-{key}-{value!s}".lower(), "model", hf_dir(m / f"cfg-{key}", cfg))
    build("hf-tokenizer-not-json", "model", hf_dir(m / "tok-nojson", files={"tokenizer.json": "not json at all"}))
    build("hf-tokenizer-list", "model", hf_dir(m / "tok-list", files={"tokenizer.json": "[]"}))
    build("hf-modules-json-object", "model", hf_dir(m / "mod-obj", files={"modules.json": "{}"}))
    build("hf-pooling-config-not-json", "model", hf_dir(m / "pool", files={"1_Pooling/config.json": "{"}))
    build(
        "hf-safetensors-shape-strings",
        "model",
        hf_dir(m / "st-shape", safetensors_header={"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}}),
    )
    build("hf-safetensors-header-list", "model", hf_dir(m / "st-list", safetensors_header=[1, 2]))
    build("hf-no-weights", "model", _no_weights(m / "now"))
    (m / "random.gguf").write_bytes(np.random.default_rng(2).bytes(4096))
    build("gguf-random-bytes", "model", m / "random.gguf")
    (m / "counts.gguf").write_bytes(gguf_bytes(2**62, 2**62))
    build("gguf-absurd-counts", "model", m / "counts.gguf")
    (m / "strlen.gguf").write_bytes(gguf_bytes(0, 1, struct.pack("<Q", 2**60) + b"general.name"))
    build("gguf-absurd-string-length", "model", m / "strlen.gguf")
    (m / "short.gguf").write_bytes(b"GGUF\x03\x00")
    build("gguf-truncated-header", "model", m / "short.gguf")

    # ---- numbers at the boundary (CLI flags and profiles)
    build("context-length-negative", "profile", ok, "--context-length", "-5")
    build("context-length-zero", "profile", ok, "--context-length", "0")
    build("context-length-not-a-number", "profile", ok, "--context-length", "big")
    variants = {
        "budget-negative": ("policy.memory_budget_gb", -1, 3),
        "budget-zero": ("policy.memory_budget_gb", 0, 3),
        "budget-string": ("policy.memory_budget_gb", "big", 3),
        "budget-nan": ("policy.memory_budget_gb", float("nan"), 3),
        "budget-too-small-for-model": ("policy.memory_budget_gb", 1e-7, 8),
        "headroom-over-one": ("policy.memory_headroom_fraction", 1.5, 3),
        "llm-context-negative": ("policy.llm.context_length", -4096, 3),
        "llm-context-huge": ("policy.llm.context_length", 2**40, 3),
        "llm-min-context-over-context": ("policy.llm.min_context_length", 10**6, 3),
        "quant-order-unknown-type": ("policy.llm.quant_order", ["Q9_X"], 3),
        "quant-order-numbers": ("policy.llm.quant_order", [1, 2], 3),
        "quant-order-empty": ("policy.llm.quant_order", [], 3),
        "precision-unknown": ("policy.precision", ["int3"], 3),
        "formats-numbers": ("policy.formats", [42], 3),
        "formats-empty": ("policy.formats", [], 3),
        "execution-providers-junk": ("policy.execution_providers", ["rm -rf /"], 3),
        "parity-unknown-key": ("policy.parity", {"int8": {"min_cosin": 0.9}}, 3),
        "parity-string": ("policy.parity", {"fp32": {"min_cosine": "high"}}, 3),
        "memory-total-negative": ("device.memory.total_gb", {"value": -8, "source": "x"}, 3),
        "cpu-cores-zero": ("device.cpu.cores", 0, 3),
        "schema-version-wrong": ("schema_version", 99, 3),
        "name-not-string": ("name", ["a"], 3),
    }
    for name, (key, value, code) in variants.items():
        build_p(f"profile-{name}", profile_variant(p / f"{name}.yaml", _set(key, value)), code)
    (p / "list.yaml").write_text("- a\n- b\n")
    build_p("profile-top-level-list", p / "list.yaml")
    (p / "bad.yaml").write_text("name: [unclosed\n")
    build_p("profile-not-yaml", p / "bad.yaml")
    build_p("profile-billion-laughs", DATA / "billion_laughs.yaml")
    build_p("profile-missing-file", p / "nope.yaml")
    cases.append(Case("profile-unknown-name", "profile", ["build", str(ok), "-p", "no-such-device", "-o", "{out}"], 3))

    # ---- license policy and waivers
    (root / "policy.yaml").write_text("deny: [unclosed\n")
    build("policy-not-yaml", "policy", ok, "--license-policy", root / "policy.yaml")
    (root / "policy-list.yaml").write_text("- GPL-3.0\n")
    build("policy-top-level-list", "policy", ok, "--license-policy", root / "policy-list.yaml")
    (root / "waivers.yaml").write_text("{")
    build("waivers-not-yaml", "waiver", ok, "--waivers", root / "waivers.yaml")
    (root / "waivers-glob.yaml").write_text(
        "waivers:\n- subject: '?*'\n  license: GPL-3.0-only\n  reason: all\n  approved_by: me\n  expires: 2099-01-01\n"
    )
    build("waiver-match-everything-glob", "waiver", ok, "--waivers", root / "waivers-glob.yaml")

    # ---- traces
    (root / "trace.json").write_text('{"resourceSpans": [')
    cases.append(Case("trace-not-json", "trace", ["check", "traces", str(root / "trace.json")], 1, builds=False))
    (root / "trace-deep.json").write_text("[" * 200_000)
    cases.append(
        Case("trace-deep-nesting", "trace", ["check", "traces", str(root / "trace-deep.json")], 1, builds=False)
    )
    cases.append(Case("trace-missing", "trace", ["check", "traces", str(root / "nope.json")], 1, builds=False))
    return cases


def _no_weights(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return path


def bundle_cases(root: Path, bundle: Path) -> list[Case]:
    """Damaged copies of a good bundle, and bad run inputs."""
    cases = []

    def damaged(name: str, edit, code: int = 7):
        copy = root / "bundles" / name
        shutil.copytree(bundle, copy)
        edit(copy)
        cases.append(
            Case(f"bundle-{name}", "bundle", ["run", str(copy), "--inputs", str(root / "good.npz")], code, builds=False)
        )

    np.savez(root / "good.npz", x=np.ones((2, 4), np.float32))
    damaged("manifest-not-json", lambda b: (b / "manifest.json").write_text("{"))
    damaged("manifest-list", lambda b: (b / "manifest.json").write_text("[]"))
    damaged("manifest-deep", lambda b: (b / "manifest.json").write_text("[" * 200_000))
    damaged("manifest-missing", lambda b: (b / "manifest.json").unlink())
    damaged("artifact-tampered", lambda b: (b / "model.onnx.data").write_bytes(b"\0" * 64))
    damaged("artifact-missing", lambda b: (b / "model.onnx.data").unlink())

    def no_sha(b: Path):
        m = json.loads((b / "manifest.json").read_text())
        for a in m.get("artifacts", []):
            a.pop("sha256", None)
        (b / "manifest.json").write_text(json.dumps(m))

    damaged("artifact-without-sha256", no_sha)

    def swap_symlink(b: Path):
        (root / "outside.data").write_bytes((b / "model.onnx.data").read_bytes())
        (b / "model.onnx.data").unlink()
        (b / "model.onnx.data").symlink_to(root / "outside.data")

    damaged("artifact-symlink-outside", swap_symlink)

    for name, arrays in (
        ("wrong-dtype", {"x": np.array([["a"] * 4])}),
        ("missing-input", {"z": np.ones((1, 4))}),
        ("wrong-rank", {"x": np.ones((4,), np.float32)}),
        ("wrong-dim", {"x": np.ones((1, 5), np.float32)}),
    ):
        np.savez(root / f"{name}.npz", **arrays)
        cases.append(
            Case(f"input-{name}", "input", ["run", str(bundle), "--inputs", str(root / f"{name}.npz")], 3, builds=False)
        )
    (root / "not.npz").write_bytes(b"PK\x03\x04garbage")
    cases.append(
        Case("input-not-npz", "input", ["run", str(bundle), "--inputs", str(root / "not.npz")], 3, builds=False)
    )
    return cases


# --------------------------------------------------------------------------------------------- running


def run_cli(args: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EDGESDK_DEBUG": ""}
    env.pop("EDGESDK_DEBUG")
    return subprocess.run(
        [sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def check_case(case: Case, out: Path) -> list[str]:
    """Run one case; return the list of problems (empty: a clean, documented failure)."""
    args = [a.replace("{out}", str(out)) for a in case.args]
    try:
        res = run_cli(args)
    except subprocess.TimeoutExpired:
        return [f"hung for more than {TIMEOUT_S} s"]
    problems = []
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if res.returncode != case.code:
        problems.append(f"exit {res.returncode}, documented {case.code}")
    if "Traceback" in res.stderr or "internal error" in res.stderr:
        problems.append("crash: " + (lines[-1] if lines else ""))
    if len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"stderr is not one 'error:' line: {res.stderr[-400:]!r}")
    if case.builds:
        if out.exists():
            problems.append("partial output at the output path")
        litter = list(out.parent.glob(f".{out.name}.staging*"))
        if litter:
            problems.append(f"staging litter {litter[0].name}")
    return problems


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("adversarial")


@pytest.fixture(scope="module")
def ok_bundle(corpus_root) -> Path:
    """A real bundle of the tiny external-data ONNX (model.onnx + model.onnx.data)."""
    src = tiny_onnx(corpus_root / "src-ext" / "model.onnx", external=True)
    out = corpus_root / "ok-bundle"
    res = run_cli(["build", str(src), "-p", "cpu-x86_64", "--precision", "fp32", "-o", str(out), "--no-progress"])
    assert res.returncode == 0, res.stderr
    return out


def _case_names() -> list[str]:
    scratch = Path(tempfile.mkdtemp(prefix="edgesdk-adv-"))
    try:
        return [c.name for c in build_corpus(scratch)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


CASE_NAMES = _case_names()
BUNDLE_CASE_NAMES = [
    "bundle-manifest-not-json",
    "bundle-manifest-list",
    "bundle-manifest-deep",
    "bundle-manifest-missing",
    "bundle-artifact-tampered",
    "bundle-artifact-missing",
    "bundle-artifact-without-sha256",
    "bundle-artifact-symlink-outside",
    "input-wrong-dtype",
    "input-missing-input",
    "input-wrong-rank",
    "input-wrong-dim",
    "input-not-npz",
]
RESULTS: dict[str, list[str]] = {}


@pytest.fixture(scope="module")
def corpus(corpus_root, ok_bundle) -> dict[str, Case]:
    cases = build_corpus(corpus_root / "gen") + bundle_cases(corpus_root, ok_bundle)
    return {c.name: c for c in cases}


# One case per class runs in the fast suite; the whole corpus (~85 CLI runs, minutes on 2 cores) is slow.
FAST = {
    "onnx-graph-ort-rejects",
    "onnx-external-data-escapes-dir",
    "onnx-fifo",
    "hf-config-list",
    "hf-config-hidden_size-big",
    "hf-tokenizer-not-json",
    "gguf-absurd-counts",
    "context-length-negative",
    "profile-budget-negative",
    "profile-budget-too-small-for-model",
    "profile-quant-order-unknown-type",
    "trace-deep-nesting",
    "bundle-manifest-list",
    "input-not-npz",
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in CASE_NAMES + BUNDLE_CASE_NAMES]
)
def test_case_fails_cleanly_with_its_documented_exit_code(name, corpus, corpus_root):
    case = corpus[name]
    out = corpus_root / "out" / name
    out.parent.mkdir(exist_ok=True)
    problems = check_case(case, out)
    RESULTS[name] = problems
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.slow
def test_corpus_summary(corpus):
    """Tally of the run above (docs/security.md records it): cases, clean errors, crashes, partial outputs."""
    if len(RESULTS) < len(corpus):
        pytest.skip("run the whole module for the summary")
    kinds: dict[str, int] = {}
    for c in corpus.values():
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    clean = sum(1 for p in RESULTS.values() if not p)
    crashes = sum(1 for p in RESULTS.values() if any(x.startswith(("crash", "hung")) for x in p))
    partial = sum(1 for p in RESULTS.values() if any("partial" in x or "litter" in x for x in p))
    print(
        f"\nadversarial corpus: {len(RESULTS)} cases ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
        f"clean errors {clean}; crashes {crashes}; partial outputs {partial}"
    )
    assert clean == len(RESULTS) and crashes == 0 and partial == 0


# --------------------------------------------------------------------------------------------- positive cases


def test_onnx_with_external_data_builds_and_the_data_file_is_hashed(ok_bundle):
    m = json.loads((ok_bundle / "manifest.json").read_text())
    paths = {a["path"]: a for a in m["artifacts"]}
    assert "model.onnx.data" in paths and len(paths["model.onnx.data"]["sha256"]) == 64
    res = (
        run_cli(["run", str(ok_bundle), "--inputs", str(ok_bundle.parent / "good.npz")])
        if (ok_bundle.parent / "good.npz").exists()
        else None
    )
    if res is not None:
        assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_nan_onnx_fails_parity_with_one_line_and_no_numpy_warning(corpus_root):
    src = tiny_onnx(corpus_root / "nan" / "model.onnx", nan=True)
    out = corpus_root / "nan-out"
    res = run_cli(["build", str(src), "-p", "cpu-x86_64", "--precision", "fp32", "-o", str(out), "--no-progress"])
    assert res.returncode == 5
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "non-finite" in lines[0], res.stderr
    assert "RuntimeWarning" not in res.stderr and not out.exists()


@pytest.mark.slow
def test_gguf_with_nan_weights_fails_the_sanity_check_even_when_repackaged(tmp_path):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests"))
    from test_gguf_build import make_tiny_causal_lm

    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.formats.gguf.convert import convert_hf_to_gguf

    good = tmp_path / "good-f16.gguf"
    convert_hf_to_gguf(make_tiny_causal_lm(tmp_path / "hf", "llama"), good, name="tiny")
    bad = tmp_path / "nan-f16.gguf"
    shutil.copyfile(good, bad)
    header = read_gguf_header(bad)
    with open(bad, "r+b") as fh:
        for t in header.tensors:
            fh.seek(header.data_start + t.offset)
            if t.ggml_type in (0, 1):  # F32, F16
                fh.write(np.full(t.n_elements, np.nan, np.float32 if t.ggml_type == 0 else np.float16).tobytes())
    ok = run_cli(
        [
            "build",
            str(good),
            "-p",
            "cpu-x86_64",
            "--quant-type",
            "F16",
            "-o",
            str(tmp_path / "ok"),
            "--no-progress",
            "--accept-license",
            "apache-2.0",
        ]
    )
    assert ok.returncode == 0, ok.stderr
    m = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert m["parity"]["sanity"]["nonfinite_logits"] == 0
    res = run_cli(
        [
            "build",
            str(bad),
            "-p",
            "cpu-x86_64",
            "--quant-type",
            "F16",
            "-o",
            str(tmp_path / "bad"),
            "--no-progress",
            "--accept-license",
            "apache-2.0",
        ]
    )
    assert res.returncode == 5 and "NaN/Inf" in res.stderr, res.stderr
    assert not (tmp_path / "bad").exists()
