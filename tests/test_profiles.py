# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

import copy

import pytest
import yaml

from edgesdk.errors import ProfileError
from edgesdk.profiles import list_profiles, resolve_profile, validate_profile_data

REQUIRED = {
    "orin-agx-64gb",
    "orin-agx-32gb",
    "orin-nx-16gb",
    "orin-nx-8gb",
    "orin-nano-8gb",
    "orin-nano-4gb",
    "a10",
    "l4",
    "h200",
    "cpu-x86_64",
    "cpu-aarch64",
}


def _figures(node, path=""):
    if isinstance(node, dict):
        if "value" in node and "source" in node:
            yield path, node
            return
        for k, v in node.items():
            yield from _figures(v, f"{path}.{k}" if path else k)


def test_all_required_profiles_load_and_validate():
    names = {p.name for p in list_profiles()}
    assert REQUIRED <= names


def test_every_figure_has_a_source_and_a_known_status():
    for p in list_profiles():
        figs = list(_figures(p.data["device"]))
        assert figs or p.kind == "cpu", p.name  # generic CPU hosts carry no figures until detect --write
        for path, fig in figs:
            assert fig["source"].strip(), f"{p.name}:{path} has no source"
            assert fig.get("status", "confirmed") in ("confirmed", "derived", "unconfirmed", "measured")


def test_unconfirmed_figures_are_marked():
    # devices.md marks AGX bandwidth as unconfirmed: the profile must carry that mark.
    p = resolve_profile("orin-agx-64gb")
    assert p.data["device"]["memory"]["bandwidth_gbps"]["status"] == "unconfirmed"
    assert resolve_profile("orin-nano-8gb").data["device"]["peak"]["fp16_tflops"]["status"] == "derived"


def test_aliases_resolve_and_record_what_was_typed():
    p = resolve_profile("orin")
    assert p.name == "orin-agx-64gb" and p.resolved_from == "orin"
    assert resolve_profile("jetson-orin-nano").name == "orin-nano-8gb"
    assert resolve_profile("orin-nano-8gb").resolved_from is None


def test_unknown_name_suggests_closest():
    with pytest.raises(ProfileError) as err:
        resolve_profile("orin-nan")
    assert "did you mean" in err.value.one_line() and "orin-nano" in err.value.one_line()


def test_profile_from_path_and_invalid_file_names_file_key_and_type(tmp_path):
    data = copy.deepcopy(resolve_profile("l4").data)
    good = tmp_path / "mine.yaml"
    good.write_text(yaml.safe_dump(data))
    assert resolve_profile(str(good)).name == "l4"
    data["device"]["memory"]["bandwidth_gbps"] = "fast"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as err:
        resolve_profile(str(bad))
    msg = err.value.one_line()
    assert str(bad) in msg and "device.memory.bandwidth_gbps" in msg and "figure" in msg


def test_wrong_scalar_type_and_missing_key():
    data = copy.deepcopy(resolve_profile("a10").data)
    data["policy"]["memory_headroom_fraction"] = "lots"
    with pytest.raises(ProfileError, match=r"policy.memory_headroom_fraction: expected"):
        validate_profile_data(data, "x.yaml")
    with pytest.raises(ProfileError, match="kernels: expected a mapping"):
        validate_profile_data({**resolve_profile("a10").data, "kernels": None}, "y.yaml")
    del data["kernels"]
    with pytest.raises(ProfileError, match="kernels: missing"):
        validate_profile_data(data, "z.yaml")


def test_broken_yaml_is_one_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError) as err:
        resolve_profile(str(bad))
    assert "\n" not in err.value.one_line() and "broken.yaml" in err.value.one_line()


def test_memory_budget_uses_usable_memory_and_headroom():
    nano = resolve_profile("orin-nano-8gb")
    usable = nano.figure("device.memory.usable_gb")
    assert nano.memory_budget_gb() == pytest.approx(usable * (1 - nano.memory_headroom_fraction), abs=0.01)
    assert resolve_profile("cpu-x86_64").memory_budget_gb() == 8.0


def test_cli_profiles_list_json_and_unknown(run_cli):
    import json

    res = run_cli("profiles", "list", "--json")
    assert res.returncode == 0, res.stderr
    names = {p["name"] for p in json.loads(res.stdout)}
    assert REQUIRED <= names
    res = run_cli("profiles", "show", "orinn-nano")
    assert res.returncode == 3
    assert res.stderr.startswith("error: unknown device profile") and "Traceback" not in res.stderr


def test_profiles_are_package_data_mapped_onto_the_top_level_directory(monkeypatch):
    """The YAML files stay in the repository's profiles/ and are found through importlib.resources as
    the package edgesdk.profiles_data (setup.py maps it), in the wheel and in an editable install;
    tests/test_wheel_install.py checks the installed wheel."""
    from pathlib import Path

    from edgesdk.profiles import PROFILES_PACKAGE, profiles_dir

    repo_profiles = Path(__file__).resolve().parent.parent / "profiles"
    monkeypatch.delenv("EDGESDK_PROFILES_DIR", raising=False)
    assert profiles_dir().resolve() == repo_profiles
    assert {p.stem for p in repo_profiles.glob("*.yaml")} == {p.name for p in list_profiles()} == REQUIRED
    setup_py = (repo_profiles.parent / "setup.py").read_text()
    assert PROFILES_PACKAGE in setup_py and '"profiles"' in setup_py


def test_profiles_dir_override(tmp_path, monkeypatch):
    src = next(iter(list_profiles()))
    (tmp_path / "mine.yaml").write_text(src.path.read_text().replace(f"name: {src.name}", "name: mine", 1))
    monkeypatch.setenv("EDGESDK_PROFILES_DIR", str(tmp_path))
    assert [p.name for p in list_profiles()] == ["mine"]
