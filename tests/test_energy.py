# SPDX-License-Identifier: Apache-2.0
"""Energy sources (NVML counter, Jetson INA3221 rails, RAPL) and the meter around a block; the device-metrics
reader and its OpenTelemetry instruments. Jetson trees: tests/fixtures/jetson/<profile>/ (README there)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgesdk.profiler import energy
from edgesdk.profiler.device_metrics import DeviceReader, DeviceSampler
from edgesdk.profiler.energy import EnergyMeter, Ina3221Power, NvmlEnergy, RaplEnergy, SourceUnavailable

FIXTURES = Path(__file__).parent / "fixtures" / "jetson"
JETSON_PROFILES = sorted(p.stem for p in (Path(__file__).parents[1] / "profiles").glob("orin-*.yaml"))


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeNvml:
    """pynvml's names, counters we control. ``energy_mj`` per GPU; ``supported`` False = NotSupported."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_CLOCK_ID_APP_CLOCK_TARGET, NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 1, 2

    class NVMLError(Exception):
        pass

    def __init__(self, energy_mj=(1000, 5000), supported=True, names=("NVIDIA H100 80GB HBM3",) * 2) -> None:
        self.energy_mj = list(energy_mj)
        self.supported = supported
        self.names = list(names)
        self.inited = 0
        self.shutdowns = 0
        self.throttle = 0
        self.app_clock = 1980

    def nvmlInit(self):  # noqa: N802
        self.inited += 1

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.energy_mj)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self.names[h].encode()

    def nvmlDeviceGetTotalEnergyConsumption(self, h):  # noqa: N802
        if not self.supported:
            raise self.NVMLError("Not Supported")
        return self.energy_mj[h]

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return 412_000

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return type("U", (), {"gpu": 93, "memory": 40})()

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return type("M", (), {"total": 80 * 2**30, "used": 10 * 2**30, "free": 70 * 2**30})()

    def nvmlDeviceGetTemperature(self, h, kind):  # noqa: N802
        return 61

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return 1980 if kind == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetClock(self, h, kind, clock_id):  # noqa: N802
        return self.app_clock if clock_id == self.NVML_CLOCK_ID_APP_CLOCK_TARGET else 1980

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802
        return self.throttle


# ---------------------------------------------------------------- NVML


def test_nvml_energy_is_the_counter_difference_summed_over_gpus():
    nv = FakeNvml(energy_mj=(1_000, 5_000))
    clock = FakeClock()
    meter = EnergyMeter(NvmlEnergy(pynvml=nv), clock=clock)
    meter.start()
    nv.energy_mj = [1_000 + 30_000, 5_000 + 10_000]  # 30 J and 10 J
    clock.t = 2.0
    meter.stop()
    out = meter.result(tokens=200)
    assert out["source"] == "nvml" and out["reason"] is None
    assert out["joules"] == pytest.approx(40.0)
    assert out["watts"] == pytest.approx(20.0)
    assert out["per_device_joules"] == pytest.approx([30.0, 10.0])
    assert out["tokens_per_joule"] == pytest.approx(5.0) and out["joules_per_token"] == pytest.approx(0.2)
    assert "GPU 0 (NVIDIA H100 80GB HBM3)" in out["scope"]


def test_nvml_without_the_energy_counter_is_said_not_guessed():
    with pytest.raises(SourceUnavailable, match="nvmlDeviceGetTotalEnergyConsumption is not available"):
        NvmlEnergy(pynvml=FakeNvml(supported=False))
    src, reasons = energy.open_source("/", prefer="nvml", pynvml=FakeNvml(supported=False))
    assert src is None and "Not Supported" in reasons["nvml"]


def test_missing_pynvml_names_the_extra(monkeypatch):
    import importlib

    real = importlib.import_module

    def fake(name, *a, **k):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(SourceUnavailable, match=r"pip install 'edgesdk\[profiler\]'"):
        NvmlEnergy()


