# SPDX-License-Identifier: Apache-2.0
"""LLM measurement helpers: a prompt of a given token count, one streamed generation, the rates.

TTFT and TPOT come from token instants the backend reports (text chunks are not tokens: a partial
UTF-8 byte, or a token with no text, yields nothing, so chunk times can lag far behind — on a
random-weight model the first text chunk came ~90 ms after the first token on the H200); the
chunk times are the fallback. Prefill and the model's own decode rate come from the backend's
timers where it has them (llama.cpp's prompt-eval and eval counters).
"""

from __future__ import annotations

import statistics
import time

from edgesdk.profiler.stats import latency_stats
from edgesdk.resources import read_data_text
from edgesdk.runtime.backend import LLMBackend

OPENERS = (
    "Yesterday",
    "Meanwhile",
    "Honestly",
    "Suddenly",
    "Later",
    "Eventually",
    "Often",
    "Perhaps",
    "Today",
    "Tomorrow",
    "Somewhere",
    "Afterwards",
)


def prompt_of(session, target: int) -> tuple[str, int]:
    """A natural-text prompt of about ``target`` tokens (binary search on words, real tokenizer)."""
    text = read_data_text("sample_sentences.txt")
    words = [w for line in text.splitlines() if not line.startswith("#") for w in line.split()]
    while len(words) < target * 2:
        words = words + words
    lo, hi = 1, target * 2
    target = max(1, target - 1)  # room for the opener word added per generation
    best = (" ".join(words[:1]), len(session.tokenize(" ".join(words[:1]))))
    while lo <= hi:
        mid = (lo + hi) // 2
        prompt = " ".join(words[:mid])
        n = len(session.tokenize(prompt))
        if n <= target:
            best = (prompt, n)
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def llm_stream_once(session, prompt: str, gen_tokens: int) -> dict:
    """One streamed generation: chunk arrival times (ms from the request), and token times when the
    backend reports them (its loop's first/last token instants, on the same perf_counter clock)."""
    t0 = time.perf_counter()
    times: list[float] = []
    for _chunk in session.stream(prompt, max_tokens=gen_tokens, temperature=0.0):
        times.append((time.perf_counter() - t0) * 1e3)
    stats = session.backend.last_stats if isinstance(session.backend, LLMBackend) else None
    first_at = stats.first_token_at if stats is not None else None
    last_at = stats.last_token_at if stats is not None else None
    # Text chunks are not tokens (a partial UTF-8 byte, or a token with no text, yields nothing): take
    # the backend's token count, and its token instants when it has them.
    return {
        "chunk_times_ms": times,
        "output_tokens": stats.output_tokens if stats is not None else None,
        "first_token_ms": (first_at - t0) * 1e3 if first_at else None,
        "last_token_ms": (last_at - t0) * 1e3 if first_at and last_at else None,
        "finish_reason": stats.finish_reason if stats is not None else None,
        "backend_timings": dict(stats.llama_cpp_timings) if stats is not None else {},
    }


def llm_metrics(prompt_tokens: int, runs: list[dict]) -> dict:
    gen = [r.get("output_tokens") or len(r["chunk_times_ms"]) for r in runs]
    if runs and all(r.get("first_token_ms") is not None for r in runs):
        # Token instants from the backend: a token that yields no text (a split UTF-8 character; most
        # tokens of a random-weight model) delays the next text chunk, not the token.
        timing_source = "tokens (backend loop)"
        ttft = [r["first_token_ms"] for r in runs]
        tpot = [
            (r["last_token_ms"] - r["first_token_ms"]) / (n - 1)
            for r, n in zip(runs, gen)
            if n > 1 and r.get("last_token_ms") is not None
        ]
    else:
        timing_source = "text chunks"
        ttft = [r["chunk_times_ms"][0] for r in runs if r["chunk_times_ms"]]
        tpot = [
            (r["chunk_times_ms"][-1] - r["chunk_times_ms"][0]) / (n - 1)
            for r, n in zip(runs, gen)
            if len(r["chunk_times_ms"]) > 1 and n > 1
        ]
    prefill_ttft = prompt_tokens / (statistics.median(ttft) / 1e3) if ttft else None
    # The backend's own timers (llama.cpp's prompt-eval and eval counters, as llama-bench reports
    # them), when every run has them: the rate of the model itself, without the stream's Python,
    # sampling and detokenising, which on a fast GPU can be most of a short prompt's TTFT.
    timings = [r.get("backend_timings") or {} for r in runs]
    prompt_rates = [t["prompt_eval_tokens"] / t["prompt_eval_ms"] * 1e3 for t in timings if t.get("prompt_eval_ms")]
    eval_rates = [t["eval_tokens"] / t["eval_ms"] * 1e3 for t in timings if t.get("eval_ms")]
    backend_prefill = statistics.median(prompt_rates) if runs and len(prompt_rates) == len(runs) else None
    out = {
        "prompt_tokens": prompt_tokens,
        "generated_tokens": gen,
        "repeats": len(runs),
        "ttft_ms": latency_stats(ttft),
        "tpot_ms": latency_stats(tpot),
        "timing_source": timing_source,
        "prefill_tok_s": backend_prefill or prefill_ttft,
        "prefill_source": "backend prompt-eval timer" if backend_prefill else "TTFT",
        "prefill_tok_s_from_ttft": prefill_ttft,
        # llama-cpp-python keeps the KV of a prefix shared with the last request (here the BOS
        # token), so the timer may count a token or so fewer than prompt_tokens: say how many.
        "prefill_eval_tokens": [t["prompt_eval_tokens"] for t in timings] if backend_prefill else None,
        "decode_tok_s": 1e3 / statistics.median(tpot) if tpot else None,
        "decode_tok_s_backend": statistics.median(eval_rates) if runs and len(eval_rates) == len(runs) else None,
        "finish_reasons": [r.get("finish_reason") for r in runs],
        "token_times_ms": runs[-1]["chunk_times_ms"] if runs else [],
        "per_repeat": [_repeat_phases(r, n) for r, n in zip(runs, gen)],
        "method": "session.stream: TTFT = first generated token (the backend loop's instant; first text "
        "chunk when the backend has none: timing_source); TPOT = (last - first token) / (tokens - 1), "
        "tokens as the backend counted them; decode tok/s = 1 / median TPOT (the stream's rate). "
        "prefill tok/s = median over runs of the backend's prompt-eval timer (llama.cpp: tokens "
        "evaluated / prompt-eval time, as llama-bench reports) when every run has it, else prompt "
        "tokens / median TTFT (which also holds the first sampled token and the stream's setup); "
        "both kept: prefill_tok_s_from_ttft, decode_tok_s_backend",
    }
    return out


