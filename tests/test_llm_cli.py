# SPDX-License-Identifier: Apache-2.0
"""`edgesdk run` on the real Gemma-3-270M Q4_K_M GGUF bundle, as a llama.cpp user drives it: sampling
flags (seeded sampling reproducible across processes), --stop, --chat/--system with named and file
chat templates, usage numbers in --report/--json, llama.cpp's log lines only with --verbose, and
bad values as one-line exit-3 errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from cli_fixtures import THREADS

pytest.importorskip("llama_cpp")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def bundle(gemma_cpu_bundle):
    """tests/conftest.py's Gemma cpu-x86_64 bundle, built once per session (read-only: copy it before changing it)."""
    return gemma_cpu_bundle


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_seeded_sampling_is_reproducible_across_processes(bundle, run_cli):
    args = (
        "run",
        bundle,
        "--prompt",
        PROMPT,
        "-n",
        "16",
        "--temp",
        "0.9",
        "--top-k",
        "60",
        "--top-p",
        "0.98",
        "--min-p",
        "0.0",
        "--repeat-penalty",
        "1.1",
        "--json",
        "--threads",
        str(THREADS),
    )
    a = _json(run_cli(*args, "--seed", "7", timeout=300))
    b = _json(run_cli(*args, "--seed", "7", timeout=300))
    assert a["text"] == b["text"] and a["text"].strip()
    others = {_json(run_cli(*args, "--seed", str(s), timeout=300))["text"] for s in (1, 2)}
    assert others != {a["text"]}  # other seeds sample other text
    u = a["usage"]
    assert u["prompt_tokens"] == 6 and u["completion_tokens"] == 16 and u["finish_reason"] == "length"
    assert u["ttft_ms"] > 0 and u["tokens_per_s"] > 0


def test_stop_cuts_the_text_and_report_prints_usage(bundle, run_cli):
    greedy = _json(run_cli("run", bundle, "--prompt", PROMPT, "-n", "12", "--temp", "0", "--json", timeout=300))
    words = greedy["text"].split()
    assert len(words) >= 3, greedy["text"]
    stop = " " + words[2]
    proc = run_cli(
        "run",
        bundle,
        "--prompt",
        PROMPT,
        "-n",
        "12",
        "--temp",
        "0",
        "--stop",
        "@@never@@",
        "--stop",
        stop,
        "--stream",
        "--report",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == greedy["text"][: greedy["text"].index(stop)]
    usage = next(line for line in proc.stderr.splitlines() if line.startswith("usage:"))  # diagnostics: stderr
    assert not any(line.startswith(("usage:", "ran on")) for line in lines)
    assert "prompt 6 tokens" in usage and "finish stop" in usage and "tok/s" in usage and "TTFT" in usage


def test_chat_templates_named_and_from_a_file(bundle, run_cli, tmp_path):
    plain = _json(run_cli("run", bundle, "--prompt", "Name a colour.", "-n", "4", "--temp", "0", "--json", timeout=300))
    gemma = _json(
        run_cli(
            "run",
            bundle,
            "--chat",
            "--chat-template",
            "gemma",
            "--prompt",
            "Name a colour.",
            "-n",
            "4",
            "--temp",
            "0",
            "--json",
            timeout=300,
        )
    )
    # <start_of_turn> user \n ... <end_of_turn> \n <start_of_turn> model \n: 8 special/format tokens around
    # the same BOS + text, each a single token because the template's markers are Gemma's own special tokens.
    assert gemma["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + 8
    with_system = _json(
        run_cli(
            "run",
            bundle,
            "--system",
            "Be brief.",
            "--chat-template",
            "gemma",
            "--prompt",
            "Name a colour.",
            "-n",
            "4",
            "--temp",
            "0",
            "--json",
            timeout=300,
        )
    )
    assert with_system["usage"]["prompt_tokens"] > gemma["usage"]["prompt_tokens"]
    # A template file: its rendering must be exactly what the model sees (same greedy text as the raw prompt).
    tpl = tmp_path / "qa.jinja"
    tpl.write_text("{#- edgesdk-stop: \\n -#}\n{{ bos_token }}Question: {{ messages[-1]['content'] }}\nAnswer:")
    chat = _json(
        run_cli(
            "run",
            bundle,
            "--chat",
            "--chat-template",
            tpl,
            "--prompt",
            "What is water made of?",
            "-n",
            "12",
            "--temp",
            "0",
            "--json",
            timeout=300,
        )
    )
    raw = _json(
        run_cli(
            "run",
            bundle,
            "--prompt",
            "Question: What is water made of?\nAnswer:",
            "-n",
            "12",
            "--temp",
            "0",
            "--stop",
            "\n",
            "--json",
            timeout=300,
        )
    )
    assert chat["text"] == raw["text"] and chat["usage"]["prompt_tokens"] == raw["usage"]["prompt_tokens"]
    # Piped stdin is one chat turn.
    proc = run_cli_stdin(
        bundle, "Name a colour.", "--chat", "--chat-template", "gemma", "-n", "4", "--temp", "0", "--json"
    )
    assert _json(proc)["usage"]["prompt_tokens"] == gemma["usage"]["prompt_tokens"]


def run_cli_stdin(bundle, stdin_text, *args):
    return subprocess.run(
        [sys.executable, "-m", "edgesdk", "run", str(bundle), *map(str, args)],
        input=stdin_text,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_chat_without_template_and_bad_values_are_one_line_exit_3(bundle, run_cli, tmp_path):
    # (this Gemma GGUF carries no chat template, but its bundle has the one chosen from its architecture; a
    # bundle without any template: tests/test_chat_templates.py)
    cases = [
        (("--chat-template", "no-such-template", "--prompt", "hi"), "neither a shipped name"),
        (("--prompt", "hi", "--max-tokens", "0"), "max_tokens must be >= 1"),
        (("--prompt", "hi", "--max-tokens", "-5"), "max_tokens must be >= 1"),
        (("--prompt", "hi", "--temp", "-1"), "temperature must be >= 0"),
        (("--prompt", "hi", "--top-p", "2"), "top_p must be <= 1"),
        (
            (
                "--temp",
                "0.5",
            ),
            "apply to LLM generation",
        ),
        (
            (
                "--input",
                "some text",
            ),
            "--input embeds text with an encoder",
        ),
    ]
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    cases.append((("--chat-template", broken, "--prompt", "hi"), "not valid Jinja"))
    for args, message in cases:
        proc = run_cli("run", bundle, *args, timeout=300)
        assert proc.returncode == 3, (args, proc.returncode, proc.stderr)
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert proc.stdout == ""


def test_llama_cpp_log_lines_only_with_verbose(bundle, run_cli):
    quiet = run_cli("run", bundle, "--prompt", PROMPT, "-n", "2", timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = run_cli("run", bundle, "--prompt", PROMPT, "-n", "2", "--verbose", timeout=300)
    assert loud.returncode == 0 and "llama_" in loud.stderr


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_interactive_chat_loop_on_a_terminal(bundle):
    """stdin a TTY: one line per turn, replies streamed, /exit ends it."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "run",
            str(bundle),
            "--chat",
            "--chat-template",
            "gemma",
            "-n",
            "4",
            "--temp",
            "0",
        ],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        os.write(master, b"Name a colour.\n")
        time.sleep(0.2)
        os.write(master, b"And another one.\n/exit\n")
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    # Three prompts ("> "): two turns answered (one streamed reply line each), then /exit.
    assert out.count("> ") == 3 and out.count("\n") == 2 and out.endswith("> "), (out, err)
    assert "chat: type a message" in err
