# SPDX-License-Identifier: Apache-2.0
# ruff: noqa: B023  (each closure is timed right where it is made, inside its own loop turn)
"""GPU truth for the ONNX path (issue 13, item 3), run on the H200 by tools/device/onnx_gpu_session.sh.

Two phases, each its own process so a slow torch.compile cannot cost the ONNX Runtime results:

``ort``   onnxruntime-gpu (installed ahead of the image's CPU onnxruntime): which EPs initialise, FP16 parity
          of the ``h200`` bundles on the CUDA EP against FP32 references (computed on the build host from the
          original weights) and against torch FP16 on the same FP16 weights, per-node placement from ORT's
          profiler, and latency for: CUDA EP ``run`` (host I/O), + IO binding (device I/O), + CUDA graph
          (``enable_cuda_graph``, one captured graph per static shape bucket), + several buckets in one
          session (``gpu_graph_id``). Torch eager on the same FP16 weights is measured in the same process.
``torch`` ``torch.compile`` (default mode) and ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), one
          specialised graph per shape (``dynamic=False``), same FP16 weights.

Latency: per call wall time (perf_counter) around a call that ends when the GPU is done (ORT ``run`` returns
after its stream syncs; torch calls ``torch.cuda.synchronize()``); 30 warm-up calls, then ``--iters``
timed calls; p50/p99 over those. Inputs already live on the GPU for every device-I/O variant (IO binding,
CUDA graph, all torch variants); plain ORT ``run`` takes numpy inputs and returns numpy outputs (its API).

Usage (device, from a folder outside the repo): python3 onnx_gpu_bench.py PHASE --stage DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

MINILM_SHAPES = [(b, s) for b in (1, 8) for s in (32, 128, 256)]
RESNET_SHAPES = [(1, 224), (8, 224)]
WARMUP = 30


def stats(samples: list[float]) -> dict:
    s = sorted(samples)
    q = lambda p: s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]  # noqa: E731
    return {"p50": statistics.median(s), "p99": q(99), "mean": sum(s) / len(s), "min": s[0], "n": len(s)}


def timeit(call, iters: int) -> dict:
    for _ in range(WARMUP):
        call()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e3)
    return stats(out)


def minilm_feeds(b: int, s: int, seed: int = 0) -> dict:
    g = np.random.default_rng(seed)
    ids = g.integers(1000, 30000, size=(b, s), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64), "token_type_ids": np.zeros((b, s), np.int64)}


def resnet_feeds(b: int, _s: int, seed: int = 0) -> dict:
    return {"pixel_values": np.random.default_rng(seed).random((b, 3, 224, 224), dtype=np.float32)}


def cos_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def compare(got: np.ndarray, ref: np.ndarray, mask: np.ndarray | None = None) -> dict:
    """Cosine/max-abs on valid positions only (padded tokens carry no meaning), plus mean-pooled embeddings."""
    got, ref = np.asarray(got, np.float32), np.asarray(ref, np.float32)
    res = {}
    if mask is not None:
        m = mask.astype(bool)
        res["token_min_cosine"] = float(cos_rows(got[m], ref[m]).min())
        res["max_abs"] = float(np.abs(got[m] - ref[m]).max())
        w = mask[..., None].astype(np.float32)
        res["pooled_min_cosine"] = float(cos_rows((got * w).sum(1) / w.sum(1), (ref * w).sum(1) / w.sum(1)).min())
    else:
        res["min_cosine"] = float(cos_rows(got, ref).min())
        res["max_abs"] = float(np.abs(got - ref).max())
    return res


# ----------------------------------------------------------------------------------------------- torch models
def torch_model(kind: str, stage: Path):
    import transformers
    from safetensors.torch import load_file

    wdir = stage / ".gpuw" / ("minilm-fp16" if kind == "minilm" else "resnet-fp16")
    cfg = transformers.AutoConfig.from_pretrained(wdir)
    cls = transformers.BertModel if kind == "minilm" else transformers.ResNetForImageClassification
    model = (cls(cfg, add_pooling_layer=False) if kind == "minilm" else cls(cfg)).eval()
    sd = load_file(wdir / "model.safetensors")
    sd = {k[len("bert.") :] if k.startswith("bert.") else k: v for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "position_ids" not in k and "pooler" not in k]
    if missing:
        raise RuntimeError(f"weights missing for {kind}: {missing[:5]}")
    return model.half().cuda().eval(), {
        "missing_ignored": len(missing),
        "unexpected": list(unexpected)[:5],
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
    }


def torch_call(model, kind: str, feeds: dict):
    import torch

    t = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    if kind == "resnet":
        t["pixel_values"] = t["pixel_values"].half()

    def call():
        with torch.inference_mode():
            out = model(**t)
        torch.cuda.synchronize()
        return out

    return call


def torch_out(out, kind: str) -> np.ndarray:
    x = out.last_hidden_state if kind == "minilm" else out.logits
    return x.float().cpu().numpy()


# ------------------------------------------------------------------------------------------------- ORT phase
def ort_variants(ort, model_path: Path, kind: str, shapes, iters: int, result: dict) -> None:
    feeds_of = minilm_feeds if kind == "minilm" else resnet_feeds
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=cuda)
    result["providers_active"] = sess.get_providers()
    out_names = [o.name for o in sess.get_outputs()]
    lat = result.setdefault("latency_ms", {})
    for b, s in shapes:
        key = f"b{b}_s{s}"
        feeds = feeds_of(b, s)
        row = lat.setdefault(key, {})
        row["ort_cuda_run"] = timeit(lambda: sess.run(out_names, feeds), iters)
        # + IO binding: inputs copied to the GPU once, outputs left on the GPU
        io = sess.io_binding()
        dev_in = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
        for k, v in dev_in.items():
            io.bind_ortvalue_input(k, v)
        for n in out_names:
            io.bind_output(n, "cuda", 0)
        row["ort_cuda_iobinding"] = timeit(lambda: sess.run_with_iobinding(io), iters)
        ref_plain = sess.run(out_names, feeds)[0]
        # + CUDA graph: static shape, fixed input/output addresses; one session per bucket
        try:
            gso = ort.SessionOptions()
            gso.log_severity_level = 3
            gs = ort.InferenceSession(
                str(model_path), gso, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
            )
            gio = gs.io_binding()
            gin = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
            shape_out = list(ref_plain.shape)
            gout = ort.OrtValue.ortvalue_from_shape_and_type(shape_out, ref_plain.dtype, "cuda", 0)
            for k, v in gin.items():
                gio.bind_ortvalue_input(k, v)
            gio.bind_ortvalue_output(out_names[0], gout)
            t0 = time.perf_counter()
            gs.run_with_iobinding(gio)  # first run captures the graph
            row["ort_cuda_graph_capture_ms"] = (time.perf_counter() - t0) * 1e3

            def graph_call():
                for k, v in feeds.items():  # new data goes into the captured input buffers (same addresses)
                    gin[k].update_inplace(v)
                gs.run_with_iobinding(gio)

            row["ort_cuda_graph"] = timeit(graph_call, iters)

            def graph_replay():
                gs.run_with_iobinding(gio)

            row["ort_cuda_graph_no_input_copy"] = timeit(graph_replay, iters)
            row["graph_vs_run_max_abs"] = float(
                np.abs(gout.numpy().astype(np.float32) - ref_plain.astype(np.float32)).max()
            )
        except Exception as exc:  # noqa: BLE001 - record why capture failed, keep the other numbers
            row["ort_cuda_graph_error"] = str(exc).splitlines()[0][:300]
        print(kind, key, {k: (round(v["p50"], 4) if isinstance(v, dict) else v) for k, v in row.items()}, flush=True)
    # several buckets in ONE session: gpu_graph_id selects the captured graph per bucket
    try:
        mso = ort.SessionOptions()
        mso.log_severity_level = 3
        ms = ort.InferenceSession(
            str(model_path), mso, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
        )
        multi = {}
        for gid, (b, s) in enumerate(shapes, start=1):
            feeds = feeds_of(b, s)
            mio = ms.io_binding()
            for k, v in feeds.items():
                mio.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
            mio.bind_output(out_names[0], "cuda", 0)
            ro = ort.RunOptions()
            ro.add_run_config_entry("gpu_graph_id", str(gid))
            ms.run_with_iobinding(mio, ro)
            multi[f"b{b}_s{s}"] = timeit(lambda: ms.run_with_iobinding(mio, ro), iters)
        result["one_session_multi_graph"] = multi
    except Exception as exc:  # noqa: BLE001
        result["one_session_multi_graph_error"] = str(exc).splitlines()[0][:300]


def placement(ort, model_path: Path, feeds: dict, tmp: Path) -> dict:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / f"ortprof_{model_path.parent.name}")
    sess = ort.InferenceSession(str(model_path), so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    for _ in range(3):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    nodes: dict = {}
    for ev in events:
        a = ev.get("args") or {}
        if ev.get("cat") == "Node" and "provider" in a and ev.get("name", "").endswith("_kernel_time"):
            n = nodes.setdefault(
                ev["name"][: -len("_kernel_time")], {"op": a.get("op_name"), "ep": a["provider"], "us": []}
            )
            n["us"].append(ev.get("dur", 0))
    by_ep: dict = {}
    for n in nodes.values():
        d = by_ep.setdefault(n["ep"], {"nodes": 0, "ops": {}, "median_us_sum": 0.0})
        d["nodes"] += 1
        d["ops"][n["op"]] = d["ops"].get(n["op"], 0) + 1
        d["median_us_sum"] += statistics.median(n["us"])
    return {
        "source": "onnxruntime profiler, 3 runs, CUDA EP session",
        "by_provider": by_ep,
        "cpu_nodes": sorted(k for k, v in nodes.items() if v["ep"] == "CPUExecutionProvider"),
    }


def phase_ort(stage: Path, out: Path, iters: int) -> dict:
    import onnxruntime as ort

    ort.preload_dlls()
    res: dict = {
        "onnxruntime": {
            "version": ort.__version__,
            "file": ort.__file__,
            "available_providers": ort.get_available_providers(),
        }
    }
    try:
        from edgesdk.runtime.backends.onnxruntime import probe_provider

        res["ep_probe"] = {
            ep: list(probe_provider(ep)) for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider")
        }
    except Exception as exc:  # noqa: BLE001
        res["ep_probe_error"] = repr(exc)
    import torch

    res["torch"] = {"version": torch.__version__, "device": torch.cuda.get_device_name(0)}
    ref = np.load(stage / ".gpuw" / "reference_fp32.npz")
    for kind, shapes in (("minilm", MINILM_SHAPES), ("resnet", RESNET_SHAPES)):
        r = res.setdefault(kind, {})
        mp = stage / ".gpubundles" / f"{kind}-h200" / "model.onnx"
        try:
            # parity on the GPU: ORT CUDA FP16 vs FP32 reference (original weights) and vs torch FP16 CUDA
            sess = ort.InferenceSession(str(mp), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
            model, info = torch_model(kind, stage)
            r["torch_model"] = info
            if kind == "minilm":
                feeds = {
                    "input_ids": ref["input_ids"],
                    "attention_mask": ref["attention_mask"],
                    "token_type_ids": np.zeros_like(ref["input_ids"]),
                }
                mask, fp32 = ref["attention_mask"], ref["last_hidden_state"]
            else:
                feeds, mask, fp32 = {"pixel_values": ref["pixel_values"]}, None, ref["logits"]
            got = sess.run(None, feeds)[0]
            tout = torch_out(torch_call(model, kind, feeds)(), kind)
            r["parity"] = {
                "ort_cuda_fp16_vs_fp32_reference": compare(got, fp32, mask),
                "torch_cuda_fp16_vs_fp32_reference": compare(tout, fp32, mask),
                "ort_cuda_fp16_vs_torch_cuda_fp16": compare(got, tout, mask),
                "samples": int(fp32.shape[0]),
                "reference": "FP32 PyTorch on CPU with the original weights (build host)",
            }
            print(kind, "parity", json.dumps(r["parity"]), flush=True)
            b0, s0 = shapes[0][0], (128 if kind == "minilm" else 224)
            r["placement"] = placement(ort, mp, (minilm_feeds if kind == "minilm" else resnet_feeds)(b0, s0), out)
            print(kind, "placement", {k: v["nodes"] for k, v in r["placement"]["by_provider"].items()}, flush=True)
            ort_variants(ort, mp, kind, shapes, iters, r)
            for b, s in shapes:
                call = torch_call(model, kind, (minilm_feeds if kind == "minilm" else resnet_feeds)(b, s))
                r["latency_ms"][f"b{b}_s{s}"]["torch_eager"] = timeit(call, iters)
            del model
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001
            r["error"] = traceback.format_exc()[-1500:]
            print(kind, "ERROR", exc, flush=True)
    return res


def phase_torch(stage: Path, iters: int, budget_s: float) -> dict:
    import torch

    res: dict = {"torch": torch.__version__}
    t_end = time.time() + budget_s
    for kind, shapes in (("minilm", MINILM_SHAPES), ("resnet", RESNET_SHAPES)):
        r = res.setdefault(kind, {"latency_ms": {}, "compile_s": {}})
        model, _ = torch_model(kind, stage)
        for mode in ("default", "reduce-overhead"):
            for b, s in shapes:
                if time.time() > t_end:
                    r.setdefault("skipped", []).append(f"{mode} b{b}_s{s}: time budget")
                    continue
                key = f"b{b}_s{s}"
                name = "torch_compile" if mode == "default" else "torch_compile_cudagraphs"
                try:
                    torch._dynamo.reset()
                    cm = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)
                    call = torch_call(cm, kind, (minilm_feeds if kind == "minilm" else resnet_feeds)(b, s))
                    t0 = time.perf_counter()
                    call()
                    call()
                    r["compile_s"][f"{name}_{key}"] = round(time.perf_counter() - t0, 2)
                    r["latency_ms"].setdefault(key, {})[name] = timeit(call, iters)
                    print(
                        kind,
                        key,
                        name,
                        round(r["latency_ms"][key][name]["p50"], 4),
                        "compile",
                        r["compile_s"][f"{name}_{key}"],
                        flush=True,
                    )
                except Exception as exc:  # noqa: BLE001
                    r["latency_ms"].setdefault(key, {})[name + "_error"] = str(exc).splitlines()[0][:300]
                    print(kind, key, name, "ERROR", exc, flush=True)
        del model
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["ort", "torch"])
    ap.add_argument("--stage", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--budget-s", type=float, default=420)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    res = phase_ort(a.stage, a.out, a.iters) if a.phase == "ort" else phase_torch(a.stage, a.iters, a.budget_s)
    res["wall_s"] = round(time.time() - t0, 1)
    res["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["method"] = __doc__.split("Usage")[0].strip()
    (a.out / f"onnx_gpu_{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))
    print("wrote", a.out / f"onnx_gpu_{a.phase}.json", "wall", res["wall_s"], file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
