# SPDX-License-Identifier: Apache-2.0
"""The llama.cpp runtime on the real Gemma-3-270M Q4_K_M GGUF: generation, streaming, stop sequences,
GenAI telemetry with exact token counts, context overflow, and the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from edgesdk import telemetry  # noqa: E402
from edgesdk.errors import InputError, ShapeError  # noqa: E402
from edgesdk.telemetry import _names as N  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma_bundle(gemma_gguf, tmp_path_factory):
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles") / "gemma-cpu"
    return build(gemma_gguf, "cpu-x86_64", out, BuildOptions(progress=False, accept_licenses=("LicenseRef-gemma",)))


@pytest.fixture(scope="module")
def session(gemma_bundle):
    import edgesdk

    with edgesdk.load(gemma_bundle, threads=2) as s:
        yield s


def test_repackaged_bundle_manifest(gemma_bundle):
    m = json.loads((gemma_bundle / "manifest.json").read_text())
    assert m["precision"] == "Q4_K_M" and m["parity"]["reference"].startswith("none: output is the source")
    assert m["extras"]["llm"]["n_gpu_layers"] == 0 and m["extras"]["llm"]["chat_template"] is False
    assert m["plan"]["decisions"][[d["key"] for d in m["plan"]["decisions"]].index("gguf.source")]["value"] \
        == "repackage: source is already Q4_K_M"


@pytest.mark.slow
def test_greedy_generate_and_stream_agree(session):
    text = session.generate(PROMPT, max_tokens=8, temperature=0)
    assert isinstance(text, str) and text.strip()
    assert session.backend.last["output_tokens"] >= 1
    pieces = list(session.stream(PROMPT, max_tokens=8, temperature=0))
    assert len(pieces) > 1 and "".join(pieces) == text  # streamed piece by piece, same greedy text


@pytest.mark.slow
def test_stop_sequence_cuts_the_text_and_reports_stop(session):
    text = session.generate(PROMPT, max_tokens=10, temperature=0)
    words = text.split()
    if len(words) < 2:
        pytest.skip(f"greedy continuation too short to pick a stop word: {text!r}")
    stop = " " + words[1]
    cut = session.generate(PROMPT, max_tokens=10, temperature=0, stop=[stop])
    assert cut == text[:text.index(stop)]
    assert session.backend.last["finish_reason"] == "stop"


@pytest.mark.slow
def test_telemetry_span_has_exact_token_counts_and_ttft(session):
    spans = InMemorySpanExporter()
    telemetry.shutdown()
    telemetry.configure(span_exporter=spans)
    try:
        session.generate(PROMPT, max_tokens=8, temperature=0)
        assert telemetry.force_flush()
        (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("text_completion")]
    finally:
        telemetry.shutdown()
    a = span.attributes
    assert a[N.PROVIDER_NAME] == "llama.cpp" and a[N.OPERATION_NAME] == "text_completion"
    assert a[N.USAGE_INPUT_TOKENS] == len(session.tokenize(PROMPT))  # BOS included, as the model saw it
    assert a[N.USAGE_OUTPUT_TOKENS] == session.backend.last["output_tokens"]
    assert a[N.RESPONSE_FINISH_REASONS] in (("length",), ("stop",))
    assert 0 < a[N.RESPONSE_TIME_TO_FIRST_CHUNK] < 30
    assert a["gen_ai.request.max_tokens"] == 8


def test_prompt_longer_than_context_is_a_shape_error(session):
    n_ctx = session.backend.settings["n_ctx"]
    with pytest.raises(ShapeError, match=rf"prompt is \d+ tokens; the context holds {n_ctx}"):
        session.generate("hello " * (n_ctx + 10), max_tokens=4)


def test_chat_without_a_template_says_so(session):
    with pytest.raises(InputError, match="no chat template"):
        session.chat([{"role": "user", "content": "hi"}])


@pytest.mark.slow
def test_cli_run_prompt(gemma_bundle, run_cli):
    proc = run_cli("run", gemma_bundle, "--prompt", PROMPT, "--max-tokens", "4", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["text"].strip() and doc["report"]["backend"] == "llama.cpp"
    assert doc["report"]["backend_report"]["last_request"]["output_tokens"] <= 4
