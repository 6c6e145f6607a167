# SPDX-License-Identifier: Apache-2.0
"""Issue 34, item 11: library and CLI leftovers, each a one-line error with its documented exit code.

* ``embed()`` with a lone surrogate or a generator raised a bare TypeError (from tokenizers), ``generate()`` /
  ``chat()`` with a lone surrogate a bare UnicodeEncodeError (from llama.cpp's tokenizer); the server already
  refused both with 400;
* a non-UTF-8 profile was exit 1 "internal error"; a 3,000,000-item YAML profile took over 120 s; a YAML alias
  bomb expanded without end: refused at load, by size, node count and aliases, before the tree is built.

The Session checks run before any model is touched, so these tests call them on a stand-in session (fast tier).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgesdk.errors import InputError, ProfileError, ShapeError
from edgesdk.profiles import MAX_PROFILE_NODES, load_profile_file
from edgesdk.runtime.requests import GenerationRequest
from edgesdk.runtime.session import Session


class _NoLLM:
    def __getattr__(self, name):
        raise AssertionError(f"the model was reached ({name}) before the input was checked")


class _Stub:
    """What Session's input checks see of a session: nothing else may be reached."""

    def _llm(self, what):
        return _NoLLM()

    def __getattr__(self, name):
        raise AssertionError(f"the session was reached ({name}) before the input was checked")


@pytest.mark.parametrize(
    ("texts", "error", "says"),
    [
        ("a\ud800b", InputError, r"^embed\(\) text 0 holds a lone UTF-16 surrogate \('\\ud800'\) at character 1"),
        (["ok", "x\udfff"], InputError, r"^embed\(\) text 1 holds a lone UTF-16 surrogate"),
        ((t for t in ["a", "b"]), ShapeError, r"got generator \(pass list\(\.\.\.\)\)"),
        ({"a", "b"}, ShapeError, r"got set"),
    ],
)
def test_embed_refuses_a_lone_surrogate_and_a_generator_with_one_line(texts, error, says):
    with pytest.raises(error, match=says) as err:
        Session.embed(_Stub(), texts)  # type: ignore[arg-type]
    assert "\n" not in str(err.value) and err.value.exit_code == 3


def test_generate_stream_and_chat_refuse_a_lone_surrogate():
    for call in (
        lambda: Session.generate(_Stub(), "Hi \ud83d"),  # type: ignore[arg-type]
        lambda: Session.stream(_Stub(), "Hi \ud83d"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InputError, match=r"^prompt holds a lone UTF-16 surrogate \('\\ud83d'\) at character 3"):
            call()
    messages = [{"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]
    with pytest.raises(InputError, match=r"^messages\[0\]\.content\[0\]\.text holds a lone UTF-16 surrogate"):
        Session.chat(_Stub(), messages)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^prompt holds a lone UTF-16 surrogate"):
        GenerationRequest(prompt="\udc00")
    with pytest.raises(InputError, match=r"^messages\[0\]\.content holds"):
        GenerationRequest(messages=[{"role": "user", "content": "\udc00"}])


def test_a_non_utf8_profile_is_a_profile_error(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ProfileError, match=r"latin1\.yaml: not UTF-8 text \(byte 0xe9 at offset 9\)") as err:
        load_profile_file(p)
    assert err.value.exit_code == 3


def test_a_huge_or_aliased_yaml_profile_is_refused_before_it_is_built(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\nitems:\n" + "- 1\n" * 3_000_000)  # 12 MB: took > 120 s
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]  # 10^9 leaves
    bomb.write_text("name: bomb\n" + "\n".join(lines) + "\n")
    many = tmp_path / "many.yaml"
    many.write_text("name: x\nitems: [" + ",".join("1" for _ in range(MAX_PROFILE_NODES)) + "]\n")
    t0 = time.perf_counter()
    with pytest.raises(ProfileError, match=r"big\.yaml: over 1024 KiB: not a device profile"):
        load_profile_file(big)
    with pytest.raises(ProfileError, match=r"bomb\.yaml: line 3: YAML aliases \('\*a0'\) are not allowed"):
        load_profile_file(bomb)
    with pytest.raises(ProfileError, match=r"many\.yaml: more than 100,000 YAML nodes"):
        load_profile_file(many)
    assert time.perf_counter() - t0 < 5


def test_the_cli_says_one_line_for_a_non_utf8_profile(tmp_path, run_cli):
    p = tmp_path / "latin1.yaml"
    p.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    result = run_cli("profiles", "show", str(p))
    assert result.returncode == 3, result.stderr
    assert "not UTF-8 text" in result.stderr and "internal error" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# ------------------------------------------------------------------ the rest of item 11
def test_inputs_of_mismatched_lengths_are_one_shape_error_before_the_model():
    """input_ids of 8 tokens with an attention_mask of 6 reached ONNX Runtime, whose kernel message came back
    ('EmbedLayerNormalization node ... Input 0 and 7 (mask) shall have same shape'); a dimension name the inputs
    share must have one length."""
    import numpy as np

    from edgesdk.runtime.backend import TensorSpec, check_feeds

    specs = [TensorSpec(n, "int64", ["batch_size", "sequence_length"]) for n in ("input_ids", "attention_mask")]
    feeds = {"input_ids": np.ones((1, 8), np.int64), "attention_mask": np.ones((1, 6), np.int64)}
    with pytest.raises(ShapeError) as err:
        check_feeds(specs, feeds)
    assert str(err.value) == (
        "input 'attention_mask': dimension 1 (sequence_length) is 6, but 'input_ids' has sequence_length = 8: "
        "inputs sharing a dimension must have the same length there"
    )
    assert err.value.exit_code == 3
    feeds["attention_mask"] = np.ones((1, 8), np.int32)  # agreeing lengths still pass (and are cast)
    assert check_feeds(specs, feeds)["attention_mask"].dtype == np.int64


def _two_output_bundle(path):
    from test_cli_outputs import make_two_output_bundle  # tests/ is on sys.path

    return make_two_output_bundle(path)


def test_profiler_run_on_a_tampered_bundle_prints_only_its_error(tmp_path, run_cli):
    """The device line came first ('device: cpu-x86_64 (confidence 0.6); profile cpu-x86_64'), then the error."""
    bundle = _two_output_bundle(tmp_path / "b")
    model = bundle / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    result = run_cli("profiler", "run", str(bundle), "--iterations", "2", "--op-profile-runs", "0")
    assert result.returncode == 7, result.stderr
    assert result.stderr.startswith("error: ") and "sha256 mismatch for model.onnx" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""


def _unwritable_dir(tmp_path):
    """A directory this process cannot create files in: a mode-555 one, or (as root, whom modes do not stop) /sys."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for cand in (ro, Path("/sys")):
        try:
            fd = os.open(cand / ".edgesdk-probe", os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            return cand
        os.close(fd)
        os.unlink(cand / ".edgesdk-probe")
    pytest.skip("no directory here refuses this process a new file")


def test_a_build_into_a_read_only_directory_is_one_input_error(tmp_path, run_cli):
    """Was exit 1 'internal error: PermissionError: [Errno 13] Permission denied: .../.out.lock'."""
    model = _two_output_bundle(tmp_path / "src") / "model.onnx"
    where = _unwritable_dir(tmp_path)
    try:
        result = run_cli("build", str(model), "-p", "cpu-x86_64", "-o", str(where / "out"), "--model-license", "MIT")
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"error: cannot write the output {where / 'out'}: {where} is not writable ("), (
        result.stderr
    )
    assert "internal error" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
