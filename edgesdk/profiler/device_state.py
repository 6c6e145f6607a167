# SPDX-License-Identifier: Apache-2.0
"""The device state a result was taken under: power mode, clocks and whether they are locked, temperature,
throttling. Each figure is ``None`` with its reason in ``reasons`` where it cannot be read, never a guess.

Where each comes from (docs/profiler.md, "Device state"):

- **power mode**: Jetson: ``nvpmodel -q`` on the real root; else the mode nvpmodel saved,
  ``/var/lib/nvpmodel/status`` (``pmode:0002``), named by ``/etc/nvpmodel.conf``'s ``< POWER_MODEL ID=2 NAME=... >``.
  NVIDIA GPUs: the enforced power limit (``nvmlDeviceGetEnforcedPowerLimit``, what ``nvidia-smi -pl`` sets).
  Other hosts: the cpufreq governor.
- **clocks**: Jetson GPU through devfreq (``/sys/class/devfreq/*gpu*/cur_freq``), CPUs through cpufreq
  (``scaling_cur_freq``); NVIDIA GPUs through NVML (SM and memory clocks). **Locked**: a devfreq/cpufreq domain
  whose minimum equals its maximum (``jetson_clocks`` raises the minimums to the maximums); on NVML, application
  clocks set away from their default.
- **temperature**: the hottest thermal zone, or the hottest GPU (NVML).
- **throttling**: NVML's clocks-event (throttle) reasons; on Jetson and CPU hosts a thermal zone at or above its
  first ``passive`` trip point, and on x86 a ``thermal_throttle`` count that rose between two snapshots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.host import read_under

FIELDS = ("power_mode", "clocks_mhz", "clocks_locked", "temperature_c", "throttling")

# nvml.h clocks-event (formerly throttle) reason bits that mean the clocks were held down (nvidia-ml-py's
# nvmlClocksEventReason* / nvmlClocksThrottleReason* constants). GpuIdle, ApplicationsClocksSetting, SyncBoost
# and DisplayClockSetting are not throttling.
NVML_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
NVML_OTHER_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x10: "sync_boost", 0x100: "display_clock"}


def _is_real_root(root: Path) -> bool:
    return root.resolve() == Path("/")


def is_jetson(root: Path) -> bool:
    if (root / "etc/nv_tegra_release").exists():
        return True
    compat = read_under(root, "proc/device-tree/compatible") or ""
    return "nvidia,tegra" in compat


# ---------------------------------------------------------------- Jetson power mode


def parse_nvpmodel_conf(text: str) -> dict[int, str]:
    """``< POWER_MODEL ID=0 NAME=15W >`` lines of /etc/nvpmodel.conf -> {0: "15W"}."""
    return {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", text or "")}


def jetson_power_mode(root: Path, run_tool: Callable[[list[str]], str | None] | None) -> tuple[dict | None, str]:
    """``({"mode", "id", "source"}, "")`` or ``(None, reason)``."""
    if run_tool is not None:
        from edgesdk.profiler.sensors import parse_nvpmodel

        out = run_tool(["nvpmodel", "-q"])
        parsed = parse_nvpmodel(out or "")
        if parsed:
            return {**parsed, "source": "nvpmodel -q"}, ""
    status = read_under(root, "var/lib/nvpmodel/status")
    if status is None:
        return None, "nvpmodel -q gave nothing and /var/lib/nvpmodel/status is absent"
    m = re.search(r"pmode:\s*(\d+)", status)
    if not m:
        return None, f"/var/lib/nvpmodel/status holds no pmode ({status.strip()[:40]!r})"
    mode_id = int(m.group(1))
    names = parse_nvpmodel_conf(read_under(root, "etc/nvpmodel.conf") or "")
    if mode_id not in names:
        return {"mode": None, "id": mode_id, "source": "/var/lib/nvpmodel/status"}, (
            f"mode id {mode_id} is not named in /etc/nvpmodel.conf"
        )
    return {"mode": names[mode_id], "id": mode_id, "source": "/var/lib/nvpmodel/status + /etc/nvpmodel.conf"}, ""


# ---------------------------------------------------------------- sysfs clocks and temperatures


def _int(root: Path, rel: str) -> int | None:
    text = read_under(root, rel)
    if text is None:
        return None
    text = text.strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def devfreq_gpu(root: Path) -> dict | None:
    """The Jetson GPU's devfreq node (``17000000.gpu`` on JetPack 6, ``17000000.ga10b`` on JetPack 5)."""
    for node in sorted((root / "sys/class/devfreq").glob("*")):
        if "gpu" in node.name or "ga10b" in node.name:
            cur, lo, hi = _int(node, "cur_freq"), _int(node, "min_freq"), _int(node, "max_freq")
            if cur is None:
                continue
            return {"node": node.name, "cur_mhz": cur / 1e6, "min_mhz": _mhz(lo, 1e6), "max_mhz": _mhz(hi, 1e6)}
    return None


