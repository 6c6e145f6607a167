# SPDX-License-Identifier: Apache-2.0
"""Sensors and tool output: files under a root, nvpmodel/tegrastats parsing, device state during a run.

Everything unreadable is ``None`` (unavailable), never zero: a missing thermal zone is not 0 degC.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

from edgesdk import host
from edgesdk.host import read_under


def parse_nvpmodel(text: str) -> dict | None:
    """``nvpmodel -q`` prints ``NV Power Mode: 15W`` then the mode id."""
    m = re.search(r"NV Power Mode:\s*(\S+)", text or "")
    if not m:
        return None
    mode_id = re.search(r"^\s*(\d+)\s*$", text[m.end() :], re.M)
    return {"mode": m.group(1), "id": int(mode_id.group(1)) if mode_id else None}


def parse_tegrastats(line: str) -> dict:
    """One tegrastats line -> RAM, EMC/GR3D load and clock, temperatures, power rails (mW)."""
    out: dict[str, Any] = {}
    if m := re.search(r"RAM (\d+)/(\d+)MB", line):
        out["ram_used_mb"], out["ram_total_mb"] = int(m.group(1)), int(m.group(2))
    for name in ("EMC_FREQ", "GR3D_FREQ"):
        if m := re.search(name + r" (\d+)%(?:@\[?(\d+)\]?)?", line):
            out[name.lower()] = {"load_pct": int(m.group(1)), "mhz": int(m.group(2)) if m.group(2) else None}
    temps = {k.lower(): float(v) for k, v in re.findall(r"\b([A-Za-z0-9_]+)@(-?[\d.]+)C\b", line)}
    if temps:
        out["temperatures_c"] = temps
    rails = {k: int(v) for k, v in re.findall(r"\b([A-Z][A-Z0-9_]+) (\d+)mW/\d+mW", line)}
    if rails:
        out["power_mw"] = rails
    return out


def run_tool(argv: list[str], timeout: float = 3.0) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def tegrastats_sample(timeout: float = 3.0) -> str | None:
    """tegrastats never exits on its own: read its first line and stop it."""
    if not shutil.which("tegrastats"):
        return None
    try:
        proc = subprocess.Popen(["tegrastats", "--interval", "200"], stdout=subprocess.PIPE, text=True)
    except OSError:
        return None
    out = proc.stdout  # the pipe (stdout=PIPE)
    try:
        if out is None:
            return None
        ready, _, _ = select.select([out], [], [], timeout)
        return (out.readline() or None) if ready else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------- device state during a measurement


def read_device_state(root: str | os.PathLike = "/") -> dict:
    """Governor, clocks, temperatures and power mode now; each unreadable item is None (unavailable)."""
    root = Path(root)
    gov = read_under(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    freq = read_under(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq")
    temps: dict[str, float] = {}
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        t, kind = read_under(zone, "temp"), read_under(zone, "type")
        if t and t.strip().lstrip("-").isdigit():
            temps[(kind or zone.name).strip()] = int(t) / 1000
    state: dict[str, Any] = {
        "cpu_governor": gov.strip() if gov else None,
        "cpu0_mhz": round(int(freq) / 1000) if freq and freq.strip().isdigit() else None,
        "temperatures_c": temps or None,
        "gpus": _nvml_state() if root.resolve() == Path("/") else None,
        "jetson": None,
    }
    if root.resolve() == Path("/") and host.probe().is_jetson:
        sample = tegrastats_sample()
        state["jetson"] = {
            "nvpmodel": parse_nvpmodel(run_tool(["nvpmodel", "-q"]) or ""),
            "tegrastats": parse_tegrastats(sample) if sample else None,
        }
    return state


def _nvml_state() -> list[dict] | None:
    with host.nvml() as pynvml:
        if pynvml is None:  # no NVML here: state is unavailable, not zero
            return None
        return _nvml_readings(pynvml)


def _nvml_readings(pynvml: Any) -> list[dict]:
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out.append(
            {
                "index": i,
                "sm_clock_mhz": _nvml_try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": _nvml_try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
                "temperature_c": _nvml_try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                "power_w": (lambda mw: mw / 1000 if mw is not None else None)(
                    _nvml_try(pynvml.nvmlDeviceGetPowerUsage, h)
                ),
                "memory_used_gb": (lambda m: round(m.used / 1e9, 3) if m is not None else None)(
                    _nvml_try(pynvml.nvmlDeviceGetMemoryInfo, h)
                ),
            }
        )
    return out


def _nvml_try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - sensor not supported on this GPU: unavailable
        return None
