# SPDX-License-Identifier: Apache-2.0
"""Speculative decoding by prompt lookup inside the engine (issue 37): the draft rule, greedy identity on text the
model copies, the live switch-off of "auto", the request and CLI interface, on the real Gemma-3-270M GGUF."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from cli_fixtures import THREADS  # noqa: E402
from test_serve import gemma_chat_bundle  # noqa: E402,F401  (a fixture)

from edgesdk.errors import InputError  # noqa: E402
from edgesdk.runtime.batching import lookup_draft  # noqa: E402
from edgesdk.runtime.requests import GenerationRequest  # noqa: E402

# JSON the model is asked to repeat: its continuation is in the prompt, token for token
JSON_PROMPT = (
    '{"name": "Ada Lovelace", "city": "London", "year": 1843, "field": "mathematics"}\n'
    'The same JSON with the same keys and values:\n{"name": "Ada Lovelace",'
)


def test_lookup_draft_takes_the_latest_earlier_occurrence():
    h = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup_draft(h, 3) == [7, 8, 5]  # after the latest earlier "1 2 3", not the first
    assert lookup_draft(h, 1) == [7]
    assert lookup_draft([4, 5, 6, 7], 4) == []  # no earlier occurrence of any suffix of 2 or 3 tokens
    assert lookup_draft([5, 6, 1, 5, 6], 8) == [1, 5, 6]  # the continuation may run into the suffix itself
    assert lookup_draft([3, 3], 2) == []  # too short for a two-token match with a next token


def test_requests_name_their_mode_and_draft_needs_a_draft_model(one_slot):
    assert GenerationRequest(prompt="x", speculative="lookup").speculative == "lookup"
    with pytest.raises(InputError, match="needs a draft model in the bundle"):
        one_slot.submit(GenerationRequest(prompt="x", speculative="draft"))  # an engine without a draft model
    with pytest.raises(InputError, match="speculative must be one of auto, lookup, draft, off"):
        GenerationRequest(prompt="x", speculative="fast")


@pytest.fixture(scope="module")
def one_slot(gemma_gguf):
    from edgesdk.runtime.batching import BatchEngine

    with BatchEngine(
        gemma_gguf, slots=1, n_ctx=512, threads=THREADS, kv_unified=False, mixed_prefill=False, prompts_per_step=1
    ) as eng:
        yield eng


def test_lookup_drafts_accepts_and_keeps_the_greedy_text_of_a_copy(one_slot):
    off = one_slot.generate(prompt=JSON_PROMPT, max_tokens=32, temperature=0, speculative="off")
    on = one_slot.generate(prompt=JSON_PROMPT, max_tokens=32, temperature=0, speculative="lookup")
    assert off.drafted_tokens == 0 and off.speculative == "off"
    assert on.drafted_tokens > 0 and on.accepted_tokens >= 8, (on.drafted_tokens, on.accepted_tokens)
    assert on.accepted_tokens <= on.drafted_tokens
    assert (
        on.tokens == off.tokens
    )  # the copied tokens are far from any tie: the verify step's rounding cannot flip them
    again = one_slot.generate(prompt=JSON_PROMPT, max_tokens=32, temperature=0, speculative="off")
    assert again.tokens == off.tokens  # the rejected drafts' KV cells were dropped: nothing of them is left


def test_lookup_with_sampling_and_a_grammar_stays_within_the_grammar(one_slot):
    grammar = 'root ::= "{" ws "\\"name\\": \\"Ada Lovelace\\"" ws "}"\nws ::= [ \\t\\n]*'
    res = one_slot.generate(
        prompt=JSON_PROMPT, max_tokens=24, temperature=0.7, seed=3, grammar=grammar, speculative="lookup"
    )
    assert json.loads(res.text) == {"name": "Ada Lovelace"}


def test_auto_switches_off_a_request_whose_drafts_are_rarely_accepted(one_slot):
    from edgesdk.runtime.batching import SPEC_MIN_RATE, SPEC_PROBE_STEPS, _Seq

    seq = _Seq(handle=None, prompt=[1], budget=8, stops=(), spec="auto")  # type: ignore[arg-type]
    seq.draft_steps, seq.drafted, seq.accepted = SPEC_PROBE_STEPS - 1, 24, 1
    one_slot._verified(seq)
    assert seq.spec == "off" and f"{SPEC_MIN_RATE:.0%}" in seq.spec_note
    keep = _Seq(handle=None, prompt=[1], budget=8, stops=(), spec="auto")  # type: ignore[arg-type]
    keep.draft_steps, keep.drafted, keep.accepted = SPEC_PROBE_STEPS - 1, 24, 12
    one_slot._verified(keep)
    assert keep.spec == "auto"


def test_auto_does_not_draft_while_more_requests_generate_than_its_limit(gemma_gguf):
    from edgesdk.runtime.batching import BatchEngine

    with BatchEngine(gemma_gguf, slots=4, n_ctx=512, threads=THREADS, speculative="auto", spec_max_active=0) as eng:
        res = eng.generate(prompt=JSON_PROMPT, max_tokens=16, temperature=0)
    assert res.drafted_tokens == 0 and res.speculative == "auto"


def test_run_reports_drafted_and_accepted_tokens(gemma_chat_bundle):  # noqa: F811 - the fixture
    res = subprocess.run(
        [sys.executable, "-m", "edgesdk", "run", str(gemma_chat_bundle), "--prompt", JSON_PROMPT, "-n", "24",
         "--temperature", "0", "--speculative", "lookup", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    usage = json.loads(res.stdout)["usage"]
    assert usage["speculative"] == "lookup" and usage["accepted_tokens"] > 0
    assert usage["accepted_tokens"] <= usage["drafted_tokens"]
    bad = subprocess.run(
        [sys.executable, "-m", "edgesdk", "run", str(gemma_chat_bundle), "--prompt", "hi", "--speculative", "draft"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "needs a draft model" in bad.stderr, bad.stderr


def test_serve_counts_drafted_and_accepted_tokens_on_metrics(gemma_chat_bundle, tmp_path):  # noqa: F811 - the fixture
    """``edgesdk serve --speculative lookup``: a completion that copies its prompt drafts, and /metrics counts what
    was drafted and kept (edgesdk_serve_speculative_tokens_total)."""
    import httpx
    from test_serve import ServerProcess

    openai = pytest.importorskip("openai")
    srv = ServerProcess([gemma_chat_bundle, "--name", "gemma", "--speculative", "lookup", "--parallel", "1"], tmp_path)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
        out = client.completions.create(model="gemma", prompt=JSON_PROMPT, max_tokens=24, temperature=0)
        assert out.choices[0].text
        text = httpx.get(srv.url + "/metrics", timeout=30).text
    finally:
        srv.stop()
    counts = {
        kind: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("edgesdk_serve_speculative_tokens_total{")
        for kind in ("drafted", "accepted")
        if f'kind="{kind}"' in line
    }
    assert counts.get("drafted", 0) > 0 and 0 < counts.get("accepted", 0) <= counts["drafted"], counts
