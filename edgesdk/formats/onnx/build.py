# SPDX-License-Identifier: Apache-2.0
"""ONNX path: export (optimum exporters / torch.onnx), optimize, precision, parity, artifacts.

Stages run inside ``ctx.stage(name)`` so each one is a telemetry span and a progress step.
The PyTorch model is loaded once: it is the export source and the parity reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import InputError, ModelError, ParityError
from edgesdk.formats.onnx import parity as P
from edgesdk.formats.onnx.export import run_export, save_feeds, stack, torch_reference
from edgesdk.formats.onnx.plan import next_precision, onnx_section
from edgesdk.manifest import EmbeddingConfig
from edgesdk.types import JSONObject, OptimizeMethod

if TYPE_CHECKING:
    from onnx import ModelProto, ValueInfoProto

    from edgesdk.formats import BuildContext

Feed = dict[str, np.ndarray]  # one model input: graph input name -> array

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "preprocessor_config.json",
)
# Protobuf's 2 GiB limit on one message: larger models keep their weights in "<model>.onnx.data" beside.
INLINE_MAX_BYTES = 1_800_000_000


def _has_external(model: ModelProto) -> bool:
    from onnx import TensorProto

    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def save_onnx(model: ModelProto, out: Path, *, external: bool | None = None) -> None:
    """Save ``model`` (weights loaded) to ``out``; weights go to ``out.name + ".data"`` beside it when the
    model is too large for one protobuf (or ``external``), which is how ONNX stores models over 2 GB."""
    import onnx

    data = out.with_name(out.name + ".data")
    if data.exists():
        data.unlink()
    if external is None:
        external = model.ByteSize() > INLINE_MAX_BYTES
    if external:
        onnx.save(
            model,
            str(out),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=0,
        )
    else:
        onnx.save(model, str(out))


def copy_onnx(src: Path, out: Path) -> None:
    """Copy an ONNX model with its external data (if any) to ``out`` (+ ``out.onnx.data``)."""
    import onnx

    head = onnx.load(str(src), load_external_data=False)
    if not _has_external(head):
        shutil.copyfile(src, out)
        return
    save_onnx(onnx.load(str(src)), out, external=True)


def check_ort_loads(path: Path) -> None:
    """ONNX Runtime must accept the source graph; a graph it rejects is bad input (exit 3) naming the file."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph/NotImplemented classes
        detail = " ".join(str(exc).split())
        detail = detail.split(" : ", 3)[-1] if " : " in detail else detail
        detail = detail.split("failed:", 1)[-1] if detail.startswith("Load model from") else detail
        raise ModelError(f"{path}: ONNX Runtime rejects the model ({type(exc).__name__}: {detail[:200]})") from exc


def _versions() -> dict[str, str]:
    """Tool versions from distribution metadata (importing torch/transformers here would cost seconds)."""
    from edgesdk.host import dist_of, tool_versions

    return tool_versions(
        ("onnx", dist_of("onnxruntime"), "torch", "transformers", "optimum", "optimum-onnx", "onnxslim")
    )


# --------------------------------------------------------------------------------------------- export


def _export_torch(ctx: BuildContext, module: Any, out: Path) -> None:
    import torch

    example = ctx.options.option("example_inputs")
    if example is None:
        raise InputError("building an nn.Module needs example inputs (BuildOptions.example_inputs)")
    example = example if isinstance(example, tuple) else (example,)
    names = ctx.options.option("input_names") or [f"input_{i}" for i in range(len(example))]
    torch.onnx.export(
        module.eval(),
        example,
        str(out),
        input_names=names,
        opset_version=ctx.options.opset,
        dynamo=False,
        dynamic_axes={n: {0: "batch"} for n in names},
    )


# --------------------------------------------------------------------------------------------- inputs


class _Samples:
    """Sample feeds for parity and calibration plus the reference outputs from the source model."""

    def __init__(self, feeds: list[Feed], reference: list[np.ndarray] | None, masks: list[np.ndarray | None]) -> None:
        self.feeds, self.reference, self.masks = feeds, reference, masks


