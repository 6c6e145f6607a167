# SPDX-License-Identifier: Apache-2.0
"""The profiler's pictures through the real CLI: ``profiler run --plot`` (encoder panels; LLM phases of
every repeat), ``profiler predict --plot`` (roofline), ``profiler compare --plot``. Each PNG is checked
for its magic and size, decoded, and looked at for the colours of what it must show."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_profiler import make_mlp_bundle  # tests/ is on sys.path (rootdir conftest)

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def decode_png(path: Path) -> np.ndarray:
    """Magic, size > 0, and a real decode (matplotlib.image): the RGB(A) pixels."""
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4) and img.shape[0] > 100 and img.shape[1] > 100
    return img


def has_colour(img: np.ndarray, hex_colour: str, min_pixels: int = 50) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0
    close = np.all(np.abs(img[..., :3] - rgb) < 0.02, axis=-1)
    return int(close.sum()) >= min_pixels


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return make_mlp_bundle(tmp_path_factory.mktemp("plots") / "mlp")


@pytest.fixture(scope="module")
def mlp_runs(mlp, tmp_path_factory):
    """Two real `profiler run`s of the MLP bundle through the CLI (reports + the run plot of the second)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("plot-runs")
    paths = []
    for k in (1, 2):
        report, plot = out / f"r{k}.json", out / f"r{k}.png"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "edgesdk",
                "profiler",
                "run",
                str(mlp),
                "--iterations",
                "40",
                "--warmup",
                "3",
                "--threads",
                "1",
                "--op-profile-runs",
                "3",
                "--no-progress",
                "-o",
                str(report),
            ]
            + (["--plot", str(plot)] if k == 2 else []),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        paths.append((report, plot))
    return paths


def test_run_plot_of_an_encoder_keeps_histogram_and_op_times(mlp_runs):
    from edgesdk.profiler.plots import BLUE, ORANGE

    _report, plot = mlp_runs[1]
    img = decode_png(plot)
    assert img.shape[1] >= 1000  # two panels side by side
    assert has_colour(img, BLUE) and has_colour(img, ORANGE)  # histogram bars, op-type bars


def test_predict_plot_is_a_roofline_per_profile(mlp, mlp_runs, run_cli, tmp_path):
    plot = tmp_path / "roof.png"
    report, _ = mlp_runs[0]
    done = run_cli(
        "profiler", "predict", mlp, "-p", "orin-nano-8gb", "-p", "cpu-x86_64", "--report", report, "--plot", plot
    )
    assert done.returncode == 0, done.stderr
    assert f"plot: {plot}" in done.stdout
    img = decode_png(plot)
    assert img.shape[1] > 1.6 * img.shape[0]  # two panels side by side
    from edgesdk.profiler.plots import GREEN, ORANGE

    # orange: predicted points; green: the point measured on cpu-x86_64 (the report's device)
    assert has_colour(img, ORANGE, 20) and has_colour(img, GREEN, 20)


def test_roofline_points_sit_on_the_roof_and_the_measurement_on_its_device(mlp, mlp_runs):
    from edgesdk.commands.profiler import _host_figures_of
    from edgesdk.profiler.api import predict_bundle
    from edgesdk.profiler.plots import roofline_points
    from edgesdk.profiler.report import load_report

    measured = load_report(mlp_runs[0][0])
    here = measured["device"]["best_match"]
    for name in ("orin-nano-8gb", here):
        pred = predict_bundle(mlp, name, measured=measured, measured_host=_host_figures_of(measured, name))
        (pt,) = roofline_points(pred, measured)
        assert pt["workload"] == "encoder"
        work = pred["work"]
        assert pt["intensity"] == pytest.approx(work["flops"] / work["weight_bytes"])
        roof = min(pt["intensity"] * pred["bandwidth_gbps"] * 1e9, pred["peak_flops"] or float("inf"))
        assert pt["bound"] == pytest.approx(roof, rel=1e-9)  # the bound is on the roof
        assert pt["predicted"] is None or pt["predicted"] <= pt["bound"] * (1 + 1e-9)
        if name == here:  # measured: flops / p50 latency
            assert pt["measured"] == pytest.approx(work["flops"] / (measured["latency_ms"]["p50"] / 1e3))
        else:
            assert pt["measured"] is None


def test_compare_plot_bars_both_reports(mlp_runs, run_cli, tmp_path):
    from edgesdk.profiler.plots import BLUE, GREY

    plot = tmp_path / "cmp.png"
    done = run_cli("profiler", "compare", mlp_runs[0][0], mlp_runs[1][0], "--plot", plot)
    assert done.returncode == 0, done.stderr
    img = decode_png(plot)
    assert has_colour(img, GREY) and has_colour(img, BLUE)  # base bars, new bars


def test_compare_plot_of_reports_without_shared_metrics_is_one_line(tmp_path, run_cli):
    from edgesdk.profiler.report import SCHEMA

    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"schema": SCHEMA}))
    done = run_cli("profiler", "compare", empty, empty, "--plot", tmp_path / "x.png")
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == ["error: nothing to plot: the reports share no metric"]
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow
def test_run_plot_of_an_llm_shows_every_repeat(gemma_gguf, tmp_path, run_cli):
    pytest.importorskip("llama_cpp")
    from edgesdk.bundle import artifact_entry, write_manifest
    from edgesdk.profiler.plots import BLUE, GREEN

    bundle = tmp_path / "gemma"
    bundle.mkdir()
    shutil.copyfile(gemma_gguf, bundle / "model.gguf")  # bundles hold regular files only
    write_manifest(
        bundle,
        {
            "bundle_id": "gemma-plot",
            "format": "gguf",
            "precision": "Q4_K_M",
            "model": {"name": "gemma-3-270m", "task": "text-generation"},
            "profile": {"name": "cpu-x86_64"},
            "artifacts": [artifact_entry(bundle, "model.gguf", "model")],
        },
    )
    report, plot = tmp_path / "g.json", tmp_path / "g.png"
    done = run_cli(
        "profiler",
        "run",
        bundle,
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "6",
        "--repeats",
        "3",
        "--no-progress",
        "-o",
        report,
        "--plot",
        plot,
    )
    assert done.returncode == 0, done.stderr
    llm = json.loads(report.read_text())["llm"]
    reps = llm["per_repeat"]
    assert len(reps) == 3
    for r, n in zip(reps, llm["generated_tokens"]):
        assert r["tokens"] == n and 0 < r["prompt_eval_ms"] <= r["ttft_ms"]
        assert r["decode_ms"] > 0 and r["tpot_ms"] == pytest.approx(r["decode_ms"] / (n - 1))
    assert sorted(r["ttft_ms"] for r in reps)[1] == pytest.approx(llm["ttft_ms"]["p50"])
    img = decode_png(plot)
    assert has_colour(img, BLUE, 500) and has_colour(img, GREEN, 500)  # prefill and decode segments
