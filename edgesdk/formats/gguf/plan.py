# SPDX-License-Identifier: Apache-2.0
"""The GGUF path: model facts, the memory-driven quantization plan, and the build stages.

``plan_gguf`` picks the first type in the profile's ``policy.llm.quant_order`` whose weights plus
KV cache at the planned context fit the profile's memory budget, else a shorter context (down to
``min_context_length``), else :class:`ResourceError` with the numbers. Every reason string shows
the arithmetic (``edgesdk build --explain`` prints it). ``build_gguf`` converts (HF -> F16 GGUF with
gguf-py), quantizes with llama.cpp's quantizer, and verifies: HF logits vs the F16 GGUF, and the
quantized file's perplexity on ``edgesdk/data/ppl_text.txt`` relative to its reference.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from edgesdk.errors import InputError, ModelError, ParityError, ResourceError
from edgesdk.formats import gguf_convert as conv
from edgesdk.plan import Decision
from edgesdk.resources import data_file

# Bits per weight. Plain block types follow from the block layout in ggml-common.h (e.g. Q8_0 is
# 32 int8 + one f16 scale = 34 bytes / 32 weights = 8.5; Q6_K is 210 bytes / 256 = 6.5625). The
# _S/_M/_L mixes keep some tensors at a larger type; their figures are the effective bpw llama.cpp's
# quantize tool reports for 7B-class llama models (tools/quantize, "bpw" column) and are estimates.
BPW = {"F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_K_M": 5.69, "Q5_K_S": 5.54,
       "Q5_0": 5.5, "Q5_1": 6.0, "Q4_K_M": 4.89, "Q4_K_S": 4.58, "Q4_0": 4.5, "Q4_1": 5.0, "Q3_K_L": 4.27,
       "Q3_K_M": 3.91, "Q3_K_S": 3.5, "Q2_K": 2.96}

# Perplexity of the quantized file / perplexity of its reference (F16, or the source GGUF) on the
# built-in text must stay under these. Set a little looser than the PPL increases llama.cpp's
# quantize tool lists for Llama-class models (Q8_0 ~+0.0004, Q6_K ~+0.004, Q5_K_M ~+0.014,
# Q4_K_M ~+0.05, Q3_K_M ~+0.24, Q2_K ~+0.87 on PPL ~6), because our text is short (~1k tokens).
PPL_RATIO_MAX = {"F16": 1.005, "BF16": 1.005, "Q8_0": 1.01, "Q6_K": 1.02, "Q5_K_M": 1.03, "Q5_K_S": 1.035,
                 "Q5_0": 1.04, "Q5_1": 1.04, "Q4_K_M": 1.06, "Q4_K_S": 1.07, "Q4_0": 1.10, "Q4_1": 1.09,
                 "Q3_K_L": 1.12, "Q3_K_M": 1.15, "Q3_K_S": 1.2, "Q2_K": 1.4}
# HF (float32) vs F16 GGUF logits on the sample prompts.
LOGITS_MIN_COSINE = 0.999
LOGITS_MIN_TOP1 = 0.95
KV_BYTES_PER_ELEMENT = 2  # llama.cpp's default KV cache type is F16
N_UBATCH = 512  # llama.cpp's default micro-batch: sizes the compute buffer
PPL_TEXT = data_file("ppl_text.txt")
GB = 1e9


# ---------------------------------------------------------------------------------------------
# Facts


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9  # GGUF value types (GGUF spec)


def read_gguf_header(path: Path) -> tuple[dict, list[tuple[str, list[int], int, int]], int]:
    """(key/values, tensor infos (name, shape, ggml type, offset), data start) of a GGUF file.

    Arrays are returned as their length only: gguf-py's GGUFReader materialises every array
    element, which took 21 s for Gemma-3's 262k-token vocabulary on this 2-core host. Raises
    ValueError/struct.error on malformed input."""
    import mmap
    import struct

    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        size = len(buf)
        if size < 24 or buf[:4] != b"GGUF":
            raise ValueError("bad magic (not a GGUF file)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3) or n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ValueError(f"implausible header (version {version}, {n_tensors} tensors, {n_kv} keys)")
        off = 24

        def string(o: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, o)
            if o + 8 + n > size:
                raise ValueError("string runs past the end of the file")
            return buf[o + 8:o + 8 + n].decode("utf-8", errors="replace"), o + 8 + n

        def value(vtype: int, o: int):
            if vtype in _SCALARS:
                return struct.unpack_from(_SCALARS[vtype], buf, o)[0], o + struct.calcsize(_SCALARS[vtype])
            if vtype == _STRING:
                return string(o)
            if vtype == _ARRAY:
                etype, count = struct.unpack_from("<IQ", buf, o)
                o += 12
                if etype in _SCALARS:
                    o += count * struct.calcsize(_SCALARS[etype])
                else:
                    for _ in range(count):
                        o = value(etype, o)[1]
                if o > size:
                    raise ValueError("array runs past the end of the file")
                return [count], o
            raise ValueError(f"unknown value type {vtype}")

        kv: dict = {}
        for _ in range(n_kv):
            key, off = string(off)
            (vtype,) = struct.unpack_from("<I", buf, off)
            val, off = value(vtype, off + 4)
            kv[key] = {"length": val[0]} if vtype == _ARRAY else val
        tensors = []
        for _ in range(n_tensors):
            name, off = string(off)
            (n_dims,) = struct.unpack_from("<I", buf, off)
            if n_dims > 8:
                raise ValueError(f"tensor {name}: {n_dims} dimensions")
            shape = list(struct.unpack_from(f"<{n_dims}Q", buf, off + 4))
            ttype, t_off = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            tensors.append((name, shape, ttype, t_off))
        align = int(kv.get("general.alignment", 32) or 32)
        return kv, tensors, (off + align - 1) // align * align


def gguf_facts(path: str | Path) -> dict:
    """Header facts of a GGUF file (no tensor data is read). ModelError if truncated or corrupt."""
    from gguf import GGML_QUANT_SIZES

    path = Path(path)
    try:
        kv, tensors, data_start = read_gguf_header(path)
    except Exception as exc:  # noqa: BLE001 - struct.error/ValueError/OSError on bad files: one line
        raise ModelError(f"{path}: not a valid GGUF file ({type(exc).__name__}: {str(exc)[:120]})") from exc
    size = path.stat().st_size
    params, end = 0, data_start
    for name, shape, ttype, t_off in tensors:
        n = math.prod(shape)
        if ttype not in GGML_QUANT_SIZES:
            raise ModelError(f"{path}: tensor {name} has unknown ggml type {ttype}")
        block, type_size = GGML_QUANT_SIZES[ttype]
        params += n
        end = max(end, data_start + t_off + n // block * type_size)
    if end > size or not tensors:
        raise ModelError(f"{path}: truncated GGUF file (tensor data needs {end} bytes, file has {size})")
    arch = kv.get("general.architecture")
    if not arch:
        raise ModelError(f"{path}: GGUF file has no general.architecture")

    def one(v):
        return v if not isinstance(v, dict) else None

    heads = one(kv.get(f"{arch}.attention.head_count"))
    hidden = kv.get(f"{arch}.embedding_length")
    file_type = kv.get("general.file_type")
    return {
        "architecture": arch, "name": kv.get("general.name"), "params": int(params),
        "layers": kv.get(f"{arch}.block_count"), "heads": heads,
        "kv_heads": one(kv.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": kv.get(f"{arch}.attention.key_length") or (hidden // heads if hidden and heads else None),
        "hidden": hidden, "ffn": one(kv.get(f"{arch}.feed_forward_length")),
        "ctx_train": kv.get(f"{arch}.context_length"),
        "n_vocab": (kv.get("tokenizer.ggml.tokens") or {}).get("length"),
        "file_type": conv.FTYPE_NAMES.get(file_type, f"ftype {file_type}") if file_type is not None else None,
        "license": kv.get("general.license"), "license_name": kv.get("general.license.name"),
        "license_link": kv.get("general.license.link"),
        "chat_template": "tokenizer.chat_template" in kv, "tensor_bytes": int(end),
    }


def hf_causal_lm_facts(directory: str | Path) -> dict:
    """Facts the GGUF planner needs from a HF causal-LM directory's config.json and tokenizer files."""
    directory = Path(directory)
    cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    archs = cfg.get("architectures") or []
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    tok_cfg = directory / "tokenizer_config.json"
    chat = (directory / "chat_template.jinja").is_file() or (
        tok_cfg.is_file() and "chat_template" in json.loads(tok_cfg.read_text(encoding="utf-8")))
    return {
        "architecture": archs[0] if archs else cfg.get("model_type"),
        "gguf_supported": bool(archs) and archs[0] in conv.SUPPORTED_ARCHITECTURES,
        "layers": cfg.get("num_hidden_layers"), "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads, "hidden": hidden,
        "head_dim": cfg.get("head_dim") or (hidden // heads if hidden and heads else None),
        "ffn": cfg.get("intermediate_size"), "ctx_train": cfg.get("max_position_embeddings"),
        "n_vocab": cfg.get("vocab_size"), "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "tokenizer_files": [f for f in ("tokenizer.json", "tokenizer.model") if (directory / f).is_file()],
        "chat_template": chat,
    }


# ---------------------------------------------------------------------------------------------
# Plan


def _gb(n_bytes: float) -> str:
    if n_bytes < 0.1 * GB:
        return f"{n_bytes / 1e6:.2f} MB"
    return f"{n_bytes / GB:.2f} GB"


def kv_bytes(info: dict, n_ctx: int) -> int:
    """KV cache bytes: 2 (K and V) x layers x kv_heads x head_dim x context x 2 bytes (F16)."""
    return 2 * int(info["layers"]) * int(info["kv_heads"]) * int(info["head_dim"]) * n_ctx * KV_BYTES_PER_ELEMENT


def compute_bytes(info: dict, weight_bytes: float) -> float:
    """Compute-buffer estimate: one micro-batch of the widest activations in F32
    (n_ubatch x (n_vocab + ffn + 4 x hidden) x 4 B) plus 5 % of the weights for allocator slack."""
    width = int(info.get("n_vocab") or 32000) + int(info.get("ffn") or 4 * (info.get("hidden") or 0)) \
        + 4 * int(info.get("hidden") or 0)
    return N_UBATCH * width * 4 + 0.05 * weight_bytes


def _check_shape(facts) -> dict:
    info = facts.extra
    if facts.kind == "hf":
        if not info.get("gguf_supported"):
            raise ModelError(f"architecture {info.get('architecture')} not supported for GGUF conversion "
                             f"(supported: {conv.supported_list()})")
        if not info.get("tokenizer_files"):
            raise ModelError(f"{facts.source}: tokenizer missing (expected tokenizer.json or tokenizer.model)",
                             hint="save the tokenizer next to the weights with tokenizer.save_pretrained()")
    missing = [k for k in ("layers", "kv_heads", "head_dim") if not info.get(k)]
    if missing or not facts.params:
        raise ModelError(f"{facts.source}: cannot size the model (missing {', '.join(missing) or 'params'})")
    return info


def _candidate_types(facts, profile, options) -> tuple[list[str], str]:
    order = list((profile.policy.get("llm") or {}).get("quant_order") or ["Q8_0", "Q4_K_M"])
    source_type = facts.extra.get("file_type") if facts.kind == "gguf" else None
    if options.quant_type:
        q = options.quant_type.upper()
        if q not in conv.FTYPES or q not in BPW:
            raise InputError(f"unknown GGUF quantization type {options.quant_type!r} "
                             f"(known: {', '.join(t for t in BPW if t in conv.FTYPES)})")
        order, why = [q], f"requested with --quant-type {q}"
    else:
        why = f"profile {profile.name} quant_order {order}"
    if source_type in BPW and source_type not in ("F32", "F16", "BF16"):
        higher = [q for q in order if BPW[q] > BPW[source_type]]
        if options.quant_type and higher:
            raise ModelError(f"cannot requantize an already-quantized {source_type} file to the higher-precision "
                             f"type {higher[0]}: the lost precision cannot be restored",
                             hint=f"pick {source_type} or a smaller type, or start from the F16/HF model")
        if higher:
            why += (f"; source is already {source_type}, so higher-precision types ({', '.join(higher)}) are "
                    "skipped (requantizing up cannot restore precision)")
        order = [q for q in order if q not in higher] or [source_type]
    return order, why


def _weight_bytes(facts, quant: str) -> tuple[float, str]:
    """Weight bytes at ``quant``: the file's own tensor bytes when the GGUF source already is that type
    (mixes keep embeddings/output at larger types, so bpw x params underestimates), else params x bpw."""
    if facts.kind == "gguf" and facts.extra.get("file_type") == quant and facts.extra.get("tensor_bytes"):
        return float(facts.extra["tensor_bytes"]), "tensor bytes of the source file"
    return facts.params * BPW[quant] / 8, f"{int(facts.params):,} params x {BPW[quant]} bpw / 8"


def plan_gguf(facts, profile, options) -> list[Decision]:
    """Quant type, context, offload, flash attention and threads for ``profile`` (see module docstring)."""
    info = _check_shape(facts)
    llm = profile.policy.get("llm") or {}
    ctx_train = int(info.get("ctx_train") or 4096)
    want_ctx = int(options.context_length or llm.get("context_length") or 4096)
    n_ctx = min(want_ctx, ctx_train)
    min_ctx = min(int(llm.get("min_context_length") or 512), n_ctx)
    ctx_note = f" (capped at the model's trained context {ctx_train})" if want_ctx > ctx_train else ""
    order, order_why = _candidate_types(facts, profile, options)
    budget_gb = profile.memory_budget_gb()
    out: list[Decision] = []
    kv = kv_bytes(info, n_ctx)
    kv_why = (f"KV cache = 2 x {info['layers']} layers x {info['kv_heads']} kv heads x {info['head_dim']} head dim "
              f"x {n_ctx} ctx x 2 B = {_gb(kv)}")
    chosen, tried = None, []
    if budget_gb is None:
        chosen = order[0]
        w, w_why = _weight_bytes(facts, chosen)
        mem_why = (f"profile {profile.name} has no memory figure (host-dependent; `edgesdk profiles detect --write` "
                   f"records it): took the first type; {chosen} weights = {w_why} = {_gb(w)}, {kv_why}")
    else:
        budget = budget_gb * GB
        head = (f"budget {budget_gb} GB (profile {profile.name}: usable memory minus "
                f"{profile.policy['memory_headroom_fraction']:.0%} headroom)")
        for q in order:
            w, w_why = _weight_bytes(facts, q)
            total = w + kv + compute_bytes(info, w)
            tried.append(f"{q}: {w_why} = {_gb(w)} weights + {_gb(kv)} KV + "
                         f"{_gb(compute_bytes(info, w))} compute = {_gb(total)}")
            if total <= budget:
                chosen = q
                break
        if chosen is not None:
            mem_why = f"{tried[-1]} <= {head}; {kv_why}"
            if len(tried) > 1:
                mem_why += "; larger types did not fit: " + "; ".join(f"{t} > budget" for t in tried[:-1])
        else:
            q = order[-1]
            w = _weight_bytes(facts, q)[0]
            spare = budget - w - compute_bytes(info, w)
            per_tok = kv_bytes(info, 1)
            fit_ctx = int(spare // per_tok) // 256 * 256 if spare > 0 else 0
            fit_ctx = min(fit_ctx, n_ctx)
            if fit_ctx < min_ctx:
                raise ResourceError(
                    f"{facts.name} does not fit profile {profile.name}: smallest allowed type {q} needs "
                    f"{_gb(w + compute_bytes(info, w) + kv_bytes(info, min_ctx))} at the minimum context "
                    f"{min_ctx} ({_gb(w)} weights + {_gb(kv_bytes(info, min_ctx))} KV), budget is {budget_gb} GB")
            chosen = q
            mem_why = (f"no type fits at {n_ctx} ctx ({'; '.join(t + ' > budget' for t in tried)}); {q} leaves "
                       f"{_gb(spare)} of {head} for KV at {_gb(per_tok)}/token -> {fit_ctx} ctx "
                       f"(rounded down to 256, >= min {min_ctx})")
            n_ctx, ctx_note = fit_ctx, " (shortened to fit the memory budget)"
    source_type = info.get("file_type") if facts.kind == "gguf" else None
    if facts.kind == "hf":
        action = f"convert HF -> F16 GGUF (gguf-py), then llama.cpp quantize -> {chosen}" if chosen != "F16" \
            else "convert HF -> F16 GGUF (gguf-py)"
    elif source_type == chosen:
        action = f"repackage: source is already {chosen}"
    else:
        action = f"requantize {source_type} -> {chosen} with llama.cpp quantize"
    out.append(Decision("gguf.source", action, f"source is {'a HF ' + str(info.get('architecture')) + ' directory' if facts.kind == 'hf' else 'a ' + str(source_type) + ' GGUF file'}"))
    out.append(Decision("gguf.quant_type", chosen, f"{order_why}; {mem_why}"))
    out.append(Decision("gguf.context_length", n_ctx, f"profile policy.llm.context_length {want_ctx}{ctx_note}"))
    out.extend(_runtime_decisions(profile, info))
    ref = "F16 conversion" if facts.kind == "hf" else "source GGUF"
    parity = {"ppl_ratio_max": PPL_RATIO_MAX.get(chosen, 1.1)}
    why = f"perplexity of the {chosen} file on the built-in text / that of the {ref} <= {parity['ppl_ratio_max']}"
    if facts.kind == "gguf" and source_type == chosen:
        parity, why = {}, "repackaged: the bytes are the source's (sha256 in the manifest); nothing to compare"
    if facts.kind == "hf":
        parity.update(logits_min_cosine=LOGITS_MIN_COSINE, logits_min_top1=LOGITS_MIN_TOP1)
        why += (f"; HF (fp32) vs F16 GGUF logits on sample prompts: min cosine >= {LOGITS_MIN_COSINE}, "
                f"top-1 agreement >= {LOGITS_MIN_TOP1}")
    out.append(Decision("parity", parity, why))
    return out


def _runtime_decisions(profile, info: dict) -> list[Decision]:
    out = []
    if profile.is_gpu:
        out.append(Decision("gguf.n_gpu_layers", "all", f"weights + KV fit the budget, so all {info['layers']} "
                            "layers (and the output layer) go to the GPU; the runtime re-sizes to free device "
                            "memory at load time and records any step down"))
    else:
        out.append(Decision("gguf.n_gpu_layers", 0, f"profile {profile.name} has no GPU"))
    fa = profile.kernels.get("flash_attention") or {}
    use_fa = bool(profile.is_gpu and fa.get("supported"))
    out.append(Decision("gguf.flash_attn", use_fa, f"profile kernel table: flash_attention supported="
                        f"{fa.get('supported')} ({fa.get('source')})"))
    cores = ((profile.data["device"].get("cpu") or {}).get("cores"))
    out.append(Decision("gguf.threads", cores or "auto", f"profile lists {cores} CPU cores" if cores else
                        "profile lists no core count: the runtime uses the physical cores it finds"))
    return out


# ---------------------------------------------------------------------------------------------
# Build


def build_gguf(ctx) -> None:
    """Convert / quantize / verify into ``ctx.staging/model.gguf`` and fill the manifest."""
    facts, plan = ctx.facts, ctx.plan
    quant = plan.decision("gguf.quant_type")
    n_ctx = int(plan.decision("gguf.context_length"))
    work = ctx.staging / "_work"
    work.mkdir(parents=True, exist_ok=True)
    final = ctx.staging / "model.gguf"
    reference: Path | None = None
    convert_info: dict = {}
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
    ctx.manifest["parity"] = parity
    ctx.manifest["io"] = {"inputs": [{"name": "prompt", "type": "text"}, {"name": "messages", "type": "chat"}],
                          "outputs": [{"name": "text", "type": "text"}], "n_vocab": out_facts.get("n_vocab")}
    ctx.manifest["extras"]["llm"] = {
        "n_ctx": n_ctx, "n_gpu_layers": plan.decision("gguf.n_gpu_layers"),
        "flash_attn": plan.decision("gguf.flash_attn"), "threads": plan.decision("gguf.threads"),
        "quant_type": quant, "architecture": out_facts["architecture"], "layers": out_facts["layers"],
        "kv_heads": out_facts["kv_heads"], "head_dim": out_facts["head_dim"], "params": out_facts["params"],
        "chat_template": out_facts["chat_template"], "file_bytes": final.stat().st_size,
        "converted": convert_info or None}
    ctx.manifest["backend_chain"] = ["llama.cpp (GPU offload)", "llama.cpp (CPU)"]
    ctx.runtime_requires.append("llama-cpp-python")
    ctx.tools.update(_tool_versions())
    ctx.set_precision(quant)


def _tool_versions() -> dict:
    from edgesdk.host import tool_versions

    return tool_versions(("llama-cpp-python", "gguf", "transformers", "torch"))


def _verify(ctx, reference: Path, final: Path, quant: str, n_ctx: int, *, changed: bool) -> dict:
    facts = ctx.facts
    thresholds = ctx.plan.decision("parity") or {}
    text = PPL_TEXT.read_text(encoding="utf-8")
    result: dict = {"method": "llama.cpp perplexity on edgesdk/data/ppl_text.txt (windows of up to 256 tokens)",
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

