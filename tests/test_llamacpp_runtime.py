# SPDX-License-Identifier: Apache-2.0
"""The llama.cpp runtime on the real Gemma-3-270M Q4_K_M GGUF: generation, streaming, stop sequences,
GenAI telemetry with exact token counts, context overflow, and the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")

from cli_fixtures import THREADS  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from edgesdk import telemetry  # noqa: E402
from edgesdk.errors import InputError, ShapeError  # noqa: E402
from edgesdk.telemetry import _names as N  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gemma_bundle(gemma_cpu_bundle):
    """tests/conftest.py's Gemma cpu-x86_64 bundle, built once per session (read-only: copy it before changing it)."""
    return gemma_cpu_bundle


@pytest.fixture(scope="module")
def session(gemma_bundle):
    import edgesdk

    with edgesdk.load(gemma_bundle, threads=THREADS) as s:
        yield s


def test_repackaged_bundle_manifest(gemma_bundle):
    m = json.loads((gemma_bundle / "manifest.json").read_text())
    assert m["precision"] == "Q4_K_M" and m["parity"]["reference"].startswith("none: output is the source")
    assert m["extras"]["llm"]["n_gpu_layers"] == 0 and m["extras"]["llm"]["chat_template"] is False
    assert (
        m["plan"]["decisions"][[d["key"] for d in m["plan"]["decisions"]].index("gguf.source")]["value"]
        == "repackage: source is already Q4_K_M"
    )


@pytest.mark.slow
def test_greedy_generate_and_stream_agree(session):
    text = session.generate(PROMPT, max_tokens=8, temperature=0)
    assert isinstance(text, str) and text.strip()
    assert session.backend.last["output_tokens"] >= 1
    pieces = list(session.stream(PROMPT, max_tokens=8, temperature=0))
    assert len(pieces) > 1 and "".join(pieces) == text  # streamed piece by piece, same greedy text


@pytest.mark.slow
def test_the_last_request_is_typed_and_last_is_its_view(session):
    from edgesdk.runtime.backend import BatchingBackend, LLMBackend, RequestStats, VisionBackend

    backend = session.backend
    assert isinstance(backend, LLMBackend) and isinstance(backend, BatchingBackend)
    assert not isinstance(backend, VisionBackend)
    out = session.generate(PROMPT, max_tokens=4, temperature=0)
    stats = session.last_stats
    assert isinstance(stats, RequestStats) and out.stats is stats and stats.output_tokens >= 1
    assert out.usage == stats.usage() and out.usage["completion_tokens"] == stats.output_tokens
    assert backend.last == stats.as_dict() == session.report()["backend_report"]["last_request"]
    assert backend.context_length == int(backend.settings["n_ctx"]) and backend.on_gpu is False
    # images are a VLM's: a GGUF session refuses them in one line, as it refused the unknown option before
    with pytest.raises(InputError, match=r"^unknown generation option\(s\): images \(generate\(\) takes images "):
        session.generate(PROMPT, images=["x.png"], max_tokens=2)


@pytest.mark.slow
def test_stop_sequence_cuts_the_text_and_reports_stop(session):
    text = session.generate(PROMPT, max_tokens=10, temperature=0)
    words = text.split()
    if len(words) < 2:
        pytest.skip(f"greedy continuation too short to pick a stop word: {text!r}")
    stop = " " + words[1]
    cut = session.generate(PROMPT, max_tokens=10, temperature=0, stop=[stop])
    assert cut == text[: text.index(stop)]
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


def test_chat_uses_the_template_bundled_from_the_architecture(session):
    """This GGUF carries no template: the build bundled the shipped gemma one (plan decision gguf.chat_template;
    a bundle without any is refused: tests/test_chat_templates.py)."""
    session.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
    rendered = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    want = session.backend.engine.tokenize(rendered, add_bos=True, special=True)
    assert session.backend.last["input_tokens"] == len(want)
    with pytest.raises(InputError, match="neither a shipped name"):
        session.chat([{"role": "user", "content": "hi"}], chat_template="no-such-template")