def _make_samples(
    ctx: BuildContext, input_names: list[str], model: Any | None, n: int, offset: int = 0, fixed_length: bool = True
) -> _Samples:
    """Sample feeds for ONNX / nn.Module sources (tokenizer beside an .onnx file, else typed noise)."""
    if "input_ids" in input_names and (Path(str(ctx.source)).parent / "tokenizer.json").exists():
        tok = P.load_tokenizer(Path(ctx.source).parent, ctx.options.seq_len, fixed_length)
        feeds = P.encode_texts(tok, P.sample_sentences(n, offset), input_names)
    else:
        feeds = _random_feeds(ctx, input_names, n, offset)
    masks = [f.get("attention_mask") for f in feeds]
    reference = torch_reference(model, feeds) if model is not None else None
    return _Samples(feeds, reference, masks)


def _hf_feeds(ctx: BuildContext, n: int, offset: int, fixed_length: bool) -> list[Feed]:
    """Sample feeds for a Hugging Face model before export: tokenizer for text, NCHW noise for images."""
    task = ctx.facts.task
    if task in ("feature-extraction", "text-classification"):
        tok = P.load_tokenizer(Path(ctx.source), ctx.options.seq_len, fixed_length)
        return P.encode_texts(tok, P.sample_sentences(n, offset), ["input_ids", "attention_mask", "token_type_ids"])
    if task == "image-classification":
        cfg = ctx.facts.config or {}
        size = int(cfg.get("image_size") or 224)
        rng = np.random.default_rng(1234 + offset)
        shape = (1, int(cfg.get("num_channels", 3)), size, size)
        return [{"pixel_values": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]
    raise ModelError(
        f"{ctx.facts.name}: task {task!r} ({ctx.facts.architecture}) is not supported by the ONNX path "
        "(supported: feature-extraction, text-classification, image-classification)"
    )


def _export_hf_in_child(ctx: BuildContext, work: Path, exported: Path) -> tuple[_Samples, _Samples]:
    """Export + PyTorch references in a child process (see edgesdk/formats/onnx/export.py)."""
    import onnx

    calib = _hf_feeds(ctx, ctx.options.calibration_samples, 0, fixed_length=True)
    parity = _hf_feeds(ctx, ctx.options.parity_samples, ctx.options.calibration_samples, fixed_length=False)
    files = [work / "feeds_calib.npz", work / "feeds_parity.npz"]
    for f, feeds in zip(files, (calib, parity)):
        save_feeds(f, feeds)
    spec = {
        "source": str(ctx.source),
        "task": ctx.facts.task,
        "family": ctx.facts.family,
        "name": ctx.facts.name,
        "trust_remote_code": ctx.options.trust_remote_code,
        "pickle_weights": bool(ctx.facts.extra.get("pickle_weights")),
        "opset": ctx.options.opset,
        "out": str(exported),
        "feed_files": [str(f) for f in files],
        "reference_files": [str(work / "refs_calib.npz"), str(work / "refs_parity.npz")],
    }
    refs = run_export(spec, work)
    names = {i.name for i in onnx.load(str(exported), load_external_data=False).graph.input}
    out = []
    for feeds, ref in zip((calib, parity), refs):
        feeds = [{k: v for k, v in f.items() if k in names} for f in feeds]
        out.append(_Samples(feeds, ref, [f.get("attention_mask") for f in feeds]))
    return out[0], out[1]


def _random_feeds(ctx: BuildContext, input_names: list[str], n: int, offset: int) -> list[Feed]:
    import onnx

    src = ctx.staging / "_work" / "export.onnx"
    graph = onnx.load(str(src), load_external_data=False).graph
    rng = np.random.default_rng(1234 + offset)
    feeds = []
    text = "input_ids" in input_names
    size = ctx.options.seq_len if text else ((ctx.facts.config or {}).get("image_size") or 224)
    for _ in range(n):
        feed = {}
        for inp in graph.input:
            if inp.name not in input_names:
                continue
            t = inp.type.tensor_type
            shape = [d.dim_value if d.dim_value > 0 else (1 if i == 0 else size) for i, d in enumerate(t.shape.dim)]
            if len(shape) == 4 and t.shape.dim[1].dim_value <= 0:  # NCHW image: channels from the config
                shape[1] = int((ctx.facts.config or {}).get("num_channels", 3))
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            if "mask" in inp.name:
                feed[inp.name] = np.ones(shape, dtype=dtype)
            elif "type_ids" in inp.name or "position" in inp.name:
                feed[inp.name] = np.zeros(shape, dtype=dtype)
            elif np.issubdtype(dtype, np.integer):
                # token ids: a low id range every vocabulary has
                feed[inp.name] = rng.integers(100, 1000, size=shape).astype(dtype)
            else:
                feed[inp.name] = rng.standard_normal(shape).astype(dtype)
        feeds.append(feed)
    return feeds


def _ort_outputs(path: Path, feeds: list[Feed], threads: int = 2, chunk: int = 16) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    outs: list[np.ndarray] = []
    for i in range(0, len(feeds), chunk):
        part = feeds[i : i + chunk]
        batch = stack(part)
        try:
            arr = sess.run(None, batch)[0] if batch is not None else None
        except Exception:  # noqa: BLE001 - a graph with a fixed batch of 1 cannot take a stacked batch
            arr = None
        if arr is None:
            outs.extend(sess.run(None, f)[0] for f in part)
        else:
            outs.extend(arr[j : j + 1] for j in range(arr.shape[0]))
    return outs


_PAIRS = 16


def _padded_parity(ctx: BuildContext, path: Path, held_out: _Samples, min_cosine: float | None) -> JSONObject | None:
    """The held-out texts in padded batches: grouped as ``Session.embed`` groups them (gated), and each one
    beside a long text in its own batch (``pairs``: recorded, not gated; embed() never forms such batches).

    INT8 scales are per tensor, i.e. per batch, so a text's embedding depends on its neighbours
    (docs/int8.md). Batches of ``EMBED_MAX_BATCH`` texts are tried first, then fewer, down to 1 (each text
    alone); the largest batch that keeps ``min_cosine`` is recorded as ``embed_max_batch``, which
    ``Session.embed`` then uses. Text encoders with a tokenizer only; None otherwise."""

    feeds, ref = held_out.feeds, held_out.reference
    if (
        not feeds
        or ref is None
        or any("input_ids" not in f or "attention_mask" not in f for f in feeds)
        or any(np.ndim(r) != 3 for r in ref)
    ):
        return None
    tok_dir = Path(ctx.source) if ctx.facts.kind == "hf" else Path(str(ctx.source)).parent
    if not (tok_dir / "tokenizer.json").is_file():
        return None
    import onnxruntime as ort

    names = list(feeds[0])
    max_len = P.embed_max_length(tok_dir)
    pad_id = int(P.load_tokenizer(tok_dir, max_len, fixed_length=False).padding["pad_id"])
    extra = P.long_feeds(tok_dir, max_len, names)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    if any(isinstance(d, int) for i in sess.get_inputs() for d in i.shape[:2]):
        return None  # a fixed batch or sequence length: no padded batches to run

    def run(feed: Feed) -> np.ndarray:
        first: np.ndarray = sess.run(None, dict(feed))[0]
        return first

    out = P.embed_batch_parity(ref, held_out.masks, feeds, extra, pad_id, run, min_cosine)
    # the ungated worst case on the first _PAIRS texts only: each pair runs 2 x embed()'s full length
    pairs = P.batched_parity(ref, held_out.masks, P.padded_batches(feeds[:_PAIRS], extra, pad_id, how="pairs"), run)
    out["long_texts"] = [int(f["attention_mask"].sum()) for f in extra]
    out["how"] = (
        "each held-out text's mean-pooled output inside a padded batch vs its batch-1 reference; batches "
        "as Session.embed forms them (length-grouped) from the held-out texts plus the long texts"
    )
    out["pairs"] = {k: pairs[k] for k in ("samples", "min_cosine", "mean_cosine", "padded_length_max")}
    out["pairs"]["how"] = (
        "each held-out text beside one long text in one padded batch (not gated: embed() "
        "never batches texts whose lengths differ more than EMBED_MAX_LENGTH_RATIO)"
    )
    return out


# --------------------------------------------------------------------------------------------- stages


def _optimize(ctx: BuildContext, src: Path, out: Path) -> JSONObject:
    method = onnx_section(ctx.plan.section).optimize
    if method is OptimizeMethod.NONE:
        copy_onnx(src, out)
        return {"tool": "none", "reason": "plan: none (plain export; ONNX Runtime's session optimizer runs at load)"}
    if method is OptimizeMethod.ORT_TRANSFORMER:
        from edgesdk.formats.onnx.quant import optimize_transformer

        cfg = ctx.facts.config
        _, report = optimize_transformer(
            src,
            out,
            model_type="bert",
            num_heads=int(cfg["num_attention_heads"]),
            hidden_size=int(cfg["hidden_size"]),
            use_gpu_fusions=ctx.profile.is_gpu,
        )
        return {"tool": "onnxruntime.transformers.optimizer", **report}
    try:
        import contextlib
        import io

        import onnxslim

        with contextlib.redirect_stdout(io.StringIO()):  # onnxslim prints a summary table
            onnxslim.slim(str(src), str(out))
        return {"tool": "onnxslim", "version": onnxslim.__version__}
    except Exception as exc:  # noqa: BLE001 - optimization is optional; record why it did not apply
        copy_onnx(src, out)
        return {"tool": "none", "reason": f"onnxslim failed: {type(exc).__name__}: {exc}"[:200]}


def _to_fp16(src: Path, out: Path) -> JSONObject:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    # Keep graph inputs/outputs FP32 so callers need no casts; keep ops that overflow in FP16 in FP32.
    m16 = convert_float_to_float16(model, keep_io_types=True, op_block_list=["SimplifiedLayerNormalization"])
    save_onnx(m16, out)
    return {"method": "onnxruntime.transformers.float16 (keep_io_types)"}


def _quantize(ctx: BuildContext, precision: str, src: Path, out: Path, samples: _Samples) -> JSONObject:
    if precision == "fp32":
        copy_onnx(src, out)
        return {"method": "none"}
    if precision in ("fp16", "bf16"):
        return _to_fp16(src, out)
    if precision == "int8":
        from edgesdk.formats.onnx.quant import quantize_int8_accuracy_aware

        def parity_fn(ref: list[np.ndarray], cand: list[np.ndarray]) -> JSONObject:
            return P.compare(ref, cand, samples.masks[: len(ref)])

        assert samples.reference is not None  # set in build_onnx's export stage
        res = quantize_int8_accuracy_aware(
            src,
            out,
            calibration_feeds=samples.feeds,
            reference_outputs=samples.reference,
            parity_fn=parity_fn,
            min_cosine=float(ctx.plan.parity.get("min_cosine") or 0.995),
            progress=ctx.progress,
        )
        return {
            "method": res.method,
            "excluded_nodes": res.excluded_nodes,
            "calibration_parity": res.parity,
            "latency_ms": res.latency_ms,
            "reason": res.reason,
            "steps": res.steps,
        }
    raise InputError(f"precision {precision!r} is not supported for ONNX")


def build_onnx(ctx: BuildContext) -> None:
    """Fill ``ctx.staging`` with model.onnx at the plan's precision, tokenizer files and parity figures."""
    work = ctx.staging / "_work"
    work.mkdir(exist_ok=True)
    exported = work / "export.onnx"
    model = None
    with ctx.stage("export"):
        if ctx.facts.kind == "hf":
            samples, held_out = _export_hf_in_child(ctx, work, exported)
        elif ctx.facts.kind == "torch":
            model = ctx.source
            try:
                _export_torch(ctx, model, exported)
            except Exception as exc:  # an op without an ONNX symbolic: keep a torch.export program instead
                from edgesdk.formats.torch.export import build_torch_fallback

                build_torch_fallback(ctx, exc)
                return
        else:
            check_ort_loads(Path(ctx.source))
            copy_onnx(Path(ctx.source), exported)
        if ctx.facts.kind != "hf":
            import onnx

            input_names = [i.name for i in onnx.load(str(exported), load_external_data=False).graph.input]
            # Calibration and held-out parity samples, with the source model's outputs as the reference.
            samples = _make_samples(ctx, input_names, model, ctx.options.calibration_samples)
            held_out = _make_samples(
                ctx,
                input_names,
                model,
                ctx.options.parity_samples,
                offset=ctx.options.calibration_samples,
                fixed_length=False,
            )
        if model is None and ctx.facts.kind == "onnx":
            # No PyTorch source: the FP32 ONNX itself is the reference.
            samples.reference = _ort_outputs(exported, samples.feeds)
            held_out.reference = _ort_outputs(exported, held_out.feeds)
        model = None  # drop the reference to an nn.Module source before optimization/quantization
    with ctx.stage("optimize"):
        optimized = work / "optimized.onnx"
        ctx.manifest.extras["optimize"] = _optimize(ctx, exported, optimized)
    reference_kind = "pytorch" if ctx.facts.kind in ("hf", "torch") else "onnx-fp32"
    # The ONNX artifact's own precision: the bundle's, except for TensorRT (which converts at engine build).
    artifact_precision = onnx_section(ctx.plan.section).onnx_precision
    precision = artifact_precision or ctx.plan.precision
    final = ctx.staging / "model.onnx"
    while True:
        with ctx.stage("quantize", {"edgesdk.precision": precision}):
            qinfo = _quantize(ctx, precision, optimized, final, samples)
        with ctx.stage("verify", {"edgesdk.precision": precision}):
            outputs = _ort_outputs(final, held_out.feeds)
            assert held_out.reference is not None  # set in the export stage above
            metrics = P.compare(held_out.reference, outputs, held_out.masks)
            thresholds = onnx_section(ctx.plan.section).thresholds(precision)
            miss = P.check_thresholds(metrics, thresholds)
            padded = _padded_parity(ctx, final, held_out, thresholds.get("min_cosine"))
            if padded is not None:  # the held-out texts in padded batches, as embed() runs them
                metrics["padded"] = padded
                padded_miss = P.check_thresholds(padded, {"min_cosine": thresholds.get("min_cosine")})
                if miss is None and padded_miss is not None:
                    miss = f"{padded_miss} (held-out texts in padded batches, as embed() runs them)"
        ctx.manifest.parity[precision] = {
            **metrics,
            "thresholds": thresholds,
            "passed": miss is None,
            "reference": reference_kind,
        }
        if miss is None:
            break
        nxt = next_precision(precision, ctx.profile.precision_order)
        if ctx.options.on_parity_fail != "fallback" or nxt is None:
            raise ParityError(
                f"parity check failed at {precision}: {miss} over {metrics['samples']} samples",
                hint="pass --on-parity-fail fallback to try the next precision",
            )
        ctx.record_precision_fallback(precision, nxt, miss)
        precision = nxt
    if artifact_precision is None:
        ctx.set_precision(precision)
    ctx.manifest.extras["quantize"] = qinfo
    src_dir = Path(ctx.source) if ctx.facts.kind == "hf" else None
    if src_dir is not None:
        _stamp_license(final, _card_license(src_dir))
    elif ctx.facts.kind == "torch" and ctx.options.option("license"):
        _stamp_license(final, {"license": str(ctx.options.option("license"))})
    if ctx.facts.extra.get("external_data") and not (ctx.staging / "model.onnx.data").is_file():
        import onnx  # the source kept its weights beside it: so does the bundle (a > 2 GB model must)

        save_onnx(onnx.load(str(final)), final, external=True)
    ctx.add_artifact("model.onnx", "model")
    if (ctx.staging / "model.onnx.data").is_file():  # weights of a model over 2 GB, beside it: hashed too
        ctx.add_artifact("model.onnx.data", "model-data")
    if src_dir is not None:
        if (src_dir / "README.md").is_file():  # the model card carries the model's license: it ships along
            shutil.copyfile(src_dir / "README.md", ctx.staging / "README.md")
            ctx.add_artifact("README.md", "model-card")
        for name in TOKENIZER_FILES:
            if (src_dir / name).is_file():
                shutil.copyfile(src_dir / name, ctx.staging / name)
                ctx.add_artifact(name, "tokenizer" if name.startswith(("tokenizer", "vocab", "special")) else "config")
        pooling = src_dir / "1_Pooling" / "config.json"
        if pooling.is_file():
            (ctx.staging / "1_Pooling").mkdir(exist_ok=True)
            shutil.copyfile(pooling, ctx.staging / "1_Pooling" / "config.json")
            ctx.add_artifact("1_Pooling/config.json", "config")
        if onnx_section(ctx.plan.section).eager_fallback:  # GPU profiles: weights for the runtime's eager CUDA fallback
            from edgesdk.formats.torch.eager import write_eager_weights

            ctx.manifest.extras["eager_fallback"] = write_eager_weights(ctx, src_dir, ctx.precision)
    ctx.manifest.io = _io_spec(final)
    ctx.manifest.embedding = _embedding_info(src_dir) if src_dir else None
    from edgesdk.host import dist_of

    ctx.runtime_requires.extend([dist_of("onnxruntime"), "numpy", "tokenizers"])
    ctx.tools.update(_versions())
    shutil.rmtree(work, ignore_errors=True)


def _card_license(src_dir: Path) -> JSONObject:
    from edgesdk.compliance.models import card_front_matter

    card = src_dir / "README.md"
    meta = card_front_matter(card) if card.is_file() else None
    return {k: meta[k] for k in ("license", "license_name", "license_link") if meta and meta.get(k)}


def _stamp_license(model_path: Path, fields: JSONObject) -> None:
    """Write license fields (model card's, or the caller's for an nn.Module) into the ONNX metadata_props."""
    import onnx

    if not fields:
        return
    model = onnx.load(str(model_path))
    existing = {p.key for p in model.metadata_props}
    for key, value in fields.items():
        if key not in existing:
            model.metadata_props.add(
                key=key, value=str(value if not isinstance(value, list) else " AND ".join(map(str, value)))
            )
    save_onnx(model, model_path, external=(model_path.with_name(model_path.name + ".data")).is_file() or None)


def _io_spec(path: Path) -> JSONObject:
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph

    def spec(v: ValueInfoProto) -> JSONObject:
        t = v.type.tensor_type
        return {
            "name": v.name,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
            "shape": [d.dim_value if d.dim_value > 0 else (d.dim_param or None) for d in t.shape.dim],
        }

    return {"inputs": [spec(i) for i in g.input], "outputs": [spec(o) for o in g.output]}


def _embedding_info(src_dir: Path) -> EmbeddingConfig | None:
    modules = src_dir / "modules.json"
    if not modules.is_file():
        return None
    mods = json.loads(modules.read_text())
    types = [m.get("type", "") for m in mods]
    pooling = {"pooling_mode_mean_tokens": True}
    pcfg = src_dir / "1_Pooling" / "config.json"
    if pcfg.is_file():
        pooling = json.loads(pcfg.read_text())
    mode = "cls" if pooling.get("pooling_mode_cls_token") else "mean"
    return EmbeddingConfig(pooling=mode, normalize=any(t.endswith("Normalize") for t in types))
