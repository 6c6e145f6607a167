# SPDX-License-Identifier: Apache-2.0
"""Module layering (docs/architecture.md "Layers"): no import cycle between modules at import time, and no
library module imports from edgesdk/commands/. Lazy imports inside functions are allowed (they are how a
device avoids importing a build-host dependency) and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "edgesdk"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        out: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.parse(path.read_text()).body:  # module level only; `if TYPE_CHECKING:` blocks skipped
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".") if is_pkg else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                out.update(subs)
                if len(subs) < len(node.names) and base in mods:
                    out.add(base)
        graph[name] = out - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_at_import_time():
    assert _cycles(_import_graph()) == []


def test_cycle_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_library_module_imports_commands():
    graph = _import_graph()
    upward = [
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if d.startswith("edgesdk.commands") and not (m.startswith("edgesdk.commands") or m == "edgesdk.cli")
    ]
    assert upward == []