@pytest.mark.slow
def test_cli_run_prompt(gemma_bundle, run_cli):
    proc = run_cli("run", gemma_bundle, "--prompt", PROMPT, "--max-tokens", "4", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["text"].strip() and doc["report"]["backend"] == "llama.cpp"
    assert doc["report"]["backend_report"]["last_request"]["output_tokens"] <= 4


# ------------------------------------------------------------------ planned batch sizes and K/V cache types
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A random-weight 2-layer llama as an F16 GGUF (torch + the converter: a few seconds)."""
    pytest.importorskip("transformers")
    from edgesdk.formats.gguf.convert import convert_hf_to_gguf
    from tests.test_gguf_build import make_tiny_causal_lm

    root = tmp_path_factory.mktemp("tiny-gguf")
    out = root / "tiny-f16.gguf"
    convert_hf_to_gguf(make_tiny_causal_lm(root / "hf", "llama"), out, name="tiny")
    return out


def _llm_bundle(root, gguf, **llm):
    """A GGUF bundle whose manifest llm section is ``llm`` (plus the file's shape)."""
    import shutil

    from edgesdk import bundle as B
    from edgesdk.formats.gguf.facts import gguf_facts
    from edgesdk.manifest import LLMConfig, Manifest

    root.mkdir(parents=True)
    shutil.copyfile(gguf, root / "model.gguf")
    f = gguf_facts(root / "model.gguf")
    typed = {k: llm.pop(k) for k in ("n_ctx", "n_gpu_layers", "flash_attn") if k in llm}
    B.write_manifest(
        root,
        Manifest(
            format="gguf",
            precision="F16",
            bundle_id=root.name,
            artifacts=[B.artifact_entry(root, "model.gguf", "model")],
            llm=LLMConfig(
                **typed,
                threads=THREADS,
                quant_type="F16",
                details={
                    "layers": f["layers"],
                    "kv_heads": f["kv_heads"],
                    "head_dim": f["head_dim"],
                    "file_bytes": (root / "model.gguf").stat().st_size,
                    **llm,
                },
            ),
        ),
    )
    return root


def _context(session):
    """What the engine's llama.cpp context was created with."""
    st = session.backend.engine.settings
    return st["n_batch"], st["n_ubatch"], st["type_k"], st["type_v"]


@pytest.mark.slow
def test_runtime_passes_the_planned_batch_and_kv_types_and_load_options_override(tiny_gguf, tmp_path):

    import edgesdk

    root = _llm_bundle(
        tmp_path / "planned",
        tiny_gguf,
        n_ctx=1024,
        flash_attn=True,
        n_batch=256,
        n_ubatch=128,
        type_k="q8_0",
        type_v="q8_0",
    )
    with edgesdk.load(root) as s:
        assert _context(s) == (256, 128, "q8_0", "q8_0")
        rep = s.report()["backend_report"]
        assert (rep["n_batch"], rep["n_ubatch"], rep["type_k"], rep["type_v"]) == (256, 128, "q8_0", "q8_0")
        assert rep["batch_source"] == "plan (manifest)" and rep["flash_attn"] is True
        assert s.generate("The harbour", max_tokens=4, temperature=0)  # it decodes with them
    with edgesdk.load(root, n_batch=64, n_ubatch=32) as s:
        assert _context(s)[:2] == (64, 32)
        assert s.report()["backend_report"]["batch_source"] == "load options"
    with pytest.raises(InputError, match="load option n_batch must be a positive integer"):
        edgesdk.load(root, n_batch=0)


@pytest.mark.slow
def test_old_bundle_without_the_keys_loads_with_llamacpp_python_defaults(tiny_gguf, tmp_path):

    import edgesdk

    root = _llm_bundle(tmp_path / "old", tiny_gguf, n_ctx=1024)
    info = json.loads((root / "manifest.json").read_text())["extras"]["llm"]
    assert not {"n_batch", "n_ubatch", "type_k", "type_v"} & set(info)
    with edgesdk.load(root) as s:
        assert _context(s) == (512, 512, "f16", "f16")
        rep = s.report()["backend_report"]
        assert (rep["n_batch"], rep["n_ubatch"], rep["type_k"], rep["type_v"]) == (512, 512, "f16", "f16")
        assert rep["batch_source"].startswith("llama-cpp-python defaults")


@pytest.mark.slow
def test_cpu_load_of_a_gpu_plan_steps_down_to_512_and_f16_without_flash_attention(tiny_gguf, tmp_path):

    import edgesdk

    root = _llm_bundle(
        tmp_path / "gpu-plan",
        tiny_gguf,
        n_ctx=2048,
        n_gpu_layers=0,
        flash_attn=False,
        n_batch=2048,
        n_ubatch=2048,
        type_k="q8_0",
        type_v="q8_0",
    )
    with edgesdk.load(root) as s:
        assert _context(s) == (512, 512, "f16", "f16")
        notes = " | ".join(s.report()["backend_report"]["notes"])
        assert "instead of the planned 2048/2048" in notes and "needs flash attention" in notes
    with edgesdk.load(root, n_ubatch=1024, n_batch=1024) as s:  # an explicit option is kept on the CPU
        assert _context(s)[:2] == (1024, 1024)
