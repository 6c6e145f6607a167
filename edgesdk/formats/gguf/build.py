# SPDX-License-Identifier: Apache-2.0
"""GGUF build stages: convert (HF -> F16 GGUF with gguf-py), quantize with llama.cpp's quantizer, and
verify: HF logits vs the F16 GGUF, and the quantized file's perplexity on ``edgesdk/data/ppl_text.txt``
relative to its reference. The plan it executes comes from :mod:`edgesdk.formats.gguf.plan`.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.errors import ParityError
from edgesdk.formats.gguf import convert as conv
from edgesdk.formats.gguf.facts import gguf_facts
from edgesdk.formats.gguf.plan import LOGITS_MIN_COSINE, LOGITS_MIN_TOP1, PPL_RATIO_MAX
from edgesdk.manifest import LLMConfig
from edgesdk.resources import data_file

if TYPE_CHECKING:
    from edgesdk.build import BuildContext

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
        raise ParityError(f"{label or path}: {bad} of {logits.size} logits on the sanity prompt are NaN/Inf "
                          "(the weights are broken)", hint="rebuild the GGUF from a good source")
    if spread == 0.0:
        raise ParityError(f"{label or path}: every logit on the sanity prompt is the same value (the weights are "
                          "broken)", hint="rebuild the GGUF from a good source")
    return result


def build_gguf(ctx: BuildContext) -> None:
    """Convert / quantize / verify into ``ctx.staging/model.gguf`` and fill the manifest."""
    facts, plan = ctx.facts, ctx.plan
    quant = plan.decision("gguf.quant_type")
    n_ctx = int(plan.decision("gguf.context_length"))
    work = ctx.staging / "_work"
    work.mkdir(parents=True, exist_ok=True)
    final = ctx.staging / "model.gguf"
    reference: Path | None = None
    convert_info: dict[str, Any] = {}
    try:
        with ctx.stage("convert", {"edgesdk.gguf.quant_type": quant}):
            if facts.kind == "hf":
                ctx.progress("converting HF weights to F16 GGUF (gguf-py)")
                reference = work / "model-f16.gguf"
                convert_info = conv.convert_hf_to_gguf(Path(facts.source), reference, name=facts.name)
            else:
                reference = Path(facts.source)
        with ctx.stage("quantize"):
            source_type = "F16" if facts.kind == "hf" else facts.extra.get("file_type")
            if quant == source_type:
                shutil.copyfile(reference, final)
            else:
                ctx.progress(f"llama.cpp quantize {source_type} -> {quant}")
                conv.quantize(reference, final, quant, allow_requantize=facts.kind == "gguf")
        with ctx.stage("verify"):
            parity = _verify(ctx, reference, final, quant, n_ctx, changed=quant != source_type)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx.add_artifact("model.gguf", "model")
    out_facts = gguf_facts(final)
    ctx.manifest.parity = parity
    ctx.manifest.io = {"inputs": [{"name": "prompt", "type": "text"}, {"name": "messages", "type": "chat"}],
                       "outputs": [{"name": "text", "type": "text"}], "n_vocab": out_facts.get("n_vocab")}
    ctx.manifest.llm = llm_config(plan, out_facts, final, n_ctx=n_ctx, quant=quant,
                                  extra={"chat_template": out_facts["chat_template"]},
                                  converted=convert_info or None)
    ctx.manifest.runtime.backend_chain = ["llama.cpp (GPU offload)", "llama.cpp (CPU)"]
    ctx.runtime_requires.append("llama-cpp-python")
    ctx.tools.update(_tool_versions())
    ctx.set_precision(quant)


def _tool_versions() -> dict[str, str]:
    from edgesdk.host import tool_versions

    return tool_versions(("llama-cpp-python", "gguf", "transformers", "torch"))


def _verify(ctx: BuildContext, reference: Path, final: Path, quant: str, n_ctx: int, *,
            changed: bool) -> dict[str, Any]:
    facts = ctx.facts
    thresholds = ctx.plan.decision("parity") or {}
    text = PPL_TEXT.read_text(encoding="utf-8")
    result: dict[str, Any] = {
        "method": "llama.cpp perplexity on edgesdk/data/ppl_text.txt (windows of up to 256 tokens)",
        "thresholds": thresholds}
    ppl_ctx = min(256, n_ctx)
    if facts.kind == "hf":
        ctx.progress("parity: HF logits vs F16 GGUF")
        logits = conv.logits_parity(Path(facts.source), reference, text)
        result["logits_vs_hf"] = logits
        if logits["min_cosine"] < thresholds.get("logits_min_cosine", LOGITS_MIN_COSINE) or \
                logits["top1_agreement"] < thresholds.get("logits_min_top1", LOGITS_MIN_TOP1):
            raise ParityError(f"F16 GGUF logits differ from the HF model: min cosine {logits['min_cosine']:.5f}, "
                              f"top-1 agreement {logits['top1_agreement']:.3f} over {logits['positions']} positions")
    ctx.progress("sanity: finite, non-constant logits on a fixed prompt")
    result["sanity"] = sanity_check(final, f"{quant} GGUF built from {facts.source}")
    if not changed:
        # Repackaged: the bytes are the source's (the bundle records their sha256), so there is nothing
        # to compare; a perplexity run of a large-vocabulary model costs a minute on a 2-core host.
        result["reference"] = "none: output is the source file unchanged (repackaged)"
        return result
    ppl_out = conv.perplexity(final, text, ppl_ctx)
    result["ppl"] = ppl_out
    ppl_ref = conv.perplexity(reference, text, ppl_ctx)
    ratio = ppl_out["ppl"] / ppl_ref["ppl"]
    result.update(ppl_reference=ppl_ref, ppl_ratio=round(ratio, 5),
                  reference="F16 conversion" if facts.kind == "hf" else f"source {facts.extra.get('file_type')}")
    limit = thresholds.get("ppl_ratio_max", PPL_RATIO_MAX.get(quant, 1.1))
    if not math.isfinite(ratio) or ratio > limit:
        raise ParityError(f"{quant} perplexity {ppl_out['ppl']:.3f} is {ratio:.4f}x the reference's "
                          f"{ppl_ref['ppl']:.3f} (limit {limit}x)")
    return result


def llm_config(plan: Any, out_facts: Any, final: Path, *, n_ctx: int, quant: str, converted: Any,
               extra: dict[str, Any] | None = None) -> LLMConfig:
    """The manifest's llama.cpp settings for a built GGUF (shared by the GGUF and VLM formats)."""
    details = {"architecture": out_facts["architecture"], "layers": out_facts["layers"],
               "kv_heads": out_facts["kv_heads"], "head_dim": out_facts["head_dim"], "params": out_facts["params"],
               **(extra or {}), "file_bytes": final.stat().st_size, "converted": converted}
    return LLMConfig(n_ctx=n_ctx, n_gpu_layers=plan.decision("gguf.n_gpu_layers"),
                     flash_attn=bool(plan.decision("gguf.flash_attn")), threads=plan.decision("gguf.threads"),
                     quant_type=quant, details=details)