def _repeat_phases(run: dict, tokens: int) -> dict:
    """One generation's phases (ms from the request): TTFT, the backend's prompt-eval time inside it,
    the decode span (first to last token) and its text-chunk instants (what ``--plot`` draws)."""
    chunks = run["chunk_times_ms"]
    first = run.get("first_token_ms") if run.get("first_token_ms") is not None else (chunks[0] if chunks else None)
    last = run.get("last_token_ms") if run.get("first_token_ms") is not None else (chunks[-1] if chunks else None)
    timings = run.get("backend_timings") or {}
    decode = last - first if first is not None and last is not None else None
    return {
        "ttft_ms": first,
        "prompt_eval_ms": timings.get("prompt_eval_ms"),
        "decode_ms": decode,
        "tokens": tokens,
        "tpot_ms": decode / (tokens - 1) if decode is not None and tokens > 1 else None,
        "chunk_times_ms": chunks,
    }


#: the cue of the comparison's prompt: the model is asked to write the prompt's text again (input-grounded text,
#: what prompt lookup drafts well; a draft model drafts any text)
COPY_CUE = "\n\nThe same text again, word for word:\n"


def copy_prompt(text: str, lead_words: int = 6) -> str:
    """The speculative comparison's prompt: ``text``, the copy cue and the text's first ``lead_words`` words."""
    return f"{text}{COPY_CUE}{' '.join(text.split()[:lead_words])}"


def speculative_compare(session, prompt: str, gen_tokens: int, repeats: int, method: str, k: int | None) -> dict:
    """Decode with and without speculative decoding (``method``: ``lookup`` or ``draft``) on the same prompt, greedy:
    one warm-up generation per arm, then ``repeats`` rounds of one generation per arm (interleaved, so a change of
    the machine's load falls on both). Each generation's decode rate is the backend's (tokens after the first /
    time from the first token to the last); the arms' medians and their ratio, what was drafted and accepted, and
    how many rounds gave the same tokens."""
    arms: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(repeats + 1):  # round 0 warms both arms: not reported
        for arm, mode in (("off", "off"), ("on", method)):
            text = str(session.generate(prompt, max_tokens=gen_tokens, temperature=0.0, speculative=mode))
            st = session.backend.last_stats
            if i and st is not None:
                arms[arm].append(
                    {
                        "text": text,
                        "tokens": st.output_tokens,
                        "decode_tok_s": st.decode_tok_s,
                        "speculative": st.speculative,
                        "drafted_tokens": st.drafted_tokens,
                        "accepted_tokens": st.accepted_tokens,
                        "draft_k": st.draft_k,
                    }
                )

    def median_rate(runs: list[dict]) -> float | None:
        rates = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
        return round(statistics.median(rates), 2) if rates else None

    off, on = median_rate(arms["off"]), median_rate(arms["on"])
    drafted = sum(r["drafted_tokens"] for r in arms["on"])
    accepted = sum(r["accepted_tokens"] for r in arms["on"])
    return {
        "method": method,
        "k": k,
        "prompt": "copy: the measured prompt's text, then a cue to write it again and its first words",
        "prompt_tokens": len(session.tokenize(prompt)),
        "repeats": len(arms["on"]),
        "off": {
            "decode_tok_s": off,
            "per_repeat": [r["decode_tok_s"] for r in arms["off"]],
            "tokens": [r["tokens"] for r in arms["off"]],
        },
        "on": {
            "decode_tok_s": on,
            "per_repeat": [r["decode_tok_s"] for r in arms["on"]],
            "tokens": [r["tokens"] for r in arms["on"]],
            "speculative": sorted({r["speculative"] for r in arms["on"]}),
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "draft_k": [r["draft_k"] for r in arms["on"]],  # adaptive k: each generation's k at its end
        },
        "ratio": round(on / off, 3) if on and off else None,
        "same_text": sum(a["text"] == b["text"] for a, b in zip(arms["off"], arms["on"], strict=True)),
        "method_note": "session.generate at temperature 0, speculative='off' and the method, interleaved rounds after "
        "one warm-up round; decode tok/s = the backend's (tokens - 1) / (last token - first token), median over "
        "rounds; ratio = on / off; same_text: rounds whose two texts are equal (a verify step's logits differ in the "
        "last bits from one token's, so a near tie can flip)",
    }
