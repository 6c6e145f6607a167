# SPDX-License-Identifier: Apache-2.0
"""GGUF build stages: convert (HF -> F16 GGUF with gguf-py), quantize with llama.cpp's quantizer, and
verify: HF logits vs the F16 GGUF, and the quantized file's perplexity on ``edgesdk/data/ppl_text.txt``
relative to its reference. The plan it executes comes from :mod:`edgesdk.formats.gguf.plan`.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import InputError, ParityError
from edgesdk.formats.gguf import convert as conv
from edgesdk.formats.gguf.facts import gguf_facts
from edgesdk.formats.gguf.plan import LOGITS_MIN_COSINE, LOGITS_MIN_TOP1, PPL_RATIO_MAX, gguf_section
from edgesdk.manifest import LLMConfig
from edgesdk.resources import data_file
from edgesdk.types import Decision

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.types import Plan

PPL_TEXT = data_file("ppl_text.txt")
SANITY_PROMPT = "The quick brown fox jumps over the lazy dog. Edge devices run small language models"
SANITY_MAX_TOKENS = 24


def sanity_check(path: Path, label: str | None = None) -> dict[str, Any]:
    """Load the built GGUF with llama.cpp and evaluate a fixed prompt: every logit must be finite and the
    logits must not be constant (weights of NaN, Inf or zeros fail here). Runs on every GGUF build,
    a repackaged one included; a prompt of <= 24 tokens costs well under a second for small models."""
    import numpy as np

    llm = conv._open_llama(path, n_ctx=64, logits_all=True)
    try:
        tokens = llm.tokenize(SANITY_PROMPT.encode("utf-8"), add_bos=True, special=False)[:SANITY_MAX_TOKENS]
        logits = conv._eval_logits(llm, tokens)
    finally:
        llm.close()
    with np.errstate(all="ignore"):
        bad = int(np.count_nonzero(~np.isfinite(logits)))
        spread = float(np.nanmax(logits) - np.nanmin(logits)) if bad < logits.size else 0.0
    result = {"prompt_tokens": len(tokens), "nonfinite_logits": bad, "logit_range": round(spread, 4)}
    if bad:
        raise ParityError(
            f"{label or path}: {bad} of {logits.size} logits on the sanity prompt are NaN/Inf (the weights are broken)",
            hint="rebuild the GGUF from a good source",
        )
    if spread == 0.0:
        raise ParityError(
            f"{label or path}: every logit on the sanity prompt is the same value (the weights are broken)",
            hint="rebuild the GGUF from a good source",
        )
    return result


def build_gguf(ctx: BuildContext) -> None:
    """Convert / quantize / verify into ``ctx.staging/model.gguf`` and fill the manifest.

    The plan's type is tried first; when its perplexity misses the limit and the plan lists
    ``gguf.parity_fallback`` types (``--on-parity-fail fallback``), each is quantized and verified in
    turn until one passes. Every attempt is recorded (a ``gguf.parity_attempt`` decision with its
    figures, the manifest's ``parity.attempts``, a fallback record); none passing is ParityError (exit 5)."""
    facts, plan = ctx.facts, ctx.plan
    section = gguf_section(plan.section)
    quant, n_ctx = section.quant_type, section.context_length
    thresholds: dict[str, Any] = dict(section.parity)
    candidates: list[tuple[str, float | None]] = [(quant, thresholds.get("ppl_ratio_max"))]
    candidates += [(c.quant_type, c.ppl_ratio_max) for c in section.parity_fallback]
    work = ctx.staging / "_work"
    work.mkdir(parents=True, exist_ok=True)
    final = ctx.staging / "model.gguf"
    convert_info: dict[str, Any] = {}
    attempts: list[dict[str, Any]] = []
    try:
        with ctx.stage("convert", {"edgesdk.gguf.quant_type": quant}):
            if facts.kind == "hf":
                ctx.progress("converting HF weights to F16 GGUF (gguf-py)")
                reference = work / "model-f16.gguf"
                convert_info = conv.convert_hf_to_gguf(Path(facts.source), reference, name=facts.name)
            else:
                reference = Path(facts.source)
        source_type = "F16" if facts.kind == "hf" else facts.extra.get("file_type")
        verifier = _Verifier(ctx, reference, n_ctx)
        for i, (q, limit) in enumerate(candidates):
            with ctx.stage("quantize", {"edgesdk.gguf.quant_type": q}):
                if q == source_type:
                    shutil.copyfile(reference, final)
                else:
                    ctx.progress(f"llama.cpp quantize {source_type} -> {q}")
                    conv.quantize(reference, final, q, allow_requantize=facts.kind == "gguf")
            with ctx.stage("verify", {"edgesdk.gguf.quant_type": q}):
                limits = {k: v for k, v in thresholds.items() if k != "ppl_ratio_max"}
                limits.update({"ppl_ratio_max": limit} if limit is not None else {})
                parity = verifier.check(final, q, limits, changed=q != source_type)
            attempts.append(parity["attempt"])
            if parity["passed"]:
                quant = q
                break
            nxt = candidates[i + 1][0] if i + 1 < len(candidates) else None
            if nxt is None:
                tried = "; ".join(a["summary"] for a in attempts)
                raise ParityError(
                    f"parity check failed for every type tried: {tried}",
                    hint=(
                        "pass --on-parity-fail fallback to try the next type of the profile's quant order that fits"
                        if ctx.options.on_parity_fail != "fallback"
                        else "pick a higher-precision --quant-type, a profile with more memory, or relax the profile's "
                        "policy.parity limits"
                    ),
                )
            ctx.record_precision_fallback(q, nxt, parity["attempt"]["summary"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(candidates) > 1 or attempts[-1].get("ppl_ratio") is not None:
        recorded = [
            Decision("gguf.parity_attempt", {k: v for k, v in a.items() if k != "summary"}, a["summary"])
            for a in attempts
        ]
        ctx.plan = dataclasses.replace(ctx.plan, added=[*ctx.plan.added, *recorded])  # the caller's plan stays
    ctx.add_artifact("model.gguf", "model")
    out_facts = gguf_facts(final)
    parity.pop("passed")
    parity.pop("attempt")
    if len(attempts) > 1:
        parity["attempts"] = attempts
    ctx.manifest.parity = parity
    ctx.manifest.io = {
        "inputs": [{"name": "prompt", "type": "text"}, {"name": "messages", "type": "chat"}],
        "outputs": [{"name": "text", "type": "text"}],
        "n_vocab": out_facts.get("n_vocab"),
    }
    details: dict[str, Any] = {"chat_template": out_facts["chat_template"]}
    bundled = bundle_chat_template(ctx)
    check_chat_templates(final, ctx.staging if bundled is not None else None)
    if bundled is not None:
        details["chat_template_bundled"] = bundled
    ctx.manifest.llm = llm_config(
        plan, out_facts, final, n_ctx=n_ctx, quant=quant, extra=details, converted=convert_info or None
    )
    draft = gguf_section(plan.section).draft
    if draft is not None:  # --draft: the draft model beside the model (formats/gguf/draft.py)
        from edgesdk.formats.gguf.draft import build_draft

        ctx.manifest.llm.details["draft"] = build_draft(ctx, final, draft, sanity_check)
    ctx.manifest.runtime.backend_chain = ["llama.cpp (GPU offload)", "llama.cpp (CPU)"]
    ctx.runtime_requires.append("llama-cpp-python")
    ctx.tools.update(_tool_versions())
    ctx.set_precision(quant)


def bundle_chat_template(ctx: BuildContext) -> dict[str, str] | None:
    """Write the plan's chat template (``gguf.chat_template``: a shipped name or a file) into the bundle as
    ``chat_template.jinja`` (role ``chat_template``), which the runtime uses by default; None when the plan
    chose none (the GGUF's own template, or no template at all)."""
    from edgesdk.formats.gguf.chat_templates import ARTIFACT, resolve

    choice = gguf_section(ctx.plan.section).chat_template
    if choice is None or choice.template is None:
        return None
    label, text, _ = resolve(choice.template)
    (ctx.staging / ARTIFACT).write_text(text, encoding="utf-8")
    ctx.add_artifact(ARTIFACT, "chat_template")
    shown = Path(label).name if "/" in label else label  # a file given by path: its name, not this host's path
    return {"template": shown, "source": choice.source, "file": ARTIFACT}


def check_chat_templates(gguf: Path, staging: Path | None) -> None:
    """InputError (exit 3) when the chat template the runtime will use, the bundled one or else the GGUF's own
    ``tokenizer.chat_template``, cannot render a sample chat within the runtime's budget
    (:mod:`edgesdk.formats.gguf.chat_limits`): refused here rather than hanging the first chat request."""
    from edgesdk.contracts.gguf_header import read_gguf_header
    from edgesdk.formats.gguf.chat_limits import check_template
    from edgesdk.formats.gguf.chat_templates import ARTIFACT
    from edgesdk.native import import_llama_cpp

    if staging is not None:
        text, where = (staging / ARTIFACT).read_text(encoding="utf-8"), "the bundled chat template"
    else:
        value = read_gguf_header(gguf, keys=("tokenizer.chat_template",)).scalar("tokenizer.chat_template")
        if not isinstance(value, str) or not value.strip():
            return
        text, where = value, "the GGUF's tokenizer.chat_template"
    formatter_cls = import_llama_cpp("llama_chat_format").Jinja2ChatFormatter
    try:
        formatter = formatter_cls(template=text, eos_token="</s>", bos_token="<s>")
        check_template(formatter)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - not valid Jinja: one line
        raise InputError(f"{where} is not valid Jinja ({type(exc).__name__}: {exc})") from None


def _tool_versions() -> dict[str, str]:
    from edgesdk.host import tool_versions

    return tool_versions(("llama-cpp-python", "gguf", "transformers", "torch"))


class _Verifier:
    """Parity of each quantized candidate against one reference. What does not depend on the type (HF vs
    F16 logits; the reference's perplexity) is measured once: a fallback attempt costs one quantize, one
    sanity prompt and one perplexity run."""

    def __init__(self, ctx: BuildContext, reference: Path, n_ctx: int):
        self.ctx, self.reference = ctx, reference
        self.text = PPL_TEXT.read_text(encoding="utf-8")
        self.ppl_ctx = min(256, n_ctx)
        self._logits: dict[str, Any] | None = None
        self._ppl_ref: dict[str, Any] | None = None

    def _hf_logits(self, thresholds: dict[str, Any]) -> dict[str, Any]:
        if self._logits is None:
            self.ctx.progress("parity: HF logits vs F16 GGUF")
            logits = conv.logits_parity(Path(self.ctx.facts.source), self.reference, self.text)
            if logits["min_cosine"] < thresholds.get("logits_min_cosine", LOGITS_MIN_COSINE) or logits[
                "top1_agreement"
            ] < thresholds.get("logits_min_top1", LOGITS_MIN_TOP1):
                # The F16 conversion itself is off: no quantization type can fix that, so no fallback.
                raise ParityError(
                    f"F16 GGUF logits differ from the HF model: min cosine {logits['min_cosine']:.5f}, "
                    f"top-1 agreement {logits['top1_agreement']:.3f} over {logits['positions']} "
                    "positions"
                )
            self._logits = logits
        return self._logits

    def check(self, final: Path, quant: str, thresholds: dict[str, Any], *, changed: bool) -> dict[str, Any]:
        """The parity record of ``final``; ``passed`` and ``attempt`` (the figures, with a one-line summary)
        say whether the perplexity ratio held. Broken logits (NaN, constant) raise ParityError at once."""
        facts = self.ctx.facts
        result: dict[str, Any] = {
            "method": "llama.cpp perplexity on edgesdk/data/ppl_text.txt (windows of up to 256 tokens)",
            "thresholds": thresholds,
        }
        if facts.kind == "hf":
            result["logits_vs_hf"] = self._hf_logits(thresholds)
        self.ctx.progress("sanity: finite, non-constant logits on a fixed prompt")
        result["sanity"] = sanity_check(final, f"{quant} GGUF built from {facts.source}")
        if not changed:
            # Repackaged: the bytes are the source's (the bundle records their sha256), so there is nothing
            # to compare; a perplexity run of a large-vocabulary model costs a minute on a 2-core host.
            result["reference"] = "none: output is the source file unchanged (repackaged)"
            result["passed"] = True
            result["attempt"] = {
                "quant_type": quant,
                "ppl_ratio": None,
                "passed": True,
                "summary": f"{quant}: the source repackaged unchanged, nothing to compare",
            }
            return result
        ppl_out = conv.perplexity(final, self.text, self.ppl_ctx)
        if self._ppl_ref is None:
            self._ppl_ref = conv.perplexity(self.reference, self.text, self.ppl_ctx)
        ppl_ref = self._ppl_ref
        ratio = ppl_out["ppl"] / ppl_ref["ppl"]
        result["ppl"] = ppl_out
        result.update(
            ppl_reference=ppl_ref,
            ppl_ratio=round(ratio, 5),
            reference="F16 conversion" if facts.kind == "hf" else f"source {facts.extra.get('file_type')}",
        )
        limit = thresholds.get("ppl_ratio_max")
        limit = PPL_RATIO_MAX.get(quant, 1.1) if limit is None else limit
        passed = math.isfinite(ratio) and ratio <= limit
        result["passed"] = passed
        result["attempt"] = {
            "quant_type": quant,
            "ppl": round(ppl_out["ppl"], 4),
            "ppl_reference": round(ppl_ref["ppl"], 4),
            "ppl_ratio": round(ratio, 5),
            "ppl_ratio_max": limit,
            "passed": passed,
            "summary": f"{quant}: perplexity {ppl_out['ppl']:.3f} is {ratio:.4f}x the reference's "
            f"{ppl_ref['ppl']:.3f} ({'<=' if passed else '>'} limit {limit}x)",
        }
        return result


def llm_config(
    plan: Plan,
    out_facts: Any,
    final: Path,
    *,
    n_ctx: int,
    quant: str,
    converted: Any,
    extra: dict[str, Any] | None = None,
) -> LLMConfig:
    """The manifest's llama.cpp settings for a built GGUF (shared by the GGUF and VLM formats)."""
    details = {
        "architecture": out_facts["architecture"],
        "layers": out_facts["layers"],
        "kv_heads": out_facts["kv_heads"],
        "head_dim": out_facts["head_dim"],
        "params": out_facts["params"],
        **(extra or {}),
        "file_bytes": final.stat().st_size,
        "converted": converted,
    }
    # Batch sizes and the K/V cache type (llama.cpp names: "f16", "q8_0"), when the plan decided them; the
    # runtime reads them (load_gguf) and keeps llama-cpp-python's defaults (512 / 512 / f16) without them. The
    # serving decisions (slots, prefill_chunk) likewise: without them serve keeps its defaults (16 GPU / 4 CPU).
    section = gguf_section(plan.section)
    kv_type = section.kv_type
    batching = {
        k: v
        for k, v in (
            ("n_batch", section.n_batch),
            ("n_ubatch", section.n_ubatch),
            ("type_k", kv_type),
            ("type_v", kv_type),
            ("slots", section.slots),
            ("prefill_chunk", section.prefill_chunk),
        )
        if v is not None
    }
    return LLMConfig(
        n_ctx=n_ctx,
        n_gpu_layers=section.n_gpu_layers,
        flash_attn=bool(section.flash_attn),
        threads=section.threads,
        quant_type=quant,
        details={**batching, **details},
    )
