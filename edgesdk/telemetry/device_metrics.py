# SPDX-License-Identifier: Apache-2.0
"""Device metrics as OpenTelemetry instruments (asynchronous: read when the metrics are collected, so they
cost nothing between exports or scrapes).

``register_device_metrics(read, meter_provider=...)`` takes a function that returns the device's components
now (``edgesdk.profiler.device_metrics.DeviceReader.read`` gives them), each a dict::

    {"id": "gpu0", "type": "gpu", "name": "NVIDIA H100 80GB HBM3", "utilization": 0.93,
     "memory_used_bytes": ..., "memory_limit_bytes": ..., "power_w": 412.0, "energy_j": 1.2e6,
     "temperature_c": 61.0, "clocks_mhz": {"sm": 1980.0}, "throttled": False, "rails_w": {"VDD_IN": 8.1}}

and reports them under the hardware semantic conventions where a name exists (semconv 1.41 ``hw.*``,
attributes ``hw.id`` / ``hw.type`` / ``hw.name``), ours under ``edgesdk.device.*`` where none does
(docs/telemetry.md lists both). One read serves every instrument of a collection.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from edgesdk.telemetry import _names as N

# Semantic-convention names (hardware metrics, semconv v1.41.1: model/hardware/*.yaml)
HW_GPU_UTILIZATION = "hw.gpu.utilization"  # gauge, 1
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"  # updowncounter, By
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"  # updowncounter, By
HW_POWER = "hw.power"  # gauge, W
HW_ENERGY = "hw.energy"  # counter, J
HW_TEMPERATURE = "hw.temperature"  # gauge, Cel
HW_ID, HW_TYPE, HW_NAME = "hw.id", "hw.type", "hw.name"
# Ours: no convention covers these.
DEVICE_CLOCK = "edgesdk.device.clock"  # gauge, MHz; attribute edgesdk.device.clock.domain
DEVICE_THROTTLED = "edgesdk.device.throttled"  # gauge, 1 while the clocks are held down, else 0
DEVICE_RAIL_POWER = "edgesdk.device.rail.power"  # gauge, W; attribute edgesdk.device.rail (Jetson INA3221)
CLOCK_DOMAIN = "edgesdk.device.clock.domain"
RAIL = "edgesdk.device.rail"


class DeviceMetrics:
    """The registered instruments' shared state: one cached read per collection, and ``close()`` (the
    OpenTelemetry API cannot unregister a callback: after ``close()`` they report nothing)."""

    def __init__(self, read: Callable[[], list[dict]], max_age_s: float = 0.25) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._at = -1e9
        self._cached: list[dict] = []
        self.max_age_s = max_age_s
        self.closed = False
        self.reads = 0
        self._on_close: list[Callable[[], None]] = []

    def components(self) -> list[dict]:
        if self.closed:
            return []
        with self._lock:
            now = time.monotonic()
            if now - self._at > self.max_age_s:
                try:
                    self._cached = list(self._read())
                except Exception:  # noqa: BLE001 - a sensor gone away reports nothing, never fails the export
                    self._cached = []
                self._at = now
                self.reads += 1
            return self._cached

    def on_close(self, fn: Callable[[], None]) -> None:
        self._on_close.append(fn)

    def close(self) -> None:
        self.closed = True
        for fn in self._on_close:
            fn()
        self._on_close = []

    # -- callbacks
    def _obs(self, key: str, scale: float = 1.0) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(float(c[key]) * scale, _attrs(c)) for c in self.components() if c.get(key) is not None]

        return cb

    def _clocks(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(float(mhz), {**_attrs(c), CLOCK_DOMAIN: domain})
            for c in self.components()
            for domain, mhz in (c.get("clocks_mhz") or {}).items()
            if mhz is not None
        ]

    def _throttled(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(1 if c["throttled"] else 0, _attrs(c))
            for c in self.components()
            if c.get("throttled") is not None
        ]

    def _rails(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(float(w), {**_attrs(c), RAIL: rail})
            for c in self.components()
            for rail, w in (c.get("rails_w") or {}).items()
            if w is not None
        ]


# Every device instrument, in the order they are registered: (kind: the meter's create_observable_<kind>, name,
# reading: a component's field, one value per component, or a DeviceMetrics method observing several, unit,
# description).
INSTRUMENTS: tuple[tuple[str, str, str | Callable[..., Iterable[Observation]], str, str], ...] = (
    ("gauge", HW_GPU_UTILIZATION, "utilization", "1", "Fraction of time the GPU was busy."),
    ("up_down_counter", HW_GPU_MEMORY_USAGE, "memory_used_bytes", "By", "GPU memory used."),
    ("up_down_counter", HW_GPU_MEMORY_LIMIT, "memory_limit_bytes", "By", "GPU memory size."),
    ("gauge", HW_POWER, "power_w", "W", "Instantaneous power of the component."),
    (
        "counter",
        HW_ENERGY,
        "energy_j",
        "J",
        "Energy consumed by the component (NVML: since the driver loaded; RAPL: since first read).",
    ),
    ("gauge", HW_TEMPERATURE, "temperature_c", "Cel", "Hottest sensor of the component."),
    ("gauge", DEVICE_CLOCK, DeviceMetrics._clocks, "MHz", "Current clock of each clock domain."),
    (
        "gauge",
        DEVICE_THROTTLED,
        DeviceMetrics._throttled,
        "1",
        "1 while the clocks are held down (NVML power/thermal slowdown, a zone past its passive trip).",
    ),
    ("gauge", DEVICE_RAIL_POWER, DeviceMetrics._rails, "W", "Power of each Jetson INA3221 rail."),
)
NAMES = tuple(name for _, name, *_ in INSTRUMENTS)


def _attrs(c: dict) -> dict[str, Any]:
    out = {HW_ID: str(c.get("id")), HW_TYPE: str(c.get("type"))}
    if c.get("name"):
        out[HW_NAME] = str(c["name"])
    return out


def register_device_metrics(
    read: Callable[[], list[dict]], *, meter_provider: Any = None, max_age_s: float = 0.25
) -> DeviceMetrics | None:
    """Create the device instruments on ``meter_provider`` (default: the provider edgesdk's telemetry records
    with; None is returned, and nothing registered, when telemetry is off)."""
    if meter_provider is None:
        from edgesdk import telemetry

        if telemetry._tracer() is None:  # telemetry off: no provider to export through
            return None
        meter_provider = telemetry._state.meter_provider or metrics.get_meter_provider()
    meter = meter_provider.get_meter("edgesdk.device", N.SDK_VERSION, schema_url=N.SCHEMA_URL)
    dm = DeviceMetrics(read, max_age_s)
    for kind, name, reading, unit, description in INSTRUMENTS:
        callback = dm._obs(reading) if isinstance(reading, str) else functools.partial(reading, dm)
        getattr(meter, f"create_observable_{kind}")(name, callbacks=[callback], unit=unit, description=description)
    return dm
