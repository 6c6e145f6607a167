# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for benchmarks: run a command and record wall time + peak RSS of its process tree."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Wall seconds and peak RSS (GB) of ``cmd``, measured in a fresh wrapper so RUSAGE_CHILDREN is its own."""
    wrapper = (
        "import resource,subprocess,sys,time,json;t=time.perf_counter();"
        "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE);"
        "w=time.perf_counter()-t;"
        "print(json.dumps({'rc':r.returncode,'wall_s':w,"
        "'peak_rss_gb':resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1048576,"
        "'stderr':r.stderr.decode(errors='replace')[-400:]}))"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def machine() -> dict:
    import os

    return {
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
