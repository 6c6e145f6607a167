# SPDX-License-Identifier: Apache-2.0
"""The GPU smoke run as a user does it: edgesdk from a wheel of the checkout, the documented commands, no tweaks.

Run by tools/device/smoke.sh on the GPU machine after the CUDA llama-cpp-python wheel exists. Each step is a
command a user types (README / docs), run in the machine's own Python environment (its torch, transformers,
onnxruntime, numpy), into which edgesdk is installed from its wheel: first with no extras, then with
``[gguf,serve,otel]``. No environment variable is set for edgesdk and nothing is imported in a chosen order.
Every step records its command, exit code, seconds and key figures; a failed step does not stop the run. The
result goes to ``$OUT/device_smoke.json`` (commit it as tools/bench/results/device_smoke.json) and its summary
line is printed last.

    python3 tools/device/smoke.py --wheel dist/edgesdk-0.1.0-py3-none-any.whl --find-links .whl \
        --find-links /tmp/llwheel --commit $(git rev-parse --short HEAD) [--deadline 330]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = Path("/tmp/smoke")
BIN = Path(sys.executable).parent  # the environment's scripts (edgesdk lands here)
USER_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESDK_", "PYTHONPATH"))}
USER_ENV["HF_HUB_OFFLINE"] = "1"  # the machine has no network; a user's air-gapped device is the same


class Smoke:
    def __init__(self, deadline: float, out: Path) -> None:
        self.t0 = time.monotonic()
        self.deadline = deadline
        self.out = out
        self.steps: list[dict] = []
        self.meta: dict = {}

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def run(
        self,
        name: str,
        cmd: list[str] | str,
        *,
        timeout: float = 120,
        figures=None,
        shell: bool = False,
        background: bool = False,
    ) -> dict:
        if self.left() < 10:
            step = {
                "step": name,
                "cmd": cmd if isinstance(cmd, str) else shlex.join(cmd),
                "rc": None,
                "skipped": "deadline",
            }
            self.steps.append(step)
            self.save()
            return step
        t = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=min(timeout, self.left() - 5),
                env=USER_ENV,
                cwd=WORK,
                shell=shell,
            )
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except OSError as exc:  # the command itself is missing (an install step before it failed)
            rc, stdout, stderr = 127, "", f"{type(exc).__name__}: {exc}"
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = 124, exc.stdout or "", exc.stderr or ""
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
        step = {
            "step": name,
            "cmd": cmd if isinstance(cmd, str) else shlex.join(cmd),
            "rc": rc,
            "seconds": round(time.monotonic() - t, 1),
        }
        if rc != 0:
            step["stderr_tail"] = [ln for ln in stderr.splitlines() if ln.strip()][-4:]
            step["stdout_tail"] = [ln for ln in stdout.splitlines() if ln.strip()][-2:]
        elif figures is not None:
            try:
                step["figures"] = figures(stdout, stderr)
            except Exception as exc:  # noqa: BLE001 - a figure we could not read is recorded, not fatal
                step["figures_error"] = f"{type(exc).__name__}: {exc}"
        self.steps.append(step)
        print(f"[{time.monotonic() - self.t0:6.1f}s] {name}: rc={rc} ({step['seconds']} s)", flush=True)
        self.save()
        return step

    def save(self) -> None:
        ok = [s for s in self.steps if s.get("rc") == 0]
        self.meta["steps_passed"] = f"{len(ok)}/{len(self.steps)}"
        text = json.dumps({**self.meta, "summary": self.summary(), "steps": self.steps}, indent=1)
        self.out.write_text(text)
        (WORK / "device_smoke.json").write_text(text)  # --resume in the next call on a warm machine reads it

    def resume(self, commit: str) -> None:
        """Take the steps an earlier call on this (still warm) machine recorded for the same commit."""
        path = WORK / "device_smoke.json"
        if path.is_file():
            earlier = json.loads(path.read_text())
            if earlier.get("commit") == commit:
                self.steps = earlier["steps"]
                self.meta["calls"] = earlier.get("calls", 1) + 1

    def fig(self, name: str) -> dict:
        return next((s.get("figures") or {} for s in self.steps if s["step"] == name and s.get("rc") == 0), {})

    def summary(self) -> str:
        ok = sum(1 for s in self.steps if s.get("rc") == 0)
        m = self.fig("import matrix")
        run = self.fig("gguf run --report --json")
        serve = self.fig("serve: 16 concurrent clients")
        curve = (self.fig("serve curve: 1-32 clients and mixed load").get("tok_s") or {}).get("edgesdk") or {}
        points = "/".join(f"{curve[c]:.0f}" for c in sorted(curve, key=int)) if curve else "-"
        counts = "/".join(str(c) for c in sorted(curve, key=int)) or "-"
        return (
            f"device smoke {self.meta.get('commit')} {self.meta.get('date')} on {self.meta.get('gpu')}: "
            f"{ok}/{len(self.steps)} steps passed; import matrix {m.get('same_text_as_first', '-')}/"
            f"{m.get('orders', '-')}; gguf decode {run.get('decode_tok_s', '-')} tok/s on "
            f"{run.get('placement', '-')}; serve 16 clients {serve.get('total_tok_s', '-')} tok/s "
            f"(1 client {serve.get('single_tok_s', '-')}); curve {counts} clients "
            f"{points} tok/s; vlm "
            f"{'ok' if self.fig('vlm run --image') else 'failed or not run'}"
        )


LLAMA_SERVER = Path("/tmp/lls/llama-server")  # tools/device/build_llama_server.sh cuda 90, when built on this machine


def serve_curve(smoke: Smoke, py: str, bundle: Path, out: Path) -> None:
    """The whole load curve (tools/bench/bench_serve_curve.py): `edgesdk serve` with its defaults at 1, 2, 3, 4, 6,
    8, 16 and 32 closed-loop clients, and the mixed load; against llama-server -np 16 and -np 4 when built here."""
    cmd = [
        py,
        str(REPO / "tools/bench/bench_serve_curve.py"),
        str(bundle),
        "--threads",
        "8",
        "--seconds",
        "5",
        "--mixed",
        "--out",
        str(out),
    ]
    if LLAMA_SERVER.is_file():
        cmd += ["--llama-server", str(LLAMA_SERVER)]

    def figures(o: str, e: str) -> dict:
        doc = json.loads(out.read_text())
        curve = {name: {r["clients"]: r["tok_s"] for r in rows} for name, rows in doc["curve"].items()}
        mixed = doc.get("mixed", {}).get("edgesdk", {})
        per_joule = {name: {r["clients"]: r.get("tok_per_j") for r in rows} for name, rows in doc["curve"].items()}
        return {
            "tok_s": curve,
            "tok_per_j": per_joule,
            "short_alone_ttft_ms": mixed.get("short_alone_ttft_ms"),
            "short_behind_long_ttft_max_ms": mixed.get("short_behind_long_ttft_max_ms"),
        }

    smoke.run("serve curve: 1-32 clients and mixed load", cmd, timeout=480, figures=figures)


def energy(smoke: Smoke, py: str, bundle: Path, out: Path) -> None:
    """Energy per token and the device metrics' overhead (tools/bench/energy_check.py): NVML's energy counter around
    a 1-client decode, cross-checked against nvidia-smi's power.draw over the same interval (issue 38)."""
    cmd = [py, str(REPO / "tools/bench/energy_check.py"), str(bundle), "--out", str(out)]

    def figures(o: str, e: str) -> dict:
        return _json_last(o)

    smoke.run("energy per token (NVML vs nvidia-smi)", cmd, timeout=300, figures=figures)


