# SPDX-License-Identifier: Apache-2.0
"""Energy cross-check and device-metrics overhead on an NVIDIA GPU (issue 38), one JSON line on stdout.

1. A 1-client decode through the profiler (``measure_bundle``: the same path as ``edgesdk profiler run``), in
   interleaved rounds with the device metrics off and on (the sampler thread every ``--interval`` s plus the
   OpenTelemetry instruments collected by a periodic reader at the same interval): overhead % of the decode rate
   (llama.cpp's eval timer when present, else 1 / median TPOT), median over rounds.
2. In every round, ``nvidia-smi --query-gpu=index,power.draw`` sampled every ``--smi-ms`` ms on a pipe, integrated
   (trapezoids, per GPU, summed) over exactly the window the profiler's NVML energy counter covered: the two
   joule figures must agree within ``--tolerance`` (10 %). ``power.draw`` on Ampere and later is a 1-second
   average (nvidia-smi --help-query-gpu), so keep the window several seconds long (the defaults give ~5 s on an
   H100 with a 1B model).

Usage (on the GPU machine, edgesdk[gguf,profiler,otel] installed with a CUDA llama-cpp-python):
    python tools/bench/energy_check.py BUNDLE_DIR
    python tools/bench/energy_check.py model.gguf [--profile h200] [--accept-license ID ...]   # builds a bundle
Exit: 0 measured and within tolerance, or nothing to measure here (``"status": "skipped"`` names the missing
sources: a CPU-only machine); 2 measured but NVML and nvidia-smi disagree beyond the tolerance; 3 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def missing_sources() -> dict[str, str]:
    """What this check needs and cannot find here (empty: everything is present)."""
    missing: dict[str, str] = {}
    from edgesdk.profiler.energy import NvmlEnergy, SourceUnavailable

    try:
        NvmlEnergy().close()
    except SourceUnavailable as exc:
        missing["nvml_energy"] = str(exc)
    if shutil.which("nvidia-smi") is None:
        missing["nvidia-smi"] = "not on PATH"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        missing["llama_cpp"] = "llama-cpp-python is not installed (edgesdk[gguf])"
    return missing


class SmiSampler:
    """``nvidia-smi --query-gpu=index,<field> --format=csv,noheader,nounits -lms N`` on a pipe; every line is
    stamped with this process's perf_counter when read."""

    def __init__(self, field: str = "power.draw", period_ms: int = 100) -> None:
        self.field = field
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.errors: list[str] = []
        self.proc = subprocess.Popen(
            [
                "nvidia-smi",
                f"--query-gpu=index,{field}",
                "--format=csv,noheader,nounits",
                "-lms",
                str(period_ms),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t = time.perf_counter()
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.setdefault(int(parts[0]), []).append((t, float(parts[1])))
            except (ValueError, IndexError):
                self.errors.append(line.strip())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.thread.join(timeout=5)

    def joules(self, t0: float, t1: float) -> tuple[float | None, int]:
        """Trapezoid integral of every GPU's power over [t0, t1] (edges interpolated), summed; and the number of
        samples inside the window."""
        total, inside = 0.0, 0
        for series in self.samples.values():
            pts = [(t, w) for t, w in series]
            if len(pts) < 2 or pts[0][0] > t0 or pts[-1][0] < t1:
                return None, inside
            clipped = [(t0, _interp(pts, t0))] + [(t, w) for t, w in pts if t0 < t < t1] + [(t1, _interp(pts, t1))]
            inside += len(clipped) - 2
            total += sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(clipped, clipped[1:]))
        return total, inside


def _interp(pts: list[tuple[float, float]], t: float) -> float:
    for (ta, wa), (tb, wb) in zip(pts, pts[1:]):
        if ta <= t <= tb:
            return wa + (wb - wa) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
    return pts[-1][1]


def decode_rate(body: dict) -> float | None:
    llm = body.get("llm") or {}
    return llm.get("decode_tok_s_backend") or llm.get("decode_tok_s")


def build_bundle(gguf: Path, profile: str, accept: list[str], out: Path) -> Path:
    cmd = [sys.executable, "-m", "edgesdk", "build", str(gguf), "--profile", profile, "-o", str(out)]
    for lic in accept:
        cmd += ["--accept-license", lic]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: edgesdk build failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a GGUF bundle directory, or a .gguf file (built into a bundle first)")
    ap.add_argument("--profile", default=None, help="profile for the build of a .gguf (default: detected)")
    ap.add_argument("--accept-license", action="append", default=[], help="passed to edgesdk build (repeatable)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved off/on rounds")
    ap.add_argument("--gen-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="measured generations per round")
    ap.add_argument("--interval", type=float, default=1.0, help="device-metrics interval (s) in the 'on' arm")
    ap.add_argument("--smi-ms", type=int, default=100, help="nvidia-smi sampling period (ms)")
    ap.add_argument("--smi-field", default="power.draw")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--out", help="also write the JSON line to this file")
    args = ap.parse_args()

    model = Path(args.model)
    if not model.exists():
        print(f"error: {model} does not exist", file=sys.stderr)
        return 3
    missing = missing_sources()
    if missing:
        line = {"check": "energy_check", "status": "skipped", "missing": missing}
        print(json.dumps(line))
        print("energy_check: nothing measured here; missing: " + "; ".join(missing), file=sys.stderr)
        return 0

    from edgesdk.profiler.bench import BenchOptions, measure_bundle

    tmp = None
    if model.is_file():
        if model.suffix != ".gguf":
            print(f"error: {model} is neither a bundle directory nor a .gguf file", file=sys.stderr)
            return 3
        from edgesdk.profiler.device import detect_device

        tmp = tempfile.mkdtemp(prefix="energy-check-")
        model = build_bundle(model, args.profile or detect_device().best_match, args.accept_license, Path(tmp) / "b")

    provider = reader = None
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(
            ConsoleMetricExporter(out=open(os.devnull, "w")),  # noqa: SIM115 - lives as long as the process
            export_interval_millis=int(args.interval * 1000),
        )
        provider = MeterProvider(metric_readers=[reader])
    except ImportError:
        pass

    def opts(interval: float) -> BenchOptions:
        return BenchOptions(
            prompt_tokens=args.prompt_tokens,
            gen_tokens=args.gen_tokens,
            llm_repeats=args.repeats,
            progress=False,
            device_metrics_interval_s=interval,
        )

    rounds = []
    try:
        for r in range(args.rounds):
            row: dict = {"round": r}
            for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):
                handle = None
                if arm == "on" and provider is not None:
                    from edgesdk.profiler.device_metrics import observe

                    handle = observe(provider)
                smi = SmiSampler(args.smi_field, args.smi_ms) if arm == "on" else None
                time.sleep(0.3 if smi else 0)  # a few nvidia-smi samples before the window opens
                try:
                    body = measure_bundle(model, opts(args.interval if arm == "on" else 0))
                finally:
                    time.sleep(0.3 if smi else 0)
                    if smi is not None:
                        smi.stop()
                    if handle is not None:
                        handle.close()
                row[f"decode_tok_s_{arm}"] = decode_rate(body)
                if arm == "on":
                    e = body.get("energy") or {}
                    row["nvml_joules"] = e.get("joules")
                    row["nvml_watts"] = e.get("watts")
                    row["tokens_per_joule"] = e.get("tokens_per_joule")
                    row["window_s"] = e.get("seconds")
                    row["device_state"] = {
                        k: (body.get("device_state") or {}).get(k)
                        for k in ("power_mode", "clocks_mhz", "clocks_locked", "temperature_c", "throttling", "flagged")
                    }
                    row["sampler_read_ms"] = (body.get("device_metrics") or {}).get("read_ms_total")
                    if e.get("clock_window_s") and smi is not None:
                        j, n = smi.joules(*e["clock_window_s"])
                        row["smi_joules"], row["smi_samples_in_window"] = j, n
                        row["smi_errors"] = smi.errors[:3]
                        if j and e.get("joules"):
                            row["nvml_vs_smi_pct"] = 100.0 * (e["joules"] - j) / j
            off, on = row.get("decode_tok_s_off"), row.get("decode_tok_s_on")
            row["overhead_pct"] = 100.0 * (off - on) / off if off and on else None
            rounds.append(row)
            print(json.dumps({"progress": row}), file=sys.stderr)
    finally:
        if provider is not None:
            provider.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    def med(key: str) -> float | None:
        vals = [r[key] for r in rounds if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    diffs = [r["nvml_vs_smi_pct"] for r in rounds if r.get("nvml_vs_smi_pct") is not None]
    within = bool(diffs) and all(abs(d) <= 100 * args.tolerance for d in diffs)
    line = {
        "check": "energy_check",
        "status": "measured",
        "bundle": str(args.model),
        "rounds": rounds,
        "decode_tok_s_off_median": med("decode_tok_s_off"),
        "decode_tok_s_on_median": med("decode_tok_s_on"),
        "device_metrics_overhead_pct_median": med("overhead_pct"),
        "device_metrics_interval_s": args.interval,
        "otel_instruments": provider is not None,
        "tokens_per_joule_median": med("tokens_per_joule"),
        "nvml_watts_median": med("nvml_watts"),
        "nvml_vs_smi_pct": diffs,
        "smi_field": args.smi_field,
        "tolerance_pct": 100 * args.tolerance,
        "within_tolerance": within,
        "goal_overhead_pct": 1.0,
    }
    text = json.dumps(line)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0 if within else 2


if __name__ == "__main__":
    sys.exit(main())
