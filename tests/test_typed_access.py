# SPDX-License-Identifier: Apache-2.0
"""Typed in the room, not only at the door (issue 40, item 2), checked on the syntax tree:

* **builders and the runtime keep the typed plan sections they are given**: in ``edgesdk/build.py``, every
  ``edgesdk/formats/<name>/build.py`` and ``edgesdk/runtime/``, no call turns a plan or section back into its
  decisions (``.decisions()``, ``.decision(key)``, ``.from_decisions(...)``, ``dataclasses.asdict``) and none
  re-derives what the plan decided from the profile (``parity_thresholds``, ``execution_provider_chain``: the
  section's ``thresholds(precision)`` and ``ep_chain`` hold them). The ``*_section()`` helpers that type a
  registered format's decisions live in the ``plan`` modules, outside this scan.
* **profiles are read through their typed views**: outside ``edgesdk/profiles.py`` no code reads a profile's raw
  mappings (``.data``, ``.policy``, ``.kernels``, ``.software``) on a value that is a profile (a name with
  ``prof`` in it, or a ``resolve_profile`` / ``load_profile_file`` call: a heuristic, not a type analysis).
  ``policy`` and ``software`` are private now (``Profile._policy``); ``data`` stays the YAML mapping for
  ``profiles show``, which prints it as written, and ``as_written()`` copies it for a tool that writes a profile.

``ALLOWED`` (file -> why) may only shrink: an entry whose finding is gone fails the test until it is deleted.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "edgesdk"

SECTION_CALLS = {"decisions", "decision", "from_decisions", "asdict"}
REDERIVED = {"parity_thresholds", "execution_provider_chain"}
RAW_PROFILE = {"data", "policy", "kernels", "software"}
PROFILE_CALLS = {"resolve_profile", "load_profile_file"}

ALLOWED: dict[str, str] = {}


def _builder_files() -> list[Path]:
    return sorted([PACKAGE / "build.py", *PACKAGE.glob("formats/*/build.py"), *(PACKAGE / "runtime").rglob("*.py")])


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return ""


def section_findings(tree: ast.AST, where: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in SECTION_CALLS or name in REDERIVED:
                out.append(f"{where}:{node.lineno}: {name}()")
    return out


def _is_profile(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        return _name(node.func) in PROFILE_CALLS
    return "prof" in _name(node).lower()


def profile_findings(tree: ast.AST, where: str) -> list[str]:
    return [
        f"{where}:{node.lineno}: .{node.attr} on {ast.unparse(node.value)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in RAW_PROFILE and _is_profile(node.value)
    ]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_builders_and_runtime_keep_the_typed_plan_sections():
    found = [
        f
        for path in _builder_files()
        for f in section_findings(ast.parse(path.read_text(encoding="utf-8")), _rel(path))
    ]
    assert found == []


def test_profiles_are_read_through_their_typed_views():
    found = [
        f
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "profiles.py" or path.parent != PACKAGE
        for f in profile_findings(ast.parse(path.read_text(encoding="utf-8")), _rel(path))
    ]
    assert [f for f in found if f.split(":", 1)[0] not in ALLOWED] == []
    stale = sorted(set(ALLOWED) - {f.split(":", 1)[0] for f in found})
    assert not stale, f"no finding left in {stale}: take them off ALLOWED"


def test_the_scans_find_what_they_should():
    src = (
        "def f(ctx, plan, profile):\n"
        "    a = ctx.plan.section.decisions()\n"
        "    b = plan.decision('parity')\n"
        "    c = parity_thresholds(ctx.profile, 'fp16')\n"
        "    d = dataclasses.asdict(plan.section)\n"
        "    e = profile.policy['formats']\n"
        "    g = ctx.profile.kernels.get('x')\n"
        "    h = resolve_profile('orin').data\n"
        "    ok = (plan.section.parity, profile.kernel('x'), policy.data, self.software_version('cuda'))\n"
    )
    tree = ast.parse(src)
    assert sorted(f.split(": ", 1)[1] for f in section_findings(tree, "x")) == [
        "asdict()",
        "decision()",
        "decisions()",
        "parity_thresholds()",
    ]
    assert sorted(f.split(": ", 1)[1] for f in profile_findings(tree, "x")) == [
        ".data on resolve_profile('orin')",
        ".kernels on ctx.profile",
        ".policy on profile",
    ]
