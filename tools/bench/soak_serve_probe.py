# SPDX-License-Identifier: Apache-2.0
"""Where does `edgesdk serve`'s RSS go between soak rounds? (issue 25: the --parallel 1 swings)

Runs `edgesdk serve BUNDLE` inside this script (``--wrapped``) with a SIGUSR1 handler that records the
server's RSS and RssAnon, then runs ``gc.collect()`` and records them again, then glibc's
``malloc_trim(0)`` and records them again. The driver sends the mixed requests of soak_serve_llm.py
(``--slow-clients`` mix) and signals the server 2 s after the warm-up and after each round.

    python tools/bench/soak_serve_probe.py BUNDLE --parallel 1 --warmup 300 --requests 400 --rounds 3

Writes tools/bench/results/soak_serve_probe_cpu.json (--out to change).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402
from bench_serve import free_port  # noqa: E402
from soak_serve_llm import wave  # noqa: E402


def _rss() -> tuple[float, float]:
    text = Path("/proc/self/status").read_text()
    return tuple(
        int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr,return-value]
        for k in ("VmRSS", "RssAnon")
    )


def wrapped(log: str, serve_args: list[str]) -> None:
    libc = ctypes.CDLL("libc.so.6")

    def probe(_signum, _frame) -> None:
        before = _rss()
        collected = gc.collect()
        after_gc = _rss()
        libc.malloc_trim(0)
        after_trim = _rss()
        with open(log, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "rss_anon_mb": before,
                        "gc_objects": collected,
                        "after_gc": after_gc,
                        "after_malloc_trim": after_trim,
                    }
                )
                + "\n"
            )

    signal.signal(signal.SIGUSR1, probe)
    from edgesdk.cli import main

    sys.argv = ["edgesdk", "serve", *serve_args]
    main()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--wrapped":
        wrapped(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "soak_serve_probe_cpu.json"))
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(args.out).with_suffix(".probe.jsonl")
    log.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--wrapped",
            str(log),
            args.bundle,
            "--name",
            "m",
            "--port",
            str(port),
            "--threads",
            "2",
            "--log-level",
            "warning",
            "--max-queue",
            str(4 * args.concurrency),
            "--parallel",
            str(args.parallel),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        for r in range(args.rounds + 1):
            asyncio.run(wave(url, args.warmup if r == 0 else args.requests, args.concurrency, 1 + 100 * r, True))
            time.sleep(2.0)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(3.0)
            print(f"{'warm-up' if r == 0 else f'round {r}'}: {log.read_text().splitlines()[-1]}", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    probes = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    out = {
        "what": "edgesdk serve RSS/RssAnon (MB) after warm-up and each round: as is, after gc.collect(), "
        "after malloc_trim(0)",
        "bundle": Path(args.bundle).name,
        "machine": machine(),
        "settings": vars(args),
        "probes": probes,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
