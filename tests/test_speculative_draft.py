# SPDX-License-Identifier: Apache-2.0
"""Speculative decoding with a draft model in the bundle (issue 37 item 2), for real: a random-weight llama target
(F16 GGUF from a transformers config, edgesdk's converter) and a draft cut to its first layer
(tools/bench/draft_pair.py), built with ``edgesdk build --draft`` (vocabulary and license checked, SBOM, manifest),
then run through the engine with ``speculative="draft"``: greedy output equal to no speculation, drafted and accepted
tokens reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "bench"))

from cli_fixtures import THREADS  # noqa: E402
from draft_pair import first_layers, make_llama  # noqa: E402

PROMPTS = [
    "The harbour town wakes before dawn. Fishing boats slip out past the lighthouse",
    "Marie Curie was born in Warsaw in 1867. She studied physics in Paris",
    '{"name": "Ada Lovelace", "born": 1815, "city": "London"} The same JSON: {"name":',
    "def area(width, height):\n    return width * height\n",
    "To reset the router, hold the small button on the back for ten seconds",
    "Edge devices run small language models",
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgesdk", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """target-f16.gguf (4 layers, hidden 256; layers past the first refine: deep_scale) and drafts: its first layer
    (F16) and a model of another tokenizer, one under a non-commercial license, one under a review-level license."""
    from edgesdk.formats.gguf.convert import convert_hf_to_gguf

    root = tmp_path_factory.mktemp("draft")
    hf = make_llama(root / "hf", layers=4, hidden=256, heads=4, kv_heads=2, vocab=400, deep_scale=0.03)
    out = {"target": root / "target-f16.gguf", "first1": root / "first1-f16.gguf"}
    convert_hf_to_gguf(hf, out["target"], name="random-llama")
    convert_hf_to_gguf(first_layers(hf, root / "hf-first1", 1), out["first1"], name="random-llama-first1")
    other = make_llama(root / "hf-other", layers=1, hidden=256, heads=4, kv_heads=2, vocab=300)
    out["other_vocab"] = root / "other-vocab.gguf"
    convert_hf_to_gguf(other, out["other_vocab"], name="other")
    # the same vocabulary, other random weights: a draft whose tokens the target (almost) never accepts
    stranger = make_llama(root / "hf-stranger", layers=1, hidden=256, heads=4, kv_heads=2, vocab=400, seed=7)
    out["stranger"] = root / "stranger-f16.gguf"
    convert_hf_to_gguf(stranger, out["stranger"], name="stranger")
    for name, lic in (("nc", "cc-by-nc-4.0"), ("llama", "llama3.2")):
        d = first_layers(hf, root / f"hf-{name}", 1)
        (d / "README.md").write_text(f"---\nlicense: {lic}\n---\nA draft under {lic}.\n")
        out[name] = root / f"draft-{name}.gguf"
        convert_hf_to_gguf(d, out[name], name=f"draft-{name}")
    return out


@pytest.fixture(scope="module")
def draft_bundle(pair, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "with-draft"
    res = _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "--draft",
               str(pair["first1"]), "-o", str(out), "--no-progress")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out


def test_build_packs_the_draft_hashed_planned_licensed_and_in_the_sboms(draft_bundle, pair):
    m = json.loads((draft_bundle / "manifest.json").read_text())
    arts = {a["path"]: a for a in m["artifacts"]}
    assert arts["draft.gguf"]["role"] == "draft" and len(arts["draft.gguf"]["sha256"]) == 64
    import hashlib

    assert hashlib.sha256((draft_bundle / "draft.gguf").read_bytes()).hexdigest() == arts["draft.gguf"]["sha256"]
    draft = m["extras"]["llm"]["draft"] if "extras" in m else m["llm"]["draft"]
    assert draft["quant_type"] == "F16" and draft["action"].startswith("kept as given")
    assert draft["n_vocab"] == 400 and draft["layers"] == 1 and draft["method"] in ("draft", "lookup")
    assert 1 <= draft["k"] <= 8 and 0 < draft["agreement"]["agreement"] <= 1
    decisions = {d["key"]: d for d in m["plan"]["decisions"]}
    assert decisions["gguf.draft"]["value"]["k"] == draft["k"] and "predicts" in decisions["gguf.draft"]["reason"]
    cdx = json.loads((draft_bundle / "sbom.cdx.json").read_text())
    assert "draft.gguf" in json.dumps(cdx)
    spdx = json.loads((draft_bundle / "sbom.spdx.json").read_text())
    assert "draft.gguf" in json.dumps(spdx)
    report = json.loads((draft_bundle / "license-report.json").read_text())
    assert any("draft.gguf" in f.get("files", []) for f in report["findings"] if f.get("layer") == "model")


def test_build_refuses_a_draft_of_another_vocabulary_in_one_line(pair, tmp_path):
    out = tmp_path / "refused"
    res = _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "--draft",
               str(pair["other_vocab"]), "-o", str(out), "--no-progress")  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert res.stderr.count("\n") == 1 and "not the model's vocabulary" in res.stderr and "tokens" in res.stderr
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_the_license_gate_judges_the_draft_like_the_model(pair, tmp_path):
    out = tmp_path / "nc"
    res = _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "--draft",
               str(pair["nc"]), "-o", str(out), "--no-progress")  # fmt: skip
    assert res.returncode == 2 and "CC-BY-NC-4.0" in res.stderr and not out.exists(), res.stderr
    out = tmp_path / "llama"
    res = _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "--draft",
               str(pair["llama"]), "-o", str(out), "--no-progress")  # fmt: skip
    assert res.returncode == 2 and "review" in res.stderr and not out.exists(), res.stderr
    res = _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "--draft",
               str(pair["llama"]), "--accept-license", "LicenseRef-llama3.2", "-o", str(out),
               "--no-progress")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "LicenseRef-llama3.2" in (out / "sbom.cdx.json").read_text()


def test_draft_requests_are_greedy_identical_to_no_speculation(draft_bundle):
    import edgesdk

    session = edgesdk.load(draft_bundle)
    backend = session.backend
    try:
        mode, _active, why = backend.speculative_plan()
        assert mode == "off" and "draft" in why  # the CPU default, and what the bundle's draft is for
        drafted = accepted = 0
        for prompt in PROMPTS:
            off = backend.engine.generate(prompt=prompt, max_tokens=32, temperature=0, speculative="off")
            on = backend.engine.generate(prompt=prompt, max_tokens=32, temperature=0, speculative="draft")
            assert on.tokens == off.tokens, prompt
            assert on.speculative.startswith("draft") and on.accepted_tokens <= on.drafted_tokens
            drafted, accepted = drafted + on.drafted_tokens, accepted + on.accepted_tokens
        assert drafted > 0 and accepted > 0, (drafted, accepted)
        sampled = backend.engine.generate(prompt=PROMPTS[0], max_tokens=24, temperature=0.8, seed=5, speculative="off")
        again = backend.engine.generate(prompt=PROMPTS[0], max_tokens=24, temperature=0.8, seed=5, speculative="draft")
        assert again.tokens == sampled.tokens  # sample-and-compare: the same target samples, the same seed
    finally:
        session.close()


def test_run_reports_draft_tokens_and_refuses_draft_without_one(draft_bundle, pair, tmp_path):
    trace = tmp_path / "t.jsonl"
    res = _cli("run", str(draft_bundle), "--prompt", PROMPTS[0], "-n", "24", "--temperature", "0",
               "--speculative", "draft", "--json", "--trace-file", str(trace))  # fmt: skip
    assert res.returncode == 0, res.stderr
    usage = json.loads(res.stdout)["usage"]
    assert usage["speculative"] == "draft" and 0 < usage["accepted_tokens"] <= usage["drafted_tokens"]
    plan_k = json.loads((draft_bundle / "manifest.json").read_text())["extras"]["llm"]["draft"]["k"]
    assert usage["draft_k_start"] == plan_k and 1 <= usage["draft_k"] <= 8, usage  # adaptive k: start and end
    attrs = {a["key"]: a["value"] for a in _span_attributes(trace) if a["key"].startswith("edgesdk.speculative")}
    assert attrs["edgesdk.speculative.k_start"] == {"intValue": str(plan_k)}, attrs
    assert attrs["edgesdk.speculative.k"] == {"intValue": str(usage["draft_k"])}, attrs
    plain = tmp_path / "plain"
    assert _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "-o", str(plain),
                "--no-progress").returncode == 0  # fmt: skip
    bad = _cli("run", str(plain), "--prompt", "hi", "--speculative", "draft")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "--draft" in bad.stderr, bad.stderr


def test_serve_speculative_draft_over_http_is_greedy_identical_and_counts_tokens(draft_bundle, tmp_path):
    """``edgesdk serve BUNDLE --speculative draft`` with the real OpenAI client: greedy completions equal to a server
    with ``--speculative off``; the drafted and accepted tokens on /metrics and in each response's usage
    (``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``)."""
    import httpx
    from test_serve import ServerProcess

    openai = pytest.importorskip("openai")
    replies: dict[str, list] = {}
    metrics = ""
    for mode in ("off", "draft"):
        srv = ServerProcess([draft_bundle, "--name", "m", "--speculative", mode, "--parallel", "1"], tmp_path)
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")
            replies[mode] = [
                client.completions.create(model="m", prompt=p, max_tokens=24, temperature=0) for p in PROMPTS[:4]
            ]
            if mode == "draft":
                metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        finally:
            assert srv.stop() == 0, srv.log.read_text()[-3000:]
    for off, on in zip(replies["off"], replies["draft"], strict=True):
        assert on.choices[0].text == off.choices[0].text and on.usage.completion_tokens == off.usage.completion_tokens
        assert off.usage.completion_tokens_details is None  # nothing drafted: no prediction fields
    details = [r.usage.completion_tokens_details for r in replies["draft"]]
    accepted = sum(d.accepted_prediction_tokens for d in details if d is not None)
    rejected = sum(d.rejected_prediction_tokens for d in details if d is not None)
    assert accepted > 0 and rejected >= 0, details
    counts = {
        kind: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("edgesdk_serve_speculative_tokens_total{")
        for kind in ("drafted", "accepted")
        if f'kind="{kind}"' in line
    }
    assert counts == {"drafted": accepted + rejected, "accepted": accepted}, (counts, accepted, rejected)


def test_profiler_run_reports_decode_with_and_without_the_draft_model(draft_bundle, pair, tmp_path):
    """``edgesdk profiler run`` on a bundle with a draft model: the ``speculative`` section (issue 37 item 5) holds
    decode with and without it, on the same prompt, with what was drafted and accepted; the text report shows it;
    ``--speculative draft`` on a bundle without a draft model is refused in one line."""
    res = _cli("profiler", "run", str(draft_bundle), "--prompt-tokens", "16", "--gen-tokens", "16", "--repeats", "2",
               "--device-metrics-interval", "0", "--no-energy", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    spec = report["speculative"]
    manifest = json.loads((draft_bundle / "manifest.json").read_text())
    assert spec["method"] == "draft" and spec["k"] == manifest["extras"]["llm"]["draft"]["k"]  # auto: the draft
    assert spec["repeats"] == 2 and len(spec["off"]["per_repeat"]) == len(spec["on"]["per_repeat"]) == 2
    on, off = spec["on"], spec["off"]
    assert on["speculative"] == ["draft"] and 0 < on["accepted_tokens"] <= on["drafted_tokens"]
    assert on["acceptance"] == round(on["accepted_tokens"] / on["drafted_tokens"], 4)
    assert len(on["draft_k"]) == 2 and all(1 <= k <= 8 for k in on["draft_k"])  # adaptive k: each one's end
    assert off["decode_tok_s"] > 0 and on["decode_tok_s"] > 0
    assert spec["ratio"] == round(on["decode_tok_s"] / off["decode_tok_s"], 3)
    assert spec["same_text"] == 2  # greedy: the draft model changes the speed, not the text (as the engine test shows)
    table = _cli("profiler", "run", str(draft_bundle), "--prompt-tokens", "16", "--gen-tokens", "8", "--repeats", "1",
                 "--speculative", "lookup", "--device-metrics-interval", "0", "--no-energy")  # fmt: skip
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("speculative (lookup, k 8)"))
    assert "tok/s" in row and "drafted tokens accepted" in row, row
    plain = tmp_path / "plain"
    assert _cli("build", str(pair["target"]), "--profile", "cpu-x86_64", "--quant-type", "F16", "-o", str(plain),
                "--no-progress").returncode == 0  # fmt: skip
    bad = _cli("profiler", "run", str(plain), "--speculative", "draft", "--repeats", "1", "--gen-tokens", "4")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "--draft" in bad.stderr, bad.stderr
    none = _cli("profiler", "run", str(plain), "--speculative", "off", "--prompt-tokens", "8", "--gen-tokens", "4",
                "--repeats", "1", "--device-metrics-interval", "0", "--no-energy", "--json")  # fmt: skip
    assert none.returncode == 0 and "speculative" not in json.loads(none.stdout), none.stderr


def _span_attributes(trace: Path) -> list[dict]:
    """Every span attribute in an OTLP-JSON lines file (``--trace-file``)."""
    return [
        attr
        for line in trace.read_text().splitlines()
        if line.strip()
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
        for attr in span.get("attributes", [])
    ]


def test_adaptive_k_follows_the_measured_acceptance(pair):
    """Adaptive k (issue 37): with a draft of other weights (same vocabulary) the target rejects its tokens and every
    request's k falls from the plan's 4 to 1; with the target's own first layer, whose drafts are mostly kept, some
    request's k rises above 4; with adaptive k off, k stays at 4. Greedy output is the target's in every case."""
    from edgesdk.runtime.batching import BatchEngine, Weights

    def run(draft: Path, adaptive: bool) -> list:
        weights = Weights(str(draft))
        try:
            with BatchEngine(str(pair["target"]), slots=1, n_ctx=512, threads=THREADS, draft_model=weights.model,
                             draft_k=4, adaptive_k=adaptive) as eng:  # fmt: skip
                out = []
                for prompt in PROMPTS:
                    off = eng.generate(prompt=prompt, max_tokens=32, temperature=0, speculative="off")
                    on = eng.generate(prompt=prompt, max_tokens=32, temperature=0, speculative="draft")
                    assert on.tokens == off.tokens, prompt
                    out.append(on)
                return out
        finally:
            weights.close()

    low = run(pair["stranger"], True)
    assert sum(r.accepted_tokens for r in low) <= 0.1 * sum(r.drafted_tokens for r in low), low
    assert {(r.draft_k_start, r.draft_k) for r in low} == {(4, 1)}, [(r.draft_k_start, r.draft_k) for r in low]
    # k 1 after the first rejections: far fewer drafted tokens than 4 a step would have drafted
    fixed = run(pair["stranger"], False)
    assert {(r.draft_k_start, r.draft_k) for r in fixed} == {(4, 4)}
    assert sum(r.drafted_tokens for r in low) < 0.5 * sum(r.drafted_tokens for r in fixed)
    high = run(pair["first1"], True)
    assert all(r.draft_k_start == 4 and 1 <= r.draft_k <= 8 for r in high)
    assert max(r.draft_k for r in high) > 4, [(r.drafted_tokens, r.accepted_tokens, r.draft_k) for r in high]
