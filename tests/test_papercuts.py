# SPDX-License-Identifier: Apache-2.0
"""CLI conventions through the real `edgesdk` entry point: --force replaces only bundles, usage mistakes exit 3,
JSON error objects, exclusive flags, -q/-v everywhere, no progress bars off a terminal, the HF -> GGUF CLI
summary, and `profiles detect --write` writing what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli_outputs import make_two_output_bundle  # tests/ is on sys.path (rootdir conftest)

from edgesdk.bundle import check_replaceable
from edgesdk.errors import OutputExistsError


@pytest.fixture(scope="module")
def onnx_bundle(tmp_path_factory) -> Path:
    return make_two_output_bundle(tmp_path_factory.mktemp("b") / "bundle")


def _one_line(stderr: str) -> bool:
    return stderr.count("\n") == 1 and stderr.startswith("error: ") and "Traceback" not in stderr


def test_force_never_deletes_a_directory_that_is_not_a_bundle(minilm_dir, tmp_path, run_cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = run_cli("build", minilm_dir, "-p", "cpu", "-o", out, "--force")
    assert res.returncode == 4 and _one_line(res.stderr), res.stderr
    assert "not an edgesdk bundle" in res.stderr
    assert (out / "keep.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (out / "manifest.json").write_text('{"not": "a bundle"}')
    with pytest.raises(OutputExistsError):
        check_replaceable(out)


def test_force_replaces_empty_dirs_and_bundles(tmp_path, onnx_bundle):
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    check_replaceable(onnx_bundle)


def test_usage_mistakes_exit_3(onnx_bundle, run_cli):
    res = run_cli("run", onnx_bundle, "--prompt", "hi")
    assert res.returncode == 3 and _one_line(res.stderr), res.stderr
    res = run_cli("engine", "show", onnx_bundle)  # not a TensorRT bundle: a usage mistake, not damage
    assert res.returncode == 3 and "TensorRT bundles" in res.stderr and _one_line(res.stderr)


def test_json_failures_print_an_error_object(onnx_bundle, tmp_path, run_cli):
    res = run_cli("engine", "show", onnx_bundle, "--json")
    err = json.loads(res.stdout)["error"]
    assert res.returncode == err["exit_code"] == 3 and err["type"] == "InputError" and "TensorRT" in err["message"]
    res = run_cli("profiles", "show", "no-such-device", "--json")
    assert res.returncode == 3 and json.loads(res.stdout)["error"]["type"] == "ProfileError"
    res = run_cli("run", tmp_path / "missing", "--input", "x", "--json")
    assert json.loads(res.stdout)["error"]["exit_code"] == res.returncode == 3
    res = run_cli("profiles", "list", "--json", "--bogus")  # click's own usage errors too
    assert res.returncode == 3 and json.loads(res.stdout)["error"]["type"] == "UsageError"


@pytest.mark.parametrize(
    "args, words",
    [
        (["build", "{m}", "-p", "cpu", "--plan-only", "-o", "{t}/x"], "--plan-only builds nothing"),
        (["build", "{m}", "-p", "cpu", "--plan-only", "--force"], "--plan-only"),
        (["build", "{m}", "-p", "cpu", "--explain", "--json", "-o", "{t}/x"], "--json"),
        (["build", "{m}", "-p", "cpu", "--format", "onnx", "--dla", "-o", "{t}/x"], "--dla"),
        (["run", "{b}", "--prompt", "hi", "--stream", "--json"], "--stream"),
        (["run", "{b}", "--input", "hi", "--force"], "--force"),
        (["profiles", "detect", "--force"], "--force"),
    ],
)
def test_mutually_exclusive_flags_exit_3(args, words, minilm_dir, onnx_bundle, tmp_path, run_cli):
    argv = [a.format(m=minilm_dir, b=onnx_bundle, t=tmp_path) for a in args]
    res = run_cli(*argv)
    assert res.returncode == 3 and words in res.stderr and _one_line(res.stderr), res.stderr
    assert not (tmp_path / "x").exists()


def _leaf_commands(group, prefix=()):
    import click

    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _leaf_commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name), cmd


@pytest.mark.slow
def test_every_command_takes_quiet_and_verbose(run_cli):
    from edgesdk.cli import cli

    leaves = list(_leaf_commands(cli))
    assert len(leaves) >= 15
    for path, cmd in leaves:
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"-q", "--quiet", "-v", "--verbose"} <= opts, path
    assert run_cli("profiles", "list", "-q").returncode == 0
    assert run_cli("-q", "profiles", "list").returncode == 0
    assert run_cli("doctor", "-v", "--json").returncode == 0


@pytest.mark.slow
def test_profiler_prints_no_progress_bar_into_logs(onnx_bundle, run_cli):
    """stderr is a pipe here, as in CI: no tqdm bar, even without --no-progress."""
    res = run_cli(
        "profiler", "run", onnx_bundle, "--iterations", "300", "--warmup", "1", "--op-profile-runs", "0", "--json"
    )
    assert res.returncode == 0, res.stderr
    budget = ("--latency-budget-ms", "0.000001")  # missed: a warning line
    res = run_cli(
        "profiler", "run", onnx_bundle, "--iterations", "300", "--warmup", "1", "--op-profile-runs", "0", *budget
    )
    assert res.returncode == 0, res.stderr
    assert "it/s" not in res.stderr and "300/300" not in res.stderr and "\r" not in res.stderr
    assert "warning:" in res.stderr
    quiet = run_cli(
        "profiler", "run", onnx_bundle, "--iterations", "50", "--warmup", "1", "--op-profile-runs", "0", *budget, "-q"
    )
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout


AMD_CPUINFO = "".join(
    f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n"
    "flags\t\t: fpu sse sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16\n\n"
    for i in range(2)
)
MEMINFO_24GB = "MemTotal:       25165824 kB\nMemFree:        20000000 kB\nMemAvailable:   23068672 kB\n"


@pytest.mark.slow
def test_detect_write_records_this_hosts_isa_and_memory(tmp_path, run_cli):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(AMD_CPUINFO)
    (root / "proc" / "meminfo").write_text(MEMINFO_24GB)
    out = tmp_path / "amd-host.yaml"
    res = run_cli("profiles", "detect", "--root", root, "--write", out)
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(out.read_text())
    isa = data["device"]["cpu"]["isa"]
    assert "amx" not in isa and {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"} <= set(isa)
    assert data["device"]["memory"]["total_gb"]["value"] == pytest.approx(25.77, abs=0.01)
    budget = data["policy"]["memory_budget_gb"]
    assert budget == pytest.approx(23.62 * (1 - data["policy"]["memory_headroom_fraction"]), abs=0.1)
    assert budget != 8.0
    assert run_cli("profiles", "show", out).returncode == 0  # a valid profile
    res = run_cli("profiles", "detect", "--root", root, "--write", out)  # no silent overwrite
    assert res.returncode == 4


# ----------------------------------------------------------------------------------- HF -> GGUF through the CLI


@pytest.fixture(scope="module")
def tiny_llama_cli_bundle(tmp_path_factory):
    import os
    import subprocess
    import sys

    from test_gguf_build import make_tiny_causal_lm

    src = make_tiny_causal_lm(tmp_path_factory.mktemp("hf") / "tiny-llama", "llama")
    out = tmp_path_factory.mktemp("gguf") / "tiny-llama-cpu"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            str(src),
            "-p",
            "cpu",
            "--format",
            "gguf",
            "--quant-type",
            "Q8_0",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=900,
    )
    return out, res


@pytest.mark.slow
def test_hf_to_gguf_cli_build_prints_its_summary(tiny_llama_cli_bundle):
    out, res = tiny_llama_cli_bundle
    assert res.returncode == 0, res.stderr  # was: exit 1, KeyError: 'samples', after writing the bundle
    assert (out / "manifest.json").is_file()
    assert "parity logits (HF vs F16 GGUF): min cosine" in res.stdout
    assert "parity perplexity:" in res.stdout and "license gate: pass" in res.stdout


@pytest.mark.slow
def test_input_text_on_an_llm_bundle_is_a_usage_mistake(tiny_llama_cli_bundle, run_cli):
    out, _ = tiny_llama_cli_bundle
    res = run_cli("run", out, "--input", "hi")
    assert res.returncode == 3 and _one_line(res.stderr), res.stderr