def speculative(smoke: Smoke, py: str, gguf: Path, out: Path) -> None:
    """Prompt-lookup speculative decoding, one request at a time, off vs lookup vs auto on the GPU
    (tools/bench/bench_speculative.py on the smoke's GGUF, every layer on the GPU; issue 37)."""
    cmd = [py, str(REPO / "tools/bench/bench_speculative.py"), "--gguf", str(gguf), "--n-gpu-layers", "-1",
           "--threads", "8", "--rounds", "2", "--identity", "200", "--out", str(out)]  # fmt: skip

    def figures(o: str, e: str) -> dict:
        return json.loads(out.read_text())["sets"]

    smoke.run("speculative decoding: prompt lookup vs off", cmd, timeout=420, figures=figures)


def _json_last(stdout: str) -> dict:
    return (
        json.loads(stdout[stdout.index("{") :])
        if stdout.strip().startswith("{")
        else json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_load(smoke: Smoke, bundle: Path, clients: int, max_tokens: int) -> None:
    """`edgesdk serve BUNDLE` (as the README shows it), then 1 and N concurrent streaming completions (httpx)."""
    port = _free_port()
    cmd = [str(BIN / "edgesdk"), "serve", str(bundle), "--name", "llm", "--port", str(port)]
    t = time.monotonic()
    server = subprocess.Popen(cmd, cwd=WORK, env=USER_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    step: dict = {"step": f"serve: {clients} concurrent clients", "cmd": shlex.join(cmd)}
    try:
        import httpx

        base = f"http://127.0.0.1:{port}"
        while time.monotonic() - t < 120:
            if server.poll() is not None:
                raise RuntimeError(f"server exited {server.returncode}: {server.stderr.read()[-400:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        step["server_start_s"] = round(time.monotonic() - t, 1)

        def one(i: int, res: list) -> None:
            body = {
                "model": "llm",
                "prompt": f"Request {i}: the harbour town",
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            t1 = time.monotonic()
            first, tokens = None, 0
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and first is None:
                        first = time.monotonic() - t1
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            res.append({"ttft_s": first, "tokens": tokens, "s": time.monotonic() - t1})

        def wave(n: int) -> dict:
            res: list = []
            threads = [threading.Thread(target=one, args=(i, res)) for i in range(n)]
            t2 = time.monotonic()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.monotonic() - t2
            assert len(res) == n and all(r["tokens"] > 0 for r in res), res
            return {
                "total_tok_s": round(sum(r["tokens"] for r in res) / wall, 1),
                "ttft_p50_ms": round(statistics.median(r["ttft_s"] for r in res) * 1000, 1),
            }

        wave(1)  # warm-up
        single = wave(1)
        # the first wave of N after start was much slower on the H200 (16 clients 1,066 tok/s, TTFT p50 729 ms;
        # 3,813 tok/s under steady load), likely the first use of the batched shapes (not profiled): recorded,
        # and the second wave is the figure
        first = wave(clients)
        many = wave(clients)
        step.update(
            rc=0,
            figures={
                "single_tok_s": single["total_tok_s"],
                "total_tok_s": many["total_tok_s"],
                "ttft_p50_ms": many["ttft_p50_ms"],
                "clients": clients,
                "first_wave_tok_s": first["total_tok_s"],
                "first_wave_ttft_p50_ms": first["ttft_p50_ms"],
                "max_tokens": max_tokens,
            },
        )
    except Exception as exc:  # noqa: BLE001 - recorded as the step's failure
        step.update(rc=1, error=f"{type(exc).__name__}: {str(exc)[:300]}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        step["server_rc"] = server.returncode
        step["seconds"] = round(time.monotonic() - t, 1)
    smoke.steps.append(step)
    print(f"serve: rc={step['rc']} ({step['seconds']} s) {step.get('figures') or step.get('error')}", flush=True)
    smoke.save()


MAKE_MODELS = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tools/bench"); sys.path.insert(0, sys.argv[1] + "/tests")
work = Path(sys.argv[2]); kinds = sys.argv[3].split(",")
import torch, transformers
out = {"torch": torch.__version__, "transformers": transformers.__version__}
if "llm" in kinds:
    import bench_p4_h200 as b
    (work / "llama-1b").mkdir(exist_ok=True)
    b.make_model(work / "llama-1b", b.TINY if "tiny" in kinds else b.TINYLLAMA)
if "vlm" in kinds:
    from vlm_fixtures import make_test_images, make_tiny_llava
    make_tiny_llava(work / "llava")
    out["image"] = str(make_test_images(work / "images")[0])
if "onnx" in kinds:
    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    torch.onnx.export(m, (torch.randn(1, 256),), str(work / "mlp.onnx"), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False)
print(json.dumps(out))
"""

CONVERT = (
    "import sys; from pathlib import Path; from edgesdk.formats.gguf.convert import convert_hf_to_gguf; "
    "convert_hf_to_gguf(Path(sys.argv[1]), Path(sys.argv[2]), name='llama-1b-random')"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--find-links", action="append", default=[])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--deadline", type=float, default=330, help="seconds for the whole run; steps past it skip")
    ap.add_argument("--steps", default="install,llm,serve,curve,energy,speculative,vlm,matrix,profiler,onnx")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument(
        "--llm-shape",
        choices=("tinyllama", "tiny"),
        default="tinyllama",
        help="tiny: a seconds-long rehearsal of the whole run on a CPU host (figures meaningless)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the record of an earlier call on this warm machine (same commit)",
    )
    ap.add_argument("--matrix-limit", type=int, default=0, help="first N import orders only (0: all 120)")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "device_smoke.json"
    smoke = Smoke(args.deadline, out)
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        gpu = "no NVIDIA GPU (nvidia-smi not found)"
    smoke.meta = {
        "commit": args.commit,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu,
        "python": sys.version.split()[0],
        "deadline_s": args.deadline,
        "calls": 1,
    }
    if args.resume:
        smoke.resume(args.commit)
    steps = set(args.steps.split(","))
    links = [x for fl in args.find_links for x in ("--find-links", str(Path(fl).resolve()))]
    wheel = str(Path(args.wheel).resolve())
    py = sys.executable
    es = str(BIN / "edgesdk")
    if "install" in steps:
        # 1. the wheel, no extras, into the machine's environment (pip has no index there: --find-links only)
        smoke.run(
            "pip install edgesdk (no extras)",
            [py, "-m", "pip", "install", "-q", "--no-index", *links, wheel],
            timeout=120,
        )
        smoke.run(
            "edgesdk doctor --json (no extras)",
            [es, "doctor", "--json"],
            timeout=60,
            figures=lambda o, e: {c["component"]: c["available"] for c in json.loads(o)},
        )
        smoke.run(
            "pip install edgesdk[gguf,serve,otel] + build modules",
            [
                py,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                *links,
                f"{wheel}[gguf,serve,otel]",
                "onnxslim",
                "cyclonedx-python-lib",
            ],
            timeout=180,
        )
        smoke.run(
            "edgesdk doctor --json",
            [es, "doctor", "--json"],
            timeout=60,
            figures=lambda o, e: [c for c in json.loads(o) if "llama" in c["component"] or "GPU" in c["component"]],
        )
    kinds = [k for k in ("llm", "vlm", "onnx") if k in steps]
    made = smoke.run(
        "make random-weight models (machine's torch + transformers)",
        [
            sys.executable,
            "-c",
            MAKE_MODELS,
            str(REPO),
            str(WORK),
            ",".join(kinds + (["tiny"] if args.llm_shape == "tiny" else [])),
        ],
        timeout=180,
        figures=lambda o, e: _json_last(o),
    )
    gguf_bundle, vlm_bundle = WORK / "b-llama", WORK / "b-llava"
    if "llm" in steps:
        smoke.run(
            "convert HF -> GGUF F16 (edgesdk converter)",
            [py, "-c", CONVERT, str(WORK / "llama-1b"), str(WORK / "llama-1b-f16.gguf")],
            timeout=120,
        )
        smoke.run(
            "edgesdk build random-1b.gguf --profile h200",
            [
                es,
                "build",
                str(WORK / "llama-1b-f16.gguf"),
                "--profile",
                "h200",
                "-o",
                str(gguf_bundle),
                "--model-license",
                "Apache-2.0",
                "--no-progress",
                "--force",
            ],
            timeout=240,
        )
        smoke.run(
            "gguf run --stream",
            [es, "run", str(gguf_bundle), "--prompt", "Write a haiku", "--max-tokens", "64", "--stream"],
            timeout=120,
        )

        def run_figs(o: str, e: str) -> dict:
            j = _json_last(o)
            rep = j.get("report", {})
            usage = j.get("usage", {})
            return {
                "decode_tok_s": usage.get("tokens_per_s"),
                "ttft_ms": usage.get("ttft_ms"),
                "placement": (rep.get("backend_report") or {}).get("placement"),
                "fallbacks": len(rep.get("fallbacks", [])),
            }

        smoke.run(
            "gguf run --report --json",
            [
                es,
                "run",
                str(gguf_bundle),
                "--prompt",
                "The harbour town",
                "--max-tokens",
                "128",
                "--temperature",
                "0",
                "--report",
                "--json",
            ],
            timeout=120,
            figures=run_figs,
        )
    if "serve" in steps and gguf_bundle.is_dir():
        serve_load(smoke, gguf_bundle, clients=16, max_tokens=64)
    if "curve" in steps and gguf_bundle.is_dir():
        serve_curve(smoke, py, gguf_bundle, Path(args.out) / "serve_curve.json")
    if "energy" in steps and gguf_bundle.is_dir():
        energy(smoke, py, gguf_bundle, Path(args.out) / "energy_check_gpu.json")
    if "speculative" in steps and gguf_bundle.is_dir():
        speculative(smoke, py, gguf_bundle / "model.gguf", Path(args.out) / "speculative_gpu.json")
    image = (made.get("figures") or {}).get("image") or next(
        (str(p) for p in sorted((WORK / "images").glob("*.png"))), None
    )  # made by an earlier call (--resume)
    if "vlm" in steps:
        smoke.run(
            "edgesdk build llava (transformers 5 checkpoint) --profile h200",
            [es, "build", str(WORK / "llava"), "--profile", "h200", "-o", str(vlm_bundle), "--no-progress", "--force"],
            timeout=240,
        )
        if image:
            smoke.run(
                "vlm run --image",
                [
                    es,
                    "run",
                    str(vlm_bundle),
                    "--image",
                    image,
                    "--prompt",
                    "What is in the picture?",
                    "--max-tokens",
                    "16",
                    "--temperature",
                    "0",
                    "--json",
                    "--report",
                ],
                timeout=120,
                figures=lambda o, e: {
                    "text": _json_last(o).get("text"),
                    "encoder": ((_json_last(o).get("report") or {}).get("backend_report") or {}).get("vision_encoder"),
                },
            )
    if "matrix" in steps and gguf_bundle.is_dir():
        smoke.run(
            "import matrix",
            [
                py,
                str(REPO / "tools/device/import_matrix.py"),
                "--gguf",
                str(gguf_bundle),
                "--vlm",
                str(vlm_bundle) if vlm_bundle.is_dir() else "",
                "--image",
                image or "",
                "--jobs",
                "12",
                "--limit",
                str(args.matrix_limit),
                "--out",
                str(Path(args.out) / "import_matrix.json"),
            ],
            timeout=300,
            figures=lambda o, e: {k: v for k, v in _json_last(o).items() if k != "failed"},
        )
    if "profiler" in steps and gguf_bundle.is_dir():
        smoke.run(
            "edgesdk profiler run (gguf) --json",
            [es, "profiler", "run", str(gguf_bundle), "--json"],
            timeout=120,
            figures=lambda o, e: {
                "backend": _json_last(o)["runtime"]["backend"],
                "device": _json_last(o)["runtime"]["device"],
                "llm": _json_last(o).get("llm"),
            },
        )
    if "onnx" in steps and (WORK / "mlp.onnx").is_file():
        smoke.run(
            "edgesdk build mlp.onnx --profile h200",
            [
                es,
                "build",
                str(WORK / "mlp.onnx"),
                "--profile",
                "h200",
                "-o",
                str(WORK / "b-mlp"),
                "--model-license",
                "Apache-2.0",
                "--no-progress",
                "--force",
            ],
            timeout=120,
        )
        smoke.run(
            "edgesdk profiler run (onnx, eager CUDA fallback) --json",
            [es, "profiler", "run", str(WORK / "b-mlp"), "--json"],
            timeout=120,
            figures=lambda o, e: {
                "backend": _json_last(o)["runtime"]["backend"],
                "device": _json_last(o)["runtime"]["device"],
                "fallbacks": _json_last(o)["runtime"]["fallbacks"],
            },
        )
    smoke.save()
    print(smoke.summary(), flush=True)
    return 0 if all(s.get("rc") == 0 for s in smoke.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