def test_no_source_gives_source_null_with_every_reason(tmp_path):
    meter = EnergyMeter(root=tmp_path)  # an empty tree: no Jetson rails, no RAPL; NVML not read off the real root
    with meter:
        pass
    out = meter.result(items=8)
    assert out["source"] is None and out["joules"] is None and out["items_per_joule"] is None
    for name in ("nvml", "ina3221", "rapl"):
        assert f"{name}:" in out["reason"]


# ---------------------------------------------------------------- Jetson INA3221


@pytest.mark.parametrize("profile", JETSON_PROFILES)
def test_every_jetson_profile_has_a_fixture_tree_whose_rails_read(profile):
    root = FIXTURES / profile
    assert root.is_dir(), f"no fixture tree for {profile}"
    src = Ina3221Power(root)
    rails = src.read_rails()
    if "nano" in profile or "nx" in profile:  # p3767 modules: VDD_IN is the module input (tegra234-p3767.dtsi)
        assert list(rails) == ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
        assert src.read() == pytest.approx(rails["VDD_IN"])
        assert src.scope.startswith("Jetson module input rail VDD_IN")
    else:  # p3701 (AGX): no input rail; two monitors, 0x41 with channels 1 and 3 disabled (tegra234-p3701.dtsi)
        assert list(rails) == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
        assert src.read() == pytest.approx(sum(rails.values()))
        assert "sum of the monitored Jetson rails" in src.scope
    assert all(w > 0 for w in rails.values())


def test_ina3221_watts_are_millivolts_times_milliamps(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "orin-nano-8gb", root)
    hw = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    (hw / "in1_input").write_text("5000\n")
    (hw / "curr1_input").write_text("2000\n")
    assert Ina3221Power(root).read() == pytest.approx(10.0)


def test_ina3221_meter_integrates_sampled_power(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "orin-nx-16gb", root)
    hw = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    (hw / "in1_input").write_text("5000\n")
    (hw / "curr1_input").write_text("2000\n")  # 10 W
    clock = FakeClock()
    meter = EnergyMeter(Ina3221Power(root), clock=clock, interval_s=3600)  # the thread never fires: ends only
    meter.start()
    clock.t = 1.0
    (hw / "curr1_input").write_text("4000\n")  # 20 W at the end
    clock.t = 2.0
    meter.stop()
    out = meter.result(tokens=30)
    # trapezoid between the two end samples: (10 + 20) / 2 W x 2 s
    assert out["joules"] == pytest.approx(30.0)
    assert out["watts"] == pytest.approx(15.0) and out["tokens_per_joule"] == pytest.approx(1.0)
    assert out["source"] == "ina3221" and out["samples"] == 2


def test_ina3221_sampling_thread_runs(tmp_path):
    meter = EnergyMeter(root=FIXTURES / "orin-nano-8gb", interval_s=0.01)
    with meter:
        import time

        time.sleep(0.1)
    out = meter.result()
    assert out["source"] == "ina3221" and out["samples"] >= 3
    assert out["watts"] == pytest.approx(Ina3221Power(FIXTURES / "orin-nano-8gb").read(), rel=1e-6)


def test_disabled_and_unlabelled_channels_are_left_out():
    names = [c["label"] for c in energy.ina3221_channels(FIXTURES / "orin-agx-64gb")]
    assert names.count("VDDQ_VDD2_1V8AO") == 1 and len(names) == 4


# ---------------------------------------------------------------- RAPL


def _rapl(root: Path, uj: int, max_uj: int = 262_143_328_850, zone: str = "intel-rapl:0") -> Path:
    z = root / "sys/class/powercap" / zone
    z.mkdir(parents=True, exist_ok=True)
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (z / "name").write_text("package-0\n")
    return z


def test_rapl_counts_packages_not_subzones_and_unwraps(tmp_path):
    z = _rapl(tmp_path, 999_000_000, max_uj=1_000_000_000)
    sub = _rapl(tmp_path, 5, zone="intel-rapl:0:0")  # core sub-zone: already inside the package
    src = RaplEnergy(tmp_path)
    assert [x["name"] for x in src.zones] == ["package-0"]
    meter = EnergyMeter(src, interval_s=3600)
    meter.start()
    (z / "energy_uj").write_text("4000000\n")  # wrapped: 1 J to the top, then 4 J
    (sub / "energy_uj").write_text("9999999\n")
    meter.stop()
    assert meter.result()["joules"] == pytest.approx(5.0)
    assert meter.result()["source"] == "rapl"


