# SPDX-License-Identifier: Apache-2.0
"""llama-cli's short options on ``edgesdk run`` (issue 39, item 14): ``-c`` (context), ``-t`` (threads), ``-ngl``
(GPU layers) with llama-cli's meaning, and ``-i`` interactive (``--input`` keeps its long form). ``-ngl 0`` used to
be read as ``-n gl``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_ngl_is_one_option_not_n_followed_by_gl(run_cli, tmp_path):
    missing = tmp_path / "nope"
    for args in (["-ngl", "0"], ["-ngl", "all", "-c", "512", "-t", "2"], ["--gpu-layers", "auto"]):
        res = run_cli("run", missing, "-p", "hi", *args)
        assert res.returncode == 3 and "bundle not found" in res.stderr, (args, res.stderr)
    res = run_cli("run", missing, "-p", "hi", "-ngl", "x")
    assert res.returncode != 0 and "-ngl" in res.stderr and "not a number of layers" in res.stderr
    res = run_cli("run", missing, "-p", "hi", "-ngl", "-5")
    assert res.returncode != 0 and "-ngl" in res.stderr
    res = run_cli("run", missing, "--input", "hi", "-c", "512")
    assert res.returncode == 3 and "apply to LLM bundles" in res.stderr
    helptext = run_cli("run", "--help").stdout
    assert "-i, --interactive" in helptext and "-ngl" in helptext and "-c, --ctx-size" in helptext
    assert "-t, --threads" in run_cli("serve", "--help").stdout


@pytest.fixture(scope="module")
def bundle(gemma_cpu_bundle):
    """tests/conftest.py's Gemma cpu-x86_64 bundle, built once per session (read-only: copy it before changing it)."""
    pytest.importorskip("llama_cpp")
    return gemma_cpu_bundle


@pytest.mark.slow
def test_c_t_ngl_reach_the_model_and_i_is_interactive_chat(bundle, run_cli):
    base = ("run", bundle, "-p", "The sea is", "-n", "4", "--temp", "0", "--json")
    plain = json.loads(run_cli(*base, "--threads", "2", timeout=300).stdout)
    short = run_cli(*base, "-t", "2", "-c", "256", "-ngl", "0", timeout=300)
    assert short.returncode == 0, short.stderr
    assert json.loads(short.stdout)["text"] == plain["text"]  # same greedy tokens with the short options
    # -c sets the context: a prompt longer than 32 tokens no longer fits
    long_prompt = "one two three four five six seven eight nine ten " * 4
    tight = run_cli("run", bundle, "-p", long_prompt, "-n", "4", "-c", "32", "-t", "2", timeout=300)
    assert tight.returncode != 0 and "context holds 32" in tight.stderr, tight.stderr
    # -i is interactive chat (llama-cli); with stdin piped it answers the piped turn, as --chat does
    chat, inter = (
        subprocess.run(
            [sys.executable, "-m", "edgesdk", "run", str(bundle), flag, "-n", "6", "--temp", "0", "-t", "2"],
            input="Hi",
            capture_output=True,
            text=True,
            timeout=300,
        )
        for flag in ("--chat", "-i")
    )
    assert chat.returncode == 0 and inter.returncode == 0, (chat.stderr, inter.stderr)
    assert inter.stdout == chat.stdout and inter.stdout.strip()
