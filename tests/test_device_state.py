# SPDX-License-Identifier: Apache-2.0
"""Device state on every result: power mode, clocks (locked?), temperature, throttling, from the fixture tree
of each Jetson module the profiles list, from NVML (a stand-in), and `profiler compare` across power modes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_energy import FIXTURES, JETSON_PROFILES, FakeNvml  # tests/ is on sys.path

from edgesdk.profiler import device_state as ds
from edgesdk.profiler.compare import compare_reports, render_comparison
from edgesdk.profiler.report import SCHEMA, device_state_lines
from edgesdk.profiles import resolve_profile


@pytest.mark.parametrize("profile", JETSON_PROFILES)
def test_jetson_fixture_state_per_module(profile):
    state = ds.snapshot(FIXTURES / profile)
    assert state["kind"] == "jetson"
    # the saved mode (pmode) named by nvpmodel.conf, one of the modes the profile lists
    assert state["power_mode"] in resolve_profile(profile).data["device"]["power_modes"]["value"]
    assert state["sources"]["power_mode"] == "/var/lib/nvpmodel/status + /etc/nvpmodel.conf"
    assert state["clocks_mhz"]["gpu"] > 300 and state["clocks_mhz"]["cpu"] > 1000
    assert state["clocks_locked"] is False  # devfreq/cpufreq minimums below their maximums: DVFS free
    assert state["temperature_c"] == pytest.approx(48.5)
    assert state["throttling"] is False
    assert state["reasons"] == {}


def _copy(tmp_path: Path, profile: str) -> Path:
    root = tmp_path / profile
    shutil.copytree(FIXTURES / profile, root)
    return root


def test_jetson_clocks_lock_and_a_hot_zone_throttles(tmp_path):
    root = _copy(tmp_path, "orin-nano-8gb")
    gpu = root / "sys/class/devfreq/17000000.gpu"
    (gpu / "min_freq").write_text((gpu / "max_freq").read_text())
    for cpu in (root / "sys/devices/system/cpu").glob("cpu*/cpufreq"):
        (cpu / "scaling_min_freq").write_text((cpu / "scaling_max_freq").read_text())
    before = ds.snapshot(root)
    assert before["clocks_locked"] is True
    (root / "sys/class/thermal/thermal_zone4/temp").write_text("99500\n")  # tj past its passive trip (99 C)
    after = ds.snapshot(root)
    assert after["throttling"] is True and "tj-thermal 99.5 C" in after["throttle_reasons"][0]
    result = ds.during(before, after)
    assert result["throttling"] is True
    assert result["flagged"] and result["flagged"][0].startswith("taken while throttling")
    assert any(row[0] == "WARNING" for row in device_state_lines(result))


def test_power_mode_change_during_a_run_is_flagged(tmp_path):
    root = _copy(tmp_path, "orin-nx-16gb")
    before = ds.snapshot(root)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0001\n")
    result = ds.during(before, ds.snapshot(root))
    assert result["power_mode"] == "25W"
    assert "power mode changed during the run: 25W -> 10W" in result["flagged"]


def test_nvpmodel_tool_output_wins_on_the_device(tmp_path):
    root = _copy(tmp_path, "orin-agx-64gb")
    state = ds.snapshot(root, run_tool=lambda argv: "NV Power Mode: 30W\n2\n")
    assert state["power_mode"] == "30W" and state["sources"]["power_mode"] == "nvpmodel -q"


def test_unknown_mode_id_and_missing_status_are_reasons(tmp_path):
    root = _copy(tmp_path, "orin-nano-4gb")
    (root / "var/lib/nvpmodel/status").write_text("pmode:0009\n")
    state = ds.snapshot(root)
    assert state["power_mode"] is None and "mode id 9" in state["reasons"]["power_mode"]
    (root / "var/lib/nvpmodel/status").unlink()
    assert "status is absent" in ds.snapshot(root)["reasons"]["power_mode"]


def test_nvml_state_power_limit_app_clocks_and_throttle_reasons(tmp_path):
    nv = FakeNvml()
    state = ds.snapshot(tmp_path, pynvml=nv)
    assert state["power_mode"] == "power limit 700 W"
    assert state["clocks_mhz"]["gpu0_sm"] == 1980
    assert state["clocks_locked"] is None and "nvidia-smi -lgc" in state["reasons"]["clocks_locked"]
    assert state["temperature_c"] == 61 and state["throttling"] is False
    nv.app_clock, nv.throttle = 1410, 0x4 | 0x1  # application clocks set; power cap (idle is not throttling)
    state = ds.snapshot(tmp_path, pynvml=nv)
    assert state["clocks_locked"] is True
    assert state["throttling"] is True and state["throttle_reasons"] == ["GPU 0: sw_power_cap", "GPU 1: sw_power_cap"]


def test_nothing_readable_is_null_with_reasons(tmp_path):
    state = ds.snapshot(tmp_path)
    for field in ds.FIELDS:
        assert state[field] is None and state["reasons"][field]


# ---------------------------------------------------------------- compare


def _report(mode: str | None, decode: float) -> dict:
    return {
        "schema": SCHEMA,
        "device": {"best_match": "orin-nano-8gb"},
        "llm": {"decode_tok_s": decode},
        "device_state": {"power_mode": mode, "flagged": None},
    }


def test_compare_notes_the_power_modes():
    same = compare_reports(_report("15W", 20.0), _report("15W", 21.0))
    assert same["power_mode_mismatch"] is None
    diff = compare_reports(_report("15W", 20.0), _report("25W", 28.0))
    assert diff["power_mode_mismatch"] == "the reports ran under different power modes (15W vs 25W)"
    assert "WARNING: the reports ran under different power modes" in render_comparison(diff)
    old = compare_reports({"schema": SCHEMA}, _report("25W", 28.0))
    assert old["power_mode_mismatch"] is None and "power mode unknown in one report" in render_comparison(old)


@pytest.mark.parametrize("allow", [False, True])
def test_compare_cli_refuses_different_power_modes(tmp_path, run_cli, allow):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report("15W", 20.0)))
    b.write_text(json.dumps(_report("25W", 28.0)))
    done = run_cli("profiler", "compare", a, b, *(["--allow-power-mode-mismatch"] if allow else []))
    if allow:
        assert done.returncode == 0, done.stderr
        assert "warning: the reports ran under different power modes (15W vs 25W)" in done.stderr
        assert "decode (tok/s)" in done.stdout
    else:
        assert done.returncode == 3
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .startswith("error: the reports ran under different power modes (15W vs 25W): not comparable")
        )
        assert done.stdout == ""


def test_predict_gives_tokens_per_joule_per_power_mode():
    from edgesdk.profiler.api import energy_by_power_mode

    rows = energy_by_power_mode({"decode": {"tok_s": 30.0}}, resolve_profile("orin-agx-64gb"))
    by_mode = {r["power_mode"]: r for r in rows}
    assert by_mode["15W"]["tokens_per_joule_floor"] == pytest.approx(2.0)
    assert by_mode["MAXN"]["tokens_per_joule_floor"] is None and "MAXN" in by_mode["MAXN"]["reason"]
    assert energy_by_power_mode({"encoder": {}}, resolve_profile("orin-agx-64gb")) is None
    assert energy_by_power_mode({"decode": {"tok_s": 30.0}}, resolve_profile("h200")) is None  # no mode list