def test_rapl_not_readable_is_said(tmp_path):
    z = _rapl(tmp_path, 1)
    (z / "energy_uj").write_text("")  # as unreadable as root-only: no number
    with pytest.raises(SourceUnavailable, match="intel-rapl:0/energy_uj"):
        RaplEnergy(tmp_path)


# ---------------------------------------------------------------- device metrics and OpenTelemetry


def test_device_reader_on_a_gpu_host_and_a_jetson():
    gpu = DeviceReader("/", pynvml=FakeNvml()).read()
    assert [c["id"] for c in gpu] == ["gpu0", "gpu1"]
    assert gpu[0]["utilization"] == pytest.approx(0.93) and gpu[0]["power_w"] == pytest.approx(412.0)
    assert gpu[0]["energy_j"] == pytest.approx(1.0) and gpu[0]["throttled"] is False
    jetson = DeviceReader(FIXTURES / "orin-nx-16gb")
    assert "nvml" in jetson.missing
    (module,) = jetson.read()
    assert module["utilization"] == pytest.approx(0.874) and module["clocks_mhz"] == {"gpu": 918.0}
    assert module["power_w"] == pytest.approx(module["rails_w"]["VDD_IN"])


def test_sampler_summarises_the_run():
    with DeviceSampler(DeviceReader(FIXTURES / "orin-agx-64gb"), interval_s=0.01) as s:
        import time

        time.sleep(0.05)
    out = s.summary()
    assert out["reads"] >= 3 and "ina3221" in out["sources"]
    assert out["summary"]["jetson-module"]["power_w"]["max"] > 0


def test_device_metrics_are_exported_with_semconv_names():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from edgesdk.telemetry.device_metrics import register_device_metrics

    reader, jreader = InMemoryMetricReader(), InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    nv = FakeNvml()
    nv.throttle = 0x40  # HW thermal slowdown
    dm = register_device_metrics(DeviceReader("/", pynvml=nv).read, meter_provider=provider)
    jetson = register_device_metrics(
        DeviceReader(FIXTURES / "orin-nano-8gb").read, meter_provider=MeterProvider(metric_readers=[jreader])
    )
    points: dict[str, list] = {}
    for data in (reader.get_metrics_data(), jreader.get_metrics_data()):
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    points.setdefault(m.name, []).extend(m.data.data_points)
    for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.energy", "hw.temperature"):
        assert name in points, name
    assert {p.attributes["hw.id"] for p in points["hw.power"]} == {"gpu0", "gpu1", "jetson-module"}
    assert {p.value for p in points["edgesdk.device.throttled"] if p.attributes["hw.type"] == "gpu"} == {1}
    assert {p.attributes["edgesdk.device.rail"] for p in points["edgesdk.device.rail.power"]} == {
        "VDD_IN",
        "VDD_CPU_GPU_CV",
        "VDD_SOC",
    }
    assert dm is not None and dm.reads == 1  # one read served every instrument of the collection
    dm.close()
    assert jetson is not None
    jetson.close()
    after = reader.get_metrics_data()  # closed: the callbacks report nothing (None: no points at all)
    assert after is None or not [
        p
        for rm in after.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "hw.power"
        for p in m.data.data_points
    ]


def test_register_is_a_no_op_when_telemetry_is_off(monkeypatch):
    from edgesdk import telemetry
    from edgesdk.telemetry.device_metrics import register_device_metrics

    monkeypatch.setattr(telemetry, "_tracer", lambda: None)
    assert register_device_metrics(lambda: [], meter_provider=None) is None


def test_energy_check_says_what_is_missing_and_exits_cleanly(tmp_path):
    import json
    import subprocess
    import sys

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: the check measures for real there (the lead runs it)")
    script = Path(__file__).parents[1] / "tools/bench/energy_check.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["status"] == "skipped" and "nvidia-smi" in line["missing"] and "nvml_energy" in line["missing"]
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 3 and "does not exist" in bad.stderr
