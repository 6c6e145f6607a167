# SPDX-License-Identifier: Apache-2.0
"""Energy around a block of work: joules, average watts, tokens (or items) per joule.

Three sources, tried in this order; a source that is missing says why, and nothing is ever guessed:

- ``nvml``: NVIDIA GPUs, ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver loaded; Volta and
  later datacenter parts, H100/H200 included) through nvidia-ml-py's ``pynvml``, imported only when asked for.
  A counter: read at the start and the end. Scope: the GPU board(s), not the host CPU or DRAM.
- ``ina3221``: Jetson modules, the INA3221 monitors of the hwmon driver
  (``/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in[123]_label|in[123]_input (mV)|curr[123]_input (mA)``, the
  kernel's Documentation/hwmon/ina3221.rst), as tegrastats and jetson-stats read them. A power meter: sampled on
  a thread and integrated (trapezoids). Orin NX / Nano name their module input ``VDD_IN``: that rail is the
  total; AGX Orin's monitors have no input rail, so the total is the sum of the monitored rails (said so in
  ``scope``).
- ``rapl``: Intel/AMD RAPL through powercap (``/sys/class/powercap/intel-rapl:N/energy_uj``, packages only, not
  their sub-zones, which the package already counts); a counter that wraps at ``max_energy_range_uj``, polled on
  the thread so a wrap is seen. Usually readable by root only (since Linux 5.10, CVE-2020-8694).

Every reader takes a ``root`` (the file-system root it reads under), so tests run on fixture trees.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgesdk.host import read_under

SOURCES = ("nvml", "ina3221", "rapl")

# Jetson rails that are the module's whole input where the module has one (Orin NX / Nano: tegra234-p3767.dtsi).
INPUT_RAILS = ("VDD_IN",)


class SourceUnavailable(Exception):
    """This energy source cannot be read here; the message says why (one line)."""


# ---------------------------------------------------------------- NVML


def _import_pynvml(module: Any = None) -> Any:
    if module is not None:
        return module
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise SourceUnavailable("nvidia-ml-py (pynvml) is not installed: pip install 'edgesdk[profiler]'") from exc


class NvmlEnergy:
    """Sum of ``nvmlDeviceGetTotalEnergyConsumption`` over the GPUs (all, or ``indices``), in joules."""

    name = "nvml"
    kind = "counter"

    def __init__(self, indices: list[int] | None = None, *, pynvml: Any = None) -> None:
        self.nv = _import_pynvml(pynvml)
        try:
            self.nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_* (no driver, no GPU): the reason is its text
            raise SourceUnavailable(f"NVML did not initialise: {exc}") from exc
        self._open = True
        try:
            count = int(self.nv.nvmlDeviceGetCount())
            wanted = list(range(count)) if indices is None else [i for i in indices if 0 <= i < count]
            if not wanted:
                raise SourceUnavailable(
                    "NVML sees no GPU" if not count else f"no GPU among {indices} ({count} present)"
                )
            self.handles = []
            self.devices = []
            for i in wanted:
                h = self.nv.nvmlDeviceGetHandleByIndex(i)
                name = _text(self.nv.nvmlDeviceGetName(h))
                try:
                    self.nv.nvmlDeviceGetTotalEnergyConsumption(h)
                except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported on GPUs before Volta / consumer parts
                    raise SourceUnavailable(
                        f"GPU {i} ({name}): nvmlDeviceGetTotalEnergyConsumption is not available ({exc})"
                    ) from exc
                self.handles.append(h)
                self.devices.append({"index": i, "name": name})
        except SourceUnavailable:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - an NVMLError_* while listing the GPUs
            self.close()
            raise SourceUnavailable(f"NVML: {exc}") from exc
        self.scope = "GPU board energy of " + ", ".join(f"GPU {d['index']} ({d['name']})" for d in self.devices)
        self.scope += " (NVML); the host CPU and DRAM are not counted"

    def read(self) -> float:
        return sum(self.read_each())

    def read_each(self) -> list[float]:
        try:
            return [float(self.nv.nvmlDeviceGetTotalEnergyConsumption(h)) / 1e3 for h in self.handles]
        except Exception as exc:  # noqa: BLE001 - NVMLError_* mid-run (GPU lost): the figure is unavailable
            raise SourceUnavailable(f"NVML energy counter stopped being readable: {exc}") from exc

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self.nv.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a half-initialised NVML must not fail the caller
                pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------- INA3221 (Jetson)


def ina3221_channels(root: str | os.PathLike = "/") -> list[dict]:
    """Every labelled, enabled INA3221 channel under ``root``: ``{label, device, hwmon, voltage_file,
    current_file}``, in device then channel order. A channel without a label (disabled in the device tree) or
    with ``in<N>_enable`` = 0 is left out."""
    base = Path(root) / "sys/bus/i2c/drivers/ina3221"
    out = []
    for dev in sorted(base.glob("*")):
        for hw in sorted((dev / "hwmon").glob("hwmon*")):
            for n in (1, 2, 3):
                label = read_under(hw, f"in{n}_label")
                if label is None or not label.strip():
                    continue
                enable = read_under(hw, f"in{n}_enable")
                if enable is not None and enable.strip() == "0":
                    continue
                if not (hw / f"in{n}_input").exists() or not (hw / f"curr{n}_input").exists():
                    continue
                out.append(
                    {
                        "label": label.strip(),
                        "device": dev.name,
                        "hwmon": hw.name,
                        "voltage_file": hw / f"in{n}_input",
                        "current_file": hw / f"curr{n}_input",
                    }
                )
    return out


def _int_file(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else None


class Ina3221Power:
    """Module power from the Jetson INA3221 rails: ``VDD_IN`` when the module has that input rail, else the sum
    of every monitored rail. ``read()`` gives watts now; ``read_rails()`` watts per rail."""

    name = "ina3221"
    kind = "power"

    def __init__(self, root: str | os.PathLike = "/") -> None:
        self.root = Path(root)
        chans = ina3221_channels(root)
        if not chans:
            if not (Path(root) / "sys/bus/i2c/drivers/ina3221").is_dir():
                raise SourceUnavailable("no INA3221 driver in sysfs (/sys/bus/i2c/drivers/ina3221: not a Jetson)")
            raise SourceUnavailable("the INA3221 driver lists no labelled channel with in*_input and curr*_input")
        self.channels = chans
        first = self._read_channel(chans[0])
        if first is None:
            raise SourceUnavailable(
                f"INA3221 {chans[0]['label']}: {chans[0]['voltage_file']} or its current is not readable"
            )
        inputs = [c for c in chans if c["label"] in INPUT_RAILS]
        self.total = inputs[:1]
        labels = [c["label"] for c in chans]
        if self.total:
            self.scope = f"Jetson module input rail {self.total[0]['label']} (INA3221); rails: {', '.join(labels)}"
        else:
            self.scope = (
                "sum of the monitored Jetson rails " + " + ".join(labels) + " (INA3221; this module has no "
                "input rail on its monitors, so carrier-board and unmonitored rails are not counted)"
            )

    @staticmethod
    def _read_channel(c: dict) -> float | None:
        mv, ma = _int_file(c["voltage_file"]), _int_file(c["current_file"])
        if mv is None or ma is None:
            return None
        return mv * ma / 1e6  # mV x mA = uW -> W

    def read_rails(self) -> dict[str, float | None]:
        return {c["label"]: self._read_channel(c) for c in self.channels}

    def read(self) -> float:
        chans = self.total or self.channels
        values = [self._read_channel(c) for c in chans]
        if any(v is None for v in values):
            raise SourceUnavailable("an INA3221 rail stopped being readable")
        return float(sum(v for v in values if v is not None))

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- RAPL


def rapl_zones(root: str | os.PathLike = "/") -> list[Path]:
    """Top-level RAPL zones (``intel-rapl:0``, ``intel-rapl:1``: packages), not sub-zones (``intel-rapl:0:0``)."""
    base = Path(root) / "sys/class/powercap"
    return sorted(p for p in base.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name))


class RaplEnergy:
    """Sum of the RAPL package counters in joules, each unwrapped at its ``max_energy_range_uj``."""

    name = "rapl"
    kind = "counter"
    wraps = True

    def __init__(self, root: str | os.PathLike = "/") -> None:
        zones = rapl_zones(root)
        if not zones:
            raise SourceUnavailable("no RAPL zones in sysfs (/sys/class/powercap/intel-rapl:*)")
        self.zones: list[dict[str, Any]] = []
        for z in zones:
            uj = _int_file(z / "energy_uj")
            if uj is None:
                why = (
                    "not readable by this user (root only since Linux 5.10)" if (z / "energy_uj").exists() else "absent"
                )
                raise SourceUnavailable(f"RAPL {z.name}/energy_uj is {why}")
            rng = _int_file(z / "max_energy_range_uj")
            name = (read_under(z, "name") or z.name).strip()
            self.zones.append({"path": z, "name": name, "max_uj": rng, "last": uj, "total_uj": 0})
        self.scope = "CPU package energy (RAPL: " + ", ".join(z["name"] for z in self.zones) + ")"

    def read(self) -> float:
        """Joules counted since this object was made, unwrapped (call at least once per wrap period)."""
        for z in self.zones:
            now = _int_file(z["path"] / "energy_uj")
            if now is None:
                raise SourceUnavailable(f"RAPL {z['path'].name}/energy_uj stopped being readable")
            delta = now - z["last"]
            if delta < 0:  # wrapped: the counter restarts from 0 after max_energy_range_uj
                if not z["max_uj"]:
                    raise SourceUnavailable(f"RAPL {z['path'].name} wrapped and has no max_energy_range_uj")
                delta += z["max_uj"]
            z["total_uj"] += delta
            z["last"] = now
        return sum(z["total_uj"] for z in self.zones) / 1e6

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- choosing a source


def open_source(
    root: str | os.PathLike = "/",
    *,
    prefer: str | None = None,
    pynvml: Any = None,
    gpu_indices: list[int] | None = None,
) -> tuple[Any | None, dict[str, str]]:
    """The first source that reads here (``prefer`` only, when given), and why each one tried did not.

    NVML is only tried on the real root (a fixture tree has no driver), unless a ``pynvml`` stand-in is given."""
    reasons: dict[str, str] = {}
    order = [prefer] if prefer else list(SOURCES)
    for name in order:
        try:
            if name == "nvml":
                if pynvml is None and Path(root).resolve() != Path("/"):
                    raise SourceUnavailable("NVML is read on the real root only")
                return NvmlEnergy(gpu_indices, pynvml=pynvml), reasons
            if name == "ina3221":
                return Ina3221Power(root), reasons
            if name == "rapl":
                return RaplEnergy(root), reasons
            raise SourceUnavailable(f"unknown energy source {name!r} (one of {', '.join(SOURCES)})")
        except SourceUnavailable as exc:
            reasons[name] = str(exc)
    return None, reasons


def unavailable(reasons: dict[str, str]) -> dict:
    """The ``energy`` object of a result taken where no source reads."""
    why = "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no energy source tried"
    return {
        "joules": None,
        "watts": None,
        "seconds": None,
        "source": None,
        "reason": f"no energy source on this machine ({why})",
    }


class EnergyMeter:
    """Joules and average watts around a block::

        with EnergyMeter() as meter:
            generate()
        energy = meter.result(tokens=n_generated)   # {"joules", "watts", "tokens_per_joule", "source", ...}

    A power source (INA3221) is sampled every ``interval_s`` on a thread and integrated; a counter source
    (NVML, RAPL) is read at both ends (RAPL also on the thread, to see its wraps). Where no source reads, the
    result says so (``source: None`` and ``reason``) and the block runs as usual.
    """

    def __init__(
        self,
        source: Any = None,
        *,
        root: str | os.PathLike = "/",
        interval_s: float = 0.05,
        prefer: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.reasons: dict[str, str] = {}
        self._owns = source is None
        if source is None:
            source, self.reasons = open_source(root, prefer=prefer)
        self.source = source
        self.interval_s = interval_s
        self.clock = clock
        self.samples: list[tuple[float, float]] = []  # (t, watts) for power sources
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = self.t1 = 0.0
        self.e0 = self.e1 = 0.0
        self.per_device0: list[float] = []
        self.per_device1: list[float] = []

    # -- sampling
    def _sample(self) -> None:
        src = self.source
        try:
            if src.kind == "power":
                self.samples.append((self.clock(), src.read()))
            else:
                src.read()  # RAPL: keep the unwrapped total current
        except SourceUnavailable as exc:
            self.error = str(exc)
            self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> EnergyMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.samples = []
        src = self.source
        self.t0 = self.clock()
        if src is None:
            return
        try:
            if src.kind == "power":
                self._sample()
            elif hasattr(src, "read_each"):
                self.per_device0 = src.read_each()
                self.e0 = sum(self.per_device0)
            else:
                self.e0 = src.read()
        except SourceUnavailable as exc:
            self.error = str(exc)
            return
        if src.kind == "power" or getattr(src, "wraps", False):
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="edgesdk-energy", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        src = self.source
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.t1 = self.clock()
        if src is None:
            return
        try:
            if self.error:
                pass
            elif src.kind == "power":
                self._sample()
            elif hasattr(src, "read_each"):
                self.per_device1 = src.read_each()
                self.e1 = sum(self.per_device1)
            else:
                self.e1 = src.read()
        except SourceUnavailable as exc:
            self.error = str(exc)
        if self._owns:
            src.close()

    @property
    def running(self) -> bool:
        return self._thread is not None

    # -- the figures
    def joules(self) -> float | None:
        if self.source is None or self.error:
            return None
        if self.source.kind == "power":
            s = self.samples
            if len(s) < 2:
                return None
            return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))
        return self.e1 - self.e0

    def result(self, *, tokens: int | None = None, items: int | None = None) -> dict:
        """The ``energy`` object of a result: ``joules``, ``watts`` (average), ``seconds``, ``tokens_per_joule``
        (with ``tokens``) or ``items_per_joule`` (with ``items``), ``source``, ``scope``, ``method``; or
        ``source: None`` with the ``reason``."""
        if self.source is None:
            out = unavailable(self.reasons)
        elif self.error:
            out = {"joules": None, "watts": None, "seconds": None, "source": None, "reason": self.error}
        else:
            seconds = self.t1 - self.t0
            if self.source.kind == "power" and len(self.samples) >= 2:
                seconds = self.samples[-1][0] - self.samples[0][0]  # the span the integral covers
            joules = self.joules()
            out = {
                "joules": joules,
                "watts": joules / seconds if joules is not None and seconds > 0 else None,
                "seconds": seconds,
                "source": self.source.name,
                "scope": self.source.scope,
                "method": self._method(),
                "reason": None,
                # the block's start and end on this process's perf_counter clock, to line other samplers up
                # with it (tools/bench/energy_check.py integrates nvidia-smi's power.draw over the same window)
                "clock_window_s": [self.t0, self.t1],
            }
            if joules is None:
                out["source"] = None
                out["reason"] = f"{self.source.name}: the block was shorter than one sample ({self.interval_s} s)"
            if self.per_device0 and self.per_device1:
                out["per_device_joules"] = [b - a for a, b in zip(self.per_device0, self.per_device1)]
            if self.source.kind == "power":
                out["samples"] = len(self.samples)
        j = out.get("joules")
        if tokens is not None:
            out["tokens"] = tokens
            out["tokens_per_joule"] = tokens / j if j else None
            out["joules_per_token"] = j / tokens if j is not None and tokens else None
        if items is not None:
            out["items"] = items
            out["items_per_joule"] = items / j if j else None
            out["joules_per_item"] = j / items if j is not None and items else None
        return out

    def _method(self) -> str:
        src = self.source
        if src.name == "nvml":
            return "nvmlDeviceGetTotalEnergyConsumption (mJ counter) read before and after the block"
        if src.name == "rapl":
            return (
                f"powercap energy_uj read before and after, polled every {self.interval_s:g} s to unwrap at "
                "max_energy_range_uj"
            )
        return f"INA3221 bus voltage x current sampled every {self.interval_s:g} s, integrated by trapezoids"


def measure(fn: Callable[[], Any], **meter_kw: Any) -> tuple[Any, EnergyMeter]:
    """Run ``fn()`` inside an :class:`EnergyMeter`; returns ``(fn's result, the meter)``."""
    with EnergyMeter(**meter_kw) as meter:
        value = fn()
    return value, meter