def _mhz(v: int | None, div: float) -> float | None:
    return None if v is None else v / div


def cpufreq(root: Path) -> dict | None:
    """cpu0's current clock and whether every online CPU's min equals its max."""
    cpus = sorted(
        (root / "sys/devices/system/cpu").glob("cpu[0-9]*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)
    )
    first = None
    locked: list[bool] = []
    for cpu in cpus:
        cur = _int(cpu, "cpufreq/scaling_cur_freq")
        if cur is None:
            continue
        lo, hi = _int(cpu, "cpufreq/scaling_min_freq"), _int(cpu, "cpufreq/scaling_max_freq")
        if first is None:
            first = {"cpu": cpu.name, "cur_mhz": cur / 1e3, "min_mhz": _mhz(lo, 1e3), "max_mhz": _mhz(hi, 1e3)}
        if lo is not None and hi is not None:
            locked.append(lo == hi)
    if first is None:
        return None
    first["locked"] = all(locked) if locked else None
    gov = read_under(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    first["governor"] = gov.strip() if gov else None
    return first


def thermal(root: Path) -> tuple[dict[str, float], list[str]]:
    """Every thermal zone's temperature (degC) and the zones at or above their first passive trip point."""
    temps: dict[str, float] = {}
    hot: list[str] = []
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        t = _int(zone, "temp")
        if t is None:
            continue
        name = (read_under(zone, "type") or zone.name).strip()
        temps[name] = t / 1000
        for i in range(16):
            kind = read_under(zone, f"trip_point_{i}_type")
            if kind is None:
                break
            if kind.strip() == "passive":
                trip = _int(zone, f"trip_point_{i}_temp")
                if trip is not None and t >= trip:
                    hot.append(f"{name} {t / 1000:g} C >= passive trip {trip / 1000:g} C")
                break
    return temps, hot


def thermal_trips_known(root: Path) -> bool:
    return any((z / "trip_point_0_type").exists() for z in (root / "sys/class/thermal").glob("thermal_zone*"))


def x86_throttle_count(root: Path) -> int | None:
    """Sum of the package and core thermal-throttle event counts (Intel; absent elsewhere)."""
    total, seen = 0, False
    for f in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/thermal_throttle/*_throttle_count"):
        v = _int(f.parent, f.name)
        if v is not None:
            total, seen = total + v, True
    return total if seen else None


# ---------------------------------------------------------------- NVML


def nvml_state(pynvml: Any) -> tuple[list[dict] | None, str]:
    """Per GPU: clocks, application clocks, temperature, power limit, clocks-event reasons."""
    nv = pynvml
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_*: no driver / no GPU
        return None, f"NVML did not initialise: {exc}"
    try:
        gpus = []
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": _text_or_none(_try(nv.nvmlDeviceGetName, h))}
            g["sm_mhz"] = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            g["mem_mhz"] = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            g["app_sm_mhz"] = _try(nv.nvmlDeviceGetClock, h, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_ID_APP_CLOCK_TARGET)
            g["default_app_sm_mhz"] = _try(
                nv.nvmlDeviceGetClock, h, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_ID_APP_CLOCK_DEFAULT
            )
            g["temperature_c"] = _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            limit = _try(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            g["power_limit_w"] = limit / 1000 if limit is not None else None
            reasons = _try(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
            if reasons is None:
                reasons = _try(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            g["clocks_event_reasons"] = reasons
            gpus.append(g)
        return gpus, ""
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def decode_reasons(mask: int) -> tuple[list[str], list[str]]:
    """(throttling reasons, other reasons) named from an NVML clocks-event bit mask."""
    throttle = [name for bit, name in NVML_THROTTLE_BITS.items() if mask & bit]
    other = [name for bit, name in NVML_OTHER_BITS.items() if mask & bit]
    return throttle, other


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - not supported on this GPU: unavailable
        return None


def _text_or_none(v: Any) -> str | None:
    return None if v is None else _text(v)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _load_pynvml() -> tuple[Any | None, str]:
    import importlib

    try:
        return importlib.import_module("pynvml"), ""
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed: pip install 'edgesdk[profiler]'"


# ---------------------------------------------------------------- the snapshot


def snapshot(
    root: str | os.PathLike = "/",
    *,
    pynvml: Any = None,
    run_tool: Callable[[list[str]], str | None] | None = None,
    use_nvml: bool | None = None,
) -> dict:
    """The device state now: the five fields of :data:`FIELDS`, ``reasons`` for each one that is None, and the
    readings behind them (``jetson``, ``gpus``, ``cpu``, ``temperatures_c``). ``run_tool`` runs ``nvpmodel``;
    by default only on the real root. NVML is read on the real root (or with a ``pynvml`` stand-in)."""
    root = Path(root)
    real = _is_real_root(root)
    if run_tool is None and real:
        from edgesdk.profiler.sensors import run_tool as default_run_tool

        run_tool = default_run_tool
    state: dict[str, Any] = {f: None for f in FIELDS}
    reasons: dict[str, str] = {}
    sources: dict[str, str] = {}
    jetson = is_jetson(root)
    state["kind"] = "jetson" if jetson else "host"

    # NVIDIA GPUs (discrete; Jetson's iGPU has no NVML)
    gpus: list[dict] | None = None
    nvml_reason = ""
    if use_nvml is None:
        use_nvml = (real or pynvml is not None) and not jetson
    if use_nvml:
        nv, nvml_reason = (pynvml, "") if pynvml is not None else _load_pynvml()
        if nv is not None:
            gpus, nvml_reason = nvml_state(nv)
    else:
        nvml_reason = "NVML is not read on a Jetson or a fixture root"
    if gpus is not None and not gpus:
        gpus, nvml_reason = None, "NVML sees no GPU"
    state["gpus"] = gpus

    cpu = cpufreq(root)
    temps, hot = thermal(root)
    state["cpu"] = cpu
    state["temperatures_c"] = temps or None
    state["throttle_count"] = x86_throttle_count(root)

    # power mode
    if jetson:
        pm, why = jetson_power_mode(root, run_tool)
        state["jetson"] = {"nvpmodel": pm, "gpu_devfreq": devfreq_gpu(root)}
        if pm and pm.get("mode"):
            state["power_mode"] = pm["mode"]
            sources["power_mode"] = pm["source"]
        else:
            reasons["power_mode"] = why or "nvpmodel reported no mode"
    else:
        state["jetson"] = None
        limits = sorted({g["power_limit_w"] for g in gpus or [] if g.get("power_limit_w") is not None})
        if limits:
            state["power_mode"] = "power limit " + "/".join(f"{w:g} W" for w in limits)
            sources["power_mode"] = "nvmlDeviceGetEnforcedPowerLimit"
        elif cpu and cpu.get("governor"):
            state["power_mode"] = f"cpufreq governor {cpu['governor']}"
            sources["power_mode"] = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
        else:
            reasons["power_mode"] = (
                "no nvpmodel (not a Jetson), no NVML power limit"
                + (f" ({nvml_reason})" if nvml_reason else "")
                + " and no cpufreq governor"
            )

    # clocks
    clocks: dict[str, float] = {}
    locked: list[bool] = []
    lock_why: list[str] = []
    if jetson and state["jetson"]["gpu_devfreq"]:
        d = state["jetson"]["gpu_devfreq"]
        clocks["gpu"] = d["cur_mhz"]
        if d["min_mhz"] is not None and d["max_mhz"] is not None:
            locked.append(d["min_mhz"] == d["max_mhz"])
    for g in gpus or []:
        if g.get("sm_mhz") is not None:
            clocks[f"gpu{g['index']}_sm"] = float(g["sm_mhz"])
        if g.get("mem_mhz") is not None:
            clocks[f"gpu{g['index']}_mem"] = float(g["mem_mhz"])
        app, default = g.get("app_sm_mhz"), g.get("default_app_sm_mhz")
        if app is not None and default is not None and app != default:
            locked.append(True)
        else:
            lock_why.append(
                f"GPU {g['index']}: application clocks at their default; locked clocks (nvidia-smi -lgc) "
                "cannot be read back through NVML"
            )
    if cpu:
        clocks["cpu"] = cpu["cur_mhz"]
        if cpu.get("locked") is not None:
            locked.append(bool(cpu["locked"]))
    state["clocks_mhz"] = clocks or None
    if not clocks:
        reasons["clocks_mhz"] = "no devfreq/cpufreq clock in sysfs" + (f" and {nvml_reason}" if nvml_reason else "")
    if any(not x for x in locked):
        state["clocks_locked"] = False  # one domain free to move is enough to say the clocks are not locked
    elif locked and not lock_why:
        state["clocks_locked"] = True
    else:
        reasons["clocks_locked"] = "; ".join(lock_why) or "no min/max clock limits readable"
    if state["clocks_locked"] is not None:
        sources["clocks_locked"] = "min == max frequency of every devfreq/cpufreq domain" + (
            "; NVML application clocks" if gpus else ""
        )

    # temperature: the hottest sensor
    candidates = [float(v) for v in temps.values()]
    candidates += [float(g["temperature_c"]) for g in gpus or [] if g.get("temperature_c") is not None]
    state["temperature_c"] = max(candidates) if candidates else None
    if state["temperature_c"] is None:
        reasons["temperature_c"] = "no thermal zone in sysfs" + (f" and {nvml_reason}" if nvml_reason else "")

    # throttling
    throttle: list[str] = []
    decided = False
    for g in gpus or []:
        mask = g.get("clocks_event_reasons")
        if mask is None:
            continue
        decided = True
        t, _other = decode_reasons(int(mask))
        throttle += [f"GPU {g['index']}: {r}" for r in t]
    if temps and thermal_trips_known(root):
        decided = True
        throttle += hot
    state["throttle_reasons"] = throttle
    if decided:
        state["throttling"] = bool(throttle)
    else:
        reasons["throttling"] = "no NVML clocks-event reasons and no thermal trip points readable" + (
            f" ({nvml_reason})" if nvml_reason else ""
        )
    state["reasons"] = reasons
    state["sources"] = sources
    return state


def during(before: dict, after: dict) -> dict:
    """The ``device_state`` of a result from snapshots taken before and after it: the five fields as measured
    after the run (power mode as before it, and a note when it changed), throttling if either snapshot shows it
    or the x86 throttle count rose, ``flagged`` naming what is wrong, and both snapshots."""
    out: dict[str, Any] = {f: after.get(f) for f in FIELDS}
    reasons = dict(after.get("reasons") or {})
    notes: list[str] = []
    out["power_mode"] = before.get("power_mode")
    if before.get("power_mode") is None:
        reasons["power_mode"] = (before.get("reasons") or {}).get("power_mode", "unknown")
    else:
        reasons.pop("power_mode", None)
    if before.get("power_mode") != after.get("power_mode"):
        notes.append(f"power mode changed during the run: {before.get('power_mode')} -> {after.get('power_mode')}")
    why = list(before.get("throttle_reasons") or []) + [
        r for r in after.get("throttle_reasons") or [] if r not in (before.get("throttle_reasons") or [])
    ]
    c0, c1 = before.get("throttle_count"), after.get("throttle_count")
    if c0 is not None and c1 is not None and c1 > c0:
        why.append(f"CPU thermal-throttle events rose by {c1 - c0} during the run")
    if why:
        out["throttling"] = True
        reasons.pop("throttling", None)
    elif before.get("throttling") is False and after.get("throttling") is False:
        out["throttling"] = False
    out["throttle_reasons"] = why
    out["reasons"] = {k: v for k, v in reasons.items() if out.get(k) is None}
    out["sources"] = after.get("sources") or {}
    flagged = []
    if out["throttling"]:
        flagged.append("taken while throttling: " + "; ".join(why))
    flagged += notes
    out["flagged"] = flagged or None
    out["before"] = before
    out["after"] = after
    return out
