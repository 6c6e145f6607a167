# SPDX-License-Identifier: Apache-2.0
"""Issue 24's CLI papercuts, each through the real `edgesdk` entry point (or the function the CLI prints with):
diagnostics of `run` on stderr (-q silences them), the prompt from stdin or a file, the interactive chat running
to end-of-generation, `-p` as the prompt (deprecated as --profile), one-line refusals (--image on a text bundle,
inspect capability of a GGUF, check licenses --json --summary), units and plain numbers in tables, profiler
compare of different builds, dist/ ignored, the demo's copy-pasteable commands, and the build's progress bar
under a pseudo-terminal without a window size."""

from __future__ import annotations

import os
import pty
import select
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HAIKU = "Write a haiku about the sea."


def _one_line(stderr: str) -> bool:
    return stderr.count("\n") == 1 and stderr.startswith("error: ") and "Traceback" not in stderr


def _cli(*args, stdin=None, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgesdk", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def _pty_run(argv: list[str], *, feed: bytes = b"", timeout: float = 300, stdin_tty: bool = False):
    """Run ``argv`` with stderr (and, with ``stdin_tty``, stdin) on a pseudo-terminal that has no window size, as
    `script` gives when it is run from a pipe. Returns (returncode, stdout text, what the terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv,
        stdin=slave if stdin_tty else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    os.close(slave)
    if feed:
        time.sleep(0.5)
        os.write(master, feed)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read().decode() if proc.stdout else ""
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, out, seen.decode("utf-8", "replace")


# ------------------------------------------------------------------ bundles
@pytest.fixture(scope="module")
def gemma_bundle(gemma_gguf, tmp_path_factory) -> Path:
    """Gemma-3-270M Q4_K_M repackaged for this CPU with a 256-token context (so end-of-generation is near)."""
    out = tmp_path_factory.mktemp("pc") / "gemma-cpu"
    res = _cli(
        "build",
        gemma_gguf,
        "--profile",
        "cpu",
        "-o",
        out,
        "--accept-license",
        "LicenseRef-gemma",
        "--context-length",
        "256",
    )
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def onnx_bundle(tmp_path_factory) -> Path:
    from test_cli_outputs import make_two_output_bundle

    return make_two_output_bundle(tmp_path_factory.mktemp("b") / "bundle")


# ------------------------------------------------------------------ run: stdout is the answer
def test_run_diagnostics_go_to_stderr_and_q_silences_them(gemma_bundle):
    res = _cli("run", gemma_bundle, "--prompt", HAIKU, "-n", "8", "--temperature", "0", "--report")
    assert res.returncode == 0, res.stderr
    assert "ran on" not in res.stdout and "usage:" not in res.stdout and "fallback" not in res.stdout
    assert "ran on llama.cpp" in res.stderr and "usage: prompt" in res.stderr
    quiet = _cli("run", gemma_bundle, "--prompt", HAIKU, "-n", "8", "--temperature", "0", "--report", "-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == res.stdout


def test_prompt_from_stdin_and_from_a_file(gemma_bundle, tmp_path):
    direct = _cli("run", gemma_bundle, "--prompt", HAIKU, "-n", "8", "--temperature", "0")
    piped = _cli("run", gemma_bundle, "--prompt", "-", "-n", "8", "--temperature", "0", stdin=HAIKU)
    (tmp_path / "prompt.txt").write_text(HAIKU, encoding="utf-8")
    from_file = _cli("run", gemma_bundle, "-f", tmp_path / "prompt.txt", "-n", "8", "--temperature", "0")
    assert direct.returncode == piped.returncode == from_file.returncode == 0, (piped.stderr, from_file.stderr)
    assert direct.stdout.strip() and direct.stdout == piped.stdout == from_file.stdout
    both = _cli("run", gemma_bundle, "--prompt", "hi", "-f", tmp_path / "prompt.txt")
    assert both.returncode == 3 and _one_line(both.stderr) and "pass the prompt once" in both.stderr
    missing = _cli("run", gemma_bundle, "-f", tmp_path / "nope.txt")
    assert missing.returncode == 3 and _one_line(missing.stderr) and "nope.txt" in missing.stderr
    empty = _cli("run", gemma_bundle, "--prompt", "-", stdin="")
    assert empty.returncode == 3 and _one_line(empty.stderr) and "stdin was empty" in empty.stderr


def test_stop_unescapes_backslash_n_as_llama_cli(gemma_bundle):
    """bash passes --stop "\\n\\nIt" as backslash-n: it is unescaped, so generation stops at the blank line."""
    args = ("run", gemma_bundle, "--prompt", HAIKU, "-n", "48", "--temperature", "0")
    full = _cli(*args).stdout
    assert "\n\nIt" in full, full  # greedy Gemma-3-270M: paragraphs starting "It is a place ..."
    stopped = _cli(*args, "--stop", r"\n\nIt")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == full[: full.index("\n\nIt")] + "\n"


def test_unescape_rules():
    from edgesdk.commands.run import unescape

    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb\\c") == "a\tb\\c" and unescape(r"\"x\'") == "\"x'"
    assert unescape(r"\q\\n") == "\\q\\n" and unescape("trailing\\") == "trailing\\"


@pytest.mark.slow
def test_interactive_chat_runs_to_end_of_generation_not_64_tokens(gemma_bundle):
    """On a terminal, the chat's reply is not cut at -n's one-shot default (64): here it runs until the
    256-token context is full, so it is longer than the same turn given with --prompt (64 tokens)."""
    common = ["--chat", "--chat-template", "gemma", "--temperature", "0"]
    msg = "Count from 1 to 40, one number per line."
    one_shot = _cli("run", gemma_bundle, *common, "--prompt", msg)
    assert one_shot.returncode == 0, one_shot.stderr
    rc, out, _ = _pty_run(
        [sys.executable, "-m", "edgesdk", "run", str(gemma_bundle), *common],
        stdin_tty=True,
        feed=msg.encode() + b"\n\x04",
        timeout=240,
    )
    assert rc == 0, out
    reply = out.removeprefix("> ").split("\n> ")[0]
    assert reply.startswith(one_shot.stdout.strip()) and len(reply) > len(one_shot.stdout.strip()) + 20, (
        reply,
        one_shot.stdout,
    )


def test_image_on_a_text_bundle_says_it_is_not_a_vlm(gemma_bundle, tmp_path):
    img = tmp_path / "cat.png"
    img.write_bytes(b"\x89PNG\r\n\x1a\n")
    res = _cli("run", gemma_bundle, "--prompt", "what is this?", "--image", img)
    assert res.returncode == 3 and _one_line(res.stderr), res.stderr
    assert "this bundle is not a VLM (gguf bundle of" in res.stderr and "images" not in res.stderr


# ------------------------------------------------------------------ -p is the prompt
def test_p_is_the_prompt_and_deprecated_for_profile(minilm_dir):
    from edgesdk.cli import cli

    run_opts = {o for p in cli.commands["run"].params for o in getattr(p, "opts", [])}
    assert "-p" in run_opts and next(p for p in cli.commands["run"].params if "-p" in p.opts).name == "prompt"
    for path in (("build",), ("inspect", "capability"), ("profiler", "run"), ("profiler", "predict")):
        res = _cli(*path, "--help")
        assert res.returncode == 0 and "-p," not in res.stdout and "--profile" in res.stdout, path
    piped = _cli("build", minilm_dir, "-p", "cpu", "--plan-only")  # still accepted; scripts see no new line
    assert piped.returncode == 0 and "on profile cpu-x86_64" in piped.stdout and piped.stderr == ""
    rc, out, term = _pty_run([sys.executable, "-m", "edgesdk", "build", str(minilm_dir), "-p", "cpu", "--plan-only"])
    assert rc == 0 and "on profile cpu-x86_64" in out
    assert "warning: -p for --profile is deprecated" in term and "write --profile" in term
    rc, out, term = _pty_run(
        [sys.executable, "-m", "edgesdk", "build", str(minilm_dir), "--profile", "cpu", "--plan-only"]
    )
    assert rc == 0 and "deprecated" not in term


# ------------------------------------------------------------------ one-line refusals
def test_inspect_capability_of_a_gguf_says_it_has_no_onnx_graph(gemma_bundle, gemma_gguf):
    for target in (gemma_bundle, gemma_gguf):
        res = _cli("inspect", "capability", target, "--profile", "orin")
        assert res.returncode == 3 and _one_line(res.stderr), res.stderr
        assert "GGUF" in res.stderr and "has no ONNX graph" in res.stderr and "DecodeError" not in res.stderr


def test_inspect_capability_without_onnx_names_the_extra(onnx_bundle):
    """README: anything that needs a missing extra exits 10 with one line naming it (the runtime-only install
    has no `onnx`; hidden here as it is absent there)."""
    code = (
        "import sys; sys.modules['onnx'] = None; from edgesdk.cli import main; "
        f"main(['inspect', 'capability', {str(onnx_bundle)!r}])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 10 and _one_line(res.stderr), res.stderr
    assert "pip install 'edgesdk[build]'" in res.stderr and "missing: onnx" in res.stderr


def test_check_licenses_refuses_json_with_summary():
    res = _cli("check", "licenses", REPO / "edgesdk" / "errors.py", "--json", "--summary")
    assert res.returncode == 3 and _one_line(res.stderr), res.stderr
    assert "--json and --summary" in res.stderr and "pass one" in res.stderr


# ------------------------------------------------------------------ numbers people read
def test_build_explain_gives_memory_a_unit(minilm_dir):
    import re

    res = _cli("build", minilm_dir, "--profile", "orin", "--plan-only")
    assert res.returncode == 0, res.stderr
    assert re.search(r"^  memory\s+\d+\.\d+ GB$", res.stdout, re.M), res.stdout


def test_profiler_tables_print_plain_numbers():
    from edgesdk.profiler.compare import compare_reports, render_comparison
    from edgesdk.profiler.report import plain, render_table

    assert [plain(v) for v in (1534.2, 0.00123, 12345.6, 0.0, 42.0, 1.5, 0.0000123)] == [
        "1534",
        "0.00123",
        "12,346",
        "0",
        "42",
        "1.5",
        "0.0000123",
    ]
    lat = {
        "p50": 1534.2,
        "p90": 1700.4,
        "p99": 1812.9,
        "min": 1500.1,
        "max": 1900.3,
        "stdev": 120.5,
        "iqr": 98.7,
        "cv_pct": 7.8,
    }
    report = {
        "bundle": {"model": "m", "format": "onnx", "precision": "fp16", "bundle_id": "a"},
        "latency_ms": lat,
        "load": {"time_ms": 2345.6},
        "memory": {"host_peak_rss_mb": 1234.5},
    }
    text = render_table(report)
    assert "e+" not in text and "1534 / 1700 / 1813 ms" in text
    table = render_comparison(compare_reports(report, report))
    assert "e+" not in table and "1534" in table


def test_profiler_compare_of_different_builds_says_so_and_the_plot_keeps_the_noise():
    from edgesdk.profiler.compare import compare_reports, render_comparison
    from edgesdk.profiler.plots import _worse_text

    lat = {"p50": 2.0, "p90": 2.2, "p99": 2.5, "iqr": 0.1}
    fp16 = {"bundle": {"model": "minilm", "format": "onnx", "precision": "fp16", "bundle_id": "aaa"}, "latency_ms": lat}
    int8 = {
        "bundle": {"model": "minilm", "format": "onnx", "precision": "int8", "bundle_id": "bbb"},
        "latency_ms": {**lat, "p50": 1.5},
    }
    different = render_comparison(compare_reports(fp16, int8))
    assert "different builds" in different and "onnx/fp16" in different and "onnx/int8" in different
    assert "different builds" not in render_comparison(compare_reports(fp16, fp16))
    row = next(r for r in compare_reports(fp16, int8)["rows"] if r["metric"] == "latency p50 (ms)")
    assert row["noise_pct"] is not None and f"±{row['noise_pct']:.1f}%" in _worse_text(row)


# ------------------------------------------------------------------ repository and demo
def test_dist_is_ignored():
    res = subprocess.run(["git", "check-ignore", "-q", "dist/edgesdk-0.3.0-py3-none-any.whl"], cwd=REPO)
    assert res.returncode == 0


def test_demo_echoes_copy_pasteable_commands_with_the_models_name(capsys, monkeypatch):
    sys.path.insert(0, str(REPO / "examples" / "minilm"))
    try:
        import demo
    finally:
        sys.path.pop(0)
    line = demo.echo_line(["build", "/tmp/my models/m", "--name", demo.MODEL_NAME, "--input", "The cat sits."])
    assert line.startswith("$ edgesdk build ")
    assert shlex.split(line[2:]) == [
        "edgesdk",
        "build",
        "/tmp/my models/m",
        "--name",
        "all-MiniLM-L6-v2",
        "--input",
        "The cat sits.",
    ]
    builds = [s for s in demo.steps("/m") if s[0] == "build"]
    assert builds and all(s[s.index("--name") + 1] == "all-MiniLM-L6-v2" for s in builds)


# ------------------------------------------------------------------ progress under a pseudo-terminal
@pytest.mark.slow
def test_build_draws_its_stage_bar_on_a_terminal_without_a_window_size(tmp_path):
    import test_capability_models as models

    src = models.make_cnn(tmp_path / "cnn.onnx")
    rc, out, term = _pty_run(
        [sys.executable, "-m", "edgesdk", "build", str(src), "--profile", "cpu", "-o", str(tmp_path / "out")]
    )
    assert rc == 0 and "bundle:" in out, term
    assert "build [export]" in term and "/6 stages |" in term, term
    assert "build [export]: :" not in term  # the stage name is the description, without a doubled colon
