# SPDX-License-Identifier: Apache-2.0
"""Issue 25, round two: bad input is one line with its documented exit code (finding 9 and "also open").

GGUF headers that nest arrays deeply, ``threads`` < 1 and unknown ``load()`` options, out-of-vocabulary
ids and empty batches on ONNX Runtime, a manifest ``serve`` that is not a table, and ``check traces`` on
a huge single JSON document or a gzip bomb (bounded memory).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from cli_fixtures import build_matmul_bundle, check_traces_peak_rss_mb, cli

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def one_error_line(res: subprocess.CompletedProcess, code: int) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == code, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    return lines[0]


# ------------------------------------------------------------------------ finding 9: GGUF nesting
def nested_gguf(path: Path, depth: int) -> Path:
    """A GGUF v3 header with one key whose value is ``depth`` arrays, each holding the next, then an empty
    array of uint32."""
    kv = struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    kv += struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv)
    return path


def test_deeply_nested_gguf_arrays_are_one_line_exit_3(tmp_path):
    """Before: RecursionError (exit 1) from the header reader; now a ModelError naming the depth."""
    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.errors import ModelError

    deep = nested_gguf(tmp_path / "deep.gguf", 100_000)
    with pytest.raises(ModelError, match="nested more than 8 deep"):
        read_gguf_header(deep)
    line = one_error_line(cli("build", deep, "--profile", "cpu-x86_64", "-o", tmp_path / "out", "--no-progress"), 3)
    assert "nested more than 8 deep" in line and str(deep) in line
    assert not (tmp_path / "out").exists()
    # real files nest one level (arrays of strings/ints); a few levels still read
    assert read_gguf_header(nested_gguf(tmp_path / "ok.gguf", 7)).array_length("deep") == 1


# ------------------------------------------------------------------------ load options and threads
@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    """A real bundle of x[N,4] @ W[4,4], built by the CLI (seconds)."""
    root = tmp_path_factory.mktemp("r2-tiny")
    bundle = build_matmul_bundle(root, np.random.default_rng(0).standard_normal((4, 4)))
    np.savez(root / "x.npz", x=np.ones((2, 4), np.float32))
    return bundle


def test_load_refuses_an_unknown_option_naming_the_known_ones(tiny_bundle):
    import edgesdk
    from edgesdk.errors import InputError

    with pytest.raises(InputError) as info:
        edgesdk.load(tiny_bundle, n_gpu_layer=8)  # before: ignored in silence
    msg = str(info.value)
    assert msg.startswith("unknown load option n_gpu_layer (known: ") and "n_gpu_layers" in msg
    assert "\n" not in msg
    with edgesdk.load(tiny_bundle, threads=1, providers=["CPUExecutionProvider"]) as s:  # known ones load
        assert s.run({"x": np.ones((1, 4), np.float32)})["y"].shape == (1, 4)


@pytest.mark.parametrize("threads", [-4, 0, True, 2.5, "2"])
def test_load_refuses_threads_that_are_not_a_positive_integer(tiny_bundle, threads):
    import edgesdk
    from edgesdk.errors import InputError

    with pytest.raises(InputError, match=r"^threads must be a positive integer \(CPU threads\), got "):
        edgesdk.load(tiny_bundle, threads=threads)


def test_run_and_serve_refuse_negative_threads(tiny_bundle):
    """Before: `--threads -4` was passed on (ONNX Runtime took it; serve started)."""
    x = tiny_bundle.parent / "x.npz"
    line = one_error_line(cli("run", tiny_bundle, "--inputs", x, "--threads", "-4"), 3)
    assert line == "error: threads must be a positive integer (CPU threads), got -4"
    line = one_error_line(cli("serve", tiny_bundle, "--threads", "-4", "--port", "0", timeout=120), 3)
    assert line == "error: threads must be a positive integer (CPU threads), got -4"


# ------------------------------------------------------------------------ manifest serve table
@pytest.mark.parametrize(
    "manifest, message",
    [
        ({"serve": "lots"}, "manifest serve must be a table of limits (max_tokens, default_max_tokens), got 'lots'"),
        ({"serve": [1, 2]}, "manifest serve must be a table of limits (max_tokens, default_max_tokens), got [1, 2]"),
        ({"profile": {"summary": {"serve": 7}}}, "manifest profile.summary.serve must be a table of limits"),
        ({}, None),
        ({"serve": {}}, None),
        (
            {"serve": {"max_tokens": "9" * 50}},
            "manifest serve.max_tokens must be a positive integer, got '9999999999999999999999999999",
        ),
    ],
)
def test_manifest_serve_that_is_not_a_table_is_an_input_error(manifest, message):
    """Before: ``serve: "lots"`` ended in AttributeError (exit 1). ``manifest`` is the JSON's top-level ``serve``
    and ``profile`` (a manifest whose ``profile`` is not an object is refused when it is read)."""
    from edgesdk.errors import InputError
    from edgesdk.manifest import Manifest, ProfileRef
    from edgesdk.serve import serve_limits

    manifest = Manifest(
        other={k: v for k, v in manifest.items() if k != "profile"},
        profile=ProfileRef(summary=manifest.get("profile", {}).get("summary", {})),
    )
    if message is None:
        assert serve_limits(manifest) == {"max_tokens_cap": 2048, "default_max_tokens": 256}
        return
    with pytest.raises(InputError) as info:
        serve_limits(manifest)
    assert str(info.value).startswith(message) and len(str(info.value)) < 200


# ------------------------------------------------------------------------ ONNX Runtime input errors
@pytest.fixture(scope="module")
def minilm_fp32(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


def _feeds(ids) -> dict[str, np.ndarray]:
    ids = np.asarray(ids, np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


@pytest.mark.slow
def test_out_of_vocab_ids_and_empty_batches_are_shape_errors(minilm_fp32, capfd, tmp_path):
    """Before: onnxruntime's InvalidArgument ('EmbedLayerNormalization ... input index out of range') and an
    [E:onnxruntime] line on stderr; a negative id ran (Gather wraps it to the end of the table); an empty
    batch gave an empty output on FP32 and a Reshape failure on INT8."""
    import edgesdk
    from edgesdk.errors import ShapeError

    with edgesdk.load(minilm_fp32, threads=1) as s:
        cases = {
            "oov": (
                _feeds([[101, 99999, 102]]),
                "input 'input_ids' holds id 99999, outside 0..30521 (the model's vocabulary has 30522 tokens)",
            ),
            "negative": (_feeds([[101, -5, 102]]), "input 'input_ids' holds id -5, outside 0..30521"),
            "batch 0": (_feeds(np.zeros((0, 3))), "input 'input_ids' is empty (shape (0, 3))"),
            "too long": (
                _feeds(np.ones((1, 600))),
                "input 'input_ids' is 600 tokens long; this model takes at most 512",
            ),
            "token type": (
                {**_feeds([[101, 102]]), "token_type_ids": np.full((1, 2), 7)},
                "model.onnx: the inputs are not valid for this model: ",
            ),
        }
        for name, (feeds, message) in cases.items():
            with pytest.raises(ShapeError) as info:
                s.run(feeds)
            assert str(info.value).startswith(message), (name, str(info.value))
            assert "\n" not in str(info.value)
        assert s.embed(["still fine"]).shape == (1, 384)
    assert "onnxruntime" not in capfd.readouterr().err  # no [E:onnxruntime ...] log line
    np.savez(tmp_path / "oov.npz", **_feeds([[101, 99999, 102]]))
    line = one_error_line(cli("run", minilm_fp32, "--inputs", tmp_path / "oov.npz"), 3)
    assert "holds id 99999" in line


@pytest.mark.slow
def test_serve_of_a_bundle_whose_manifest_serve_is_not_a_table(minilm_fp32, tmp_path):
    copy = tmp_path / "minilm"
    shutil.copytree(minilm_fp32, copy)
    from edgesdk.manifest import HASH_FIELD, content_hash

    m = json.loads((copy / "manifest.json").read_text())
    m["serve"] = "lots"
    m[HASH_FIELD] = content_hash(m)  # as a build that wrote it would: the bundle verifies, the value is wrong
    (copy / "manifest.json").write_text(json.dumps(m))
    res = cli("serve", copy, "--port", "0", timeout=120)  # before: AttributeError, exit 1
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error: ")]
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    assert lines == ["error: manifest serve must be a table of limits (max_tokens, default_max_tokens), got 'lots'"]


# ------------------------------------------------------------------------ check traces: bounded memory
def _baseline_rss_mb(tmp_path: Path) -> float:
    empty = tmp_path / "tiny.jsonl"
    empty.write_text(json.dumps({"resourceSpans": []}) + "\n")
    return check_traces_peak_rss_mb(empty)[0]


def test_huge_single_json_document_is_refused_in_bounded_memory(tmp_path):
    """A 100 MiB OTLP document written over many lines (so not JSON Lines). Before: parsed whole (a 200 MB
    one took 2.6 GB); now refused past 64 MiB with a pointer to JSON Lines, memory ~ the limit."""
    span = json.dumps(
        {
            "traceId": "0" * 32,
            "spanId": "1" * 16,
            "name": "x" * 200,
            "kind": 2,
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [],
        }
    )
    path = tmp_path / "huge.json"
    with open(path, "w") as fh:
        fh.write('{"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {}, "spans": [\n')
        chunk = ",\n".join([span] * 2000)
        for i in range(100 * 1024 * 1024 // len(chunk) + 1):
            fh.write(("," if i else "") + chunk + "\n")
        fh.write("]}]}]}\n")
    assert path.stat().st_size > 100 * 1024 * 1024
    base = _baseline_rss_mb(tmp_path)
    peak, res = check_traces_peak_rss_mb(path)
    line = one_error_line(res, 1)
    assert "is one JSON document of more than 64 MiB" in line and "OTLP/JSON lines" in line
    assert peak - base < 400, (peak, base)


def test_gzip_bomb_of_one_endless_line_is_refused_in_bounded_memory(tmp_path):
    """1 GiB of 'a' without a newline in a ~1 MB gzip. Before: the line was accumulated whole (MemoryError
    on the issue's larger bomb); now refused at 64 MiB."""
    path = tmp_path / "bomb.jsonl.gz"
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    block = b"a" * (1 << 20)
    with open(path, "wb") as fh:
        for _ in range(1024):
            fh.write(comp.compress(block))
        fh.write(comp.flush())
    assert path.stat().st_size < 4 << 20
    with gzip.open(path, "rb") as g:
        assert g.read(4) == b"aaaa"
    base = _baseline_rss_mb(tmp_path)
    peak, res = check_traces_peak_rss_mb(path)
    line = one_error_line(res, 1)
    assert "is longer than 64 MiB" in line
    assert peak - base < 400, (peak, base)


def test_millions_of_blank_lines_stop_early(tmp_path):
    path = tmp_path / "blank.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=1) as g:
        g.write(b"\n" * (20 << 20))
    line = one_error_line(cli("check", "traces", path, timeout=120), 1)
    assert "blank lines and no JSON" in line
