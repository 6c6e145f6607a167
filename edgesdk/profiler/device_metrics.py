# SPDX-License-Identifier: Apache-2.0
"""Device metrics over time: GPU utilisation, memory, power, energy, temperature, clocks, throttling.

:class:`DeviceReader` reads them now, as a list of components in the shape
:func:`edgesdk.telemetry.device_metrics.register_device_metrics` exports (``hw.*`` names where the semantic
conventions have them, docs/telemetry.md); :class:`DeviceSampler` keeps a time series of them on a thread
while ``profiler run`` measures (the report's ``device_metrics``). :func:`observe` registers the reader's
figures as OpenTelemetry instruments on a meter provider (``serve``'s, or edgesdk's telemetry when it is on).

Sources: NVML for NVIDIA GPUs (nvidia-ml-py, imported when the reader opens); on Jetson the INA3221 rails
(:mod:`.energy`), the GPU's devfreq node and its ``load`` (0-1000), thermal zones; RAPL packages where readable.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from edgesdk.profiler import device_state as ds
from edgesdk.profiler.energy import Ina3221Power, RaplEnergy, SourceUnavailable


class DeviceReader:
    """Opens what can be read here once; :meth:`read` then costs only the reads. :attr:`missing` says, per
    source, why it is not read."""

    def __init__(self, root: str | os.PathLike = "/", *, pynvml: Any = None) -> None:
        self.root = Path(root)
        self.missing: dict[str, str] = {}
        self.nv: Any = None
        self.handles: list[tuple[int, Any, str]] = []
        real = self.root.resolve() == Path("/")
        jetson = ds.is_jetson(self.root)
        if jetson:
            self.missing["nvml"] = "a Jetson's iGPU has no NVML"
        elif pynvml is not None or real:
            self._open_nvml(pynvml)
        else:
            self.missing["nvml"] = "NVML is read on the real root only"
        self.rails: Ina3221Power | None = None
        try:
            self.rails = Ina3221Power(self.root)
        except SourceUnavailable as exc:
            self.missing["ina3221"] = str(exc)
        self.rapl: RaplEnergy | None = None
        try:
            self.rapl = RaplEnergy(self.root)
        except SourceUnavailable as exc:
            self.missing["rapl"] = str(exc)
        self.jetson = jetson

    def _open_nvml(self, pynvml: Any) -> None:
        try:
            nv = pynvml if pynvml is not None else importlib.import_module("pynvml")
        except ImportError:
            self.missing["nvml"] = "nvidia-ml-py (pynvml) is not installed: pip install 'edgesdk[profiler]'"
            return
        try:
            nv.nvmlInit()
            for i in range(int(nv.nvmlDeviceGetCount())):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                self.handles.append((i, h, name.decode() if isinstance(name, bytes) else str(name)))
        except Exception as exc:  # noqa: BLE001 - NVMLError_*: no driver, no GPU
            self.missing["nvml"] = f"NVML did not initialise: {exc}"
            return
        self.nv = nv
        if not self.handles:
            self.missing["nvml"] = "NVML sees no GPU"

    @property
    def available(self) -> list[str]:
        out = ["nvml"] if self.handles else []
        if self.rails is not None:
            out.append("ina3221")
        if self.rapl is not None:
            out.append("rapl")
        if self.jetson:
            out.append("jetson-sysfs")
        return out

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nv = None
            self.handles = []

    def read(self) -> list[dict]:
        """One reading per component: ``{"id", "type", "name", "utilization", "memory_used_bytes",
        "memory_limit_bytes", "power_w", "energy_j", "temperature_c", "clocks_mhz", "throttled", "rails_w"}``;
        a figure that cannot be read is None (or absent)."""
        out: list[dict] = []
        nv = self.nv
        for i, h, name in self.handles:
            util = _try(nv.nvmlDeviceGetUtilizationRates, h)
            mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
            mw = _try(nv.nvmlDeviceGetPowerUsage, h)
            mj = _try(nv.nvmlDeviceGetTotalEnergyConsumption, h)
            mask = _try(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
            if mask is None:
                mask = _try(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            sm = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            memclk = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            out.append(
                {
                    "id": f"gpu{i}",
                    "type": "gpu",
                    "name": name,
                    "utilization": util.gpu / 100 if util is not None else None,
                    "memory_used_bytes": int(mem.used) if mem is not None else None,
                    "memory_limit_bytes": int(mem.total) if mem is not None else None,
                    "power_w": mw / 1000 if mw is not None else None,
                    "energy_j": mj / 1000 if mj is not None else None,
                    "temperature_c": _float(_try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
                    "clocks_mhz": {k: float(v) for k, v in (("sm", sm), ("mem", memclk)) if v is not None} or None,
                    "throttled": bool(ds.decode_reasons(int(mask))[0]) if mask is not None else None,
                }
            )
        if self.jetson:
            gpu = ds.devfreq_gpu(self.root)
            load = None
            if gpu is not None:
                raw = _int_text(self.root / "sys/class/devfreq" / gpu["node"] / "device/load")
                load = raw / 1000 if raw is not None else None
            temps, hot = ds.thermal(self.root)
            module: dict[str, Any] = {
                "id": "jetson-module",
                "type": "enclosure",
                "name": "Jetson module",
                "utilization": load,
                "temperature_c": max(temps.values()) if temps else None,
                "clocks_mhz": {"gpu": gpu["cur_mhz"]} if gpu else None,
                "throttled": bool(hot) if ds.thermal_trips_known(self.root) else None,
            }
            if self.rails is not None:
                try:
                    module["power_w"] = self.rails.read()
                    module["rails_w"] = self.rails.read_rails()
                except SourceUnavailable:
                    module["power_w"] = None
            out.append(module)
        if self.rapl is not None:
            try:
                out.append({"id": "cpu-packages", "type": "cpu", "name": self.rapl.scope, "energy_j": self.rapl.read()})
            except SourceUnavailable:
                pass
        return out


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _int_text(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - not supported on this device: unavailable
        return None


class DeviceSampler:
    """Reads ``reader`` every ``interval_s`` on a thread while a block runs; :meth:`summary` gives the report's
    ``device_metrics`` (the samples, and per component the mean/max of each figure)."""

    def __init__(self, reader: DeviceReader, interval_s: float = 1.0) -> None:
        self.reader = reader
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self.read_s = 0.0  # time spent reading, to report the sampler's own cost

    def _take(self) -> None:
        t = time.perf_counter()
        comps = self.reader.read()
        self.read_s += time.perf_counter() - t
        self.samples.append({"t_s": round(t - self._t0, 4), "components": comps})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> DeviceSampler:
        self._t0 = time.perf_counter()
        self._take()
        self._thread = threading.Thread(target=self._loop, name="edgesdk-device-metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()

    def summary(self) -> dict:
        per: dict[str, dict[str, list[float]]] = {}
        for s in self.samples:
            for c in s["components"]:
                d = per.setdefault(c["id"], {})
                for key in ("utilization", "power_w", "temperature_c", "memory_used_bytes"):
                    if c.get(key) is not None:
                        d.setdefault(key, []).append(float(c[key]))
                if c.get("throttled") is not None:
                    d.setdefault("throttled", []).append(1.0 if c["throttled"] else 0.0)
        stats = {
            cid: {k: {"mean": sum(v) / len(v), "max": max(v)} for k, v in figs.items()} for cid, figs in per.items()
        }
        return {
            "interval_s": self.interval_s,
            "sources": self.reader.available,
            "missing": self.reader.missing,
            "reads": len(self.samples),
            "read_ms_total": self.read_s * 1e3,
            "summary": stats,
            "samples": self.samples,
        }


def observe(meter_provider: Any = None, *, root: str | os.PathLike = "/", reader: DeviceReader | None = None):
    """Register this device's figures as OpenTelemetry instruments on ``meter_provider`` (default: the one
    edgesdk's telemetry records with; nothing when telemetry is off). Returns the handle
    (:class:`edgesdk.telemetry.device_metrics.DeviceMetrics`, ``close()`` stops reporting) or None."""
    from edgesdk.telemetry.device_metrics import register_device_metrics

    reader = reader or DeviceReader(root)
    handle = register_device_metrics(reader.read, meter_provider=meter_provider)
    if handle is None:
        reader.close()
    else:
        handle.on_close(reader.close)
    return handle
