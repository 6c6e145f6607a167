# SPDX-License-Identifier: Apache-2.0
"""The import graph of ``edgesdk`` holds the layering docs/architecture.md draws (issue 22).

Every ``import`` / ``from ... import`` statement of the package counts: module level, inside functions (lazy
imports) and under ``if TYPE_CHECKING:``; relative imports are resolved. ``importlib.import_module`` calls
with computed names (the format and command registries, plugin loaders named by ``"module:function"``
strings) are data, not import statements, and are not counted.

Two granularities:

- **modules** (one node per ``.py`` file): no import cycle at all;
- **units** (the boxes of docs/architecture.md's "Layers" line: ``edgesdk.X`` for every top-level module or
  package, none named by path): no cycle between units, and no edge from a unit into one of a higher layer. The
  layers are read from that line of docs/architecture.md, so the document and this test cannot drift apart.

The root package ``edgesdk/__init__.py`` is two things: ``__version__`` (a constant every module may read:
Python runs the root package before any submodule, and it imports nothing at module level, which
:func:`test_root_package_imports_nothing_at_module_level` holds) and the public facade ``edgesdk.load``
(a lazy import of the runtime). ``from edgesdk import __version__`` is an edge to the unit ``__version__``;
any other use of the root package is an edge to the facade ``edgesdk``.

Until issue 40 the line also named three "leaf" modules by path (``formats/gguf/types.py``,
``formats/gguf/header.py``, ``runtime/backends/vlm/encoder.py``) and placed them in the lowest layer: the profiles
imported the GGUF format's type table, the license scan its header reader (with the ONNX build importing the
license scan, a compliance <-> formats cycle once the leaf is counted in its package) and the VLM format the
runtime's encoder contract, upward arrows the test did not see. They are :mod:`edgesdk.contracts` now, a unit of the
lowest layer, and :func:`test_no_unit_is_named_by_path` keeps the escape hatch shut.

The allowances below (a cycle or an upward edge kept on purpose, each with why) are empty: there is none
today. A new one needs its entry and reason here, in review; each list must equal what is found, so an entry
whose cycle or edge is gone fails this test until it is deleted.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "edgesdk"
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOT_CONSTANTS = frozenset({"__version__"})  # names of edgesdk/__init__.py that are plain constants
VERSION = "edgesdk.__version__"  # the unit of ``from edgesdk import __version__``

# Module-level cycles still present: frozenset of modules -> why it is allowed for now.
ALLOWED_MODULE_CYCLES: dict[frozenset[str], str] = {}

# Unit-level cycles still present: frozenset of units -> why.
ALLOWED_UNIT_CYCLES: dict[frozenset[str], str] = {}

# Imports from a lower layer into a higher one still present: (importing module, imported module) -> why.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


# ---------------------------------------------------------------------------------------------- the graph


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package (``__init__`` named as its package)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _resolve(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_edges(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported edgesdk module: first line}; every import statement counts (lazy and TYPE_CHECKING)."""
    mods = modules(package)
    root = package.name
    graph: dict[str, dict[str, int]] = {VERSION: {}}
    for name, path in mods.items():
        out: dict[str, int] = {}
        is_package = path.name == "__init__.py"

        def add(target: str, line: int, out: dict[str, int] = out) -> None:
            while target not in mods and "." in target:  # `import edgesdk.x.Name` style: nearest module
                target = target.rsplit(".", 1)[0]
            out.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == root or alias.name.startswith(root + "."):
                        add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                if base != root and not base.startswith(root + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        add(sub, node.lineno)
                    elif base == root and alias.name in ROOT_CONSTANTS:
                        out.setdefault(VERSION, node.lineno)
                    else:
                        add(base, node.lineno)
        out.pop(name, None)
        graph[name] = out
    return graph


# ---------------------------------------------------------------------------------------------- the layers


def _doc_name(text: str) -> str:
    return (
        "edgesdk"
        if text == "edgesdk"
        else VERSION
        if text == "__version__"
        else "edgesdk." + text.removesuffix(".py").replace("/", ".")
    )


def layers(doc: Path = ARCHITECTURE) -> list[list[str]]:
    """The "Layers" line of docs/architecture.md, lowest layer first, as unit names."""
    text = " ".join(doc.read_text(encoding="utf-8").split())
    match = re.search(r"\*\*Layers\*\*[^:]*:(.*?)\. ", text)
    assert match, "docs/architecture.md lost its **Layers** line"
    return [[_doc_name(n) for n in re.findall(r"`([^`]+)`", part)] for part in match.group(1).split("←")]


def unit_of(module: str) -> str:
    """The unit a module belongs to: ``edgesdk.X`` (the root package's ``edgesdk`` and ``__version__`` apart)."""
    if module in ("edgesdk", VERSION):
        return module
    return ".".join(module.split(".")[:2])


def unit_graph(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for src, targets in graph.items():
        u = unit_of(src)
        out.setdefault(u, set())
        for dst in targets:
            v = unit_of(dst)
            out.setdefault(v, set())
            if u != v:
                out[u].add(v)
    return out


def upward_edges(graph: dict[str, dict[str, int]], layer_list: list[list[str]]) -> set[tuple[str, str]]:
    """(module, imported module) pairs whose imported unit sits in a higher layer than the importer's."""
    rank = {u: i for i, layer in enumerate(layer_list) for u in layer}
    return {(src, dst) for src, targets in graph.items() for dst in targets if rank[unit_of(dst)] > rank[unit_of(src)]}


def cycles(graph: dict[str, Iterable[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.add(frozenset(comp))
    return found


# ---------------------------------------------------------------------------------------------- the tests


def test_every_unit_has_a_layer():
    graph = import_edges()
    layer_list = layers()
    placed = [u for layer in layer_list for u in layer]
    assert len(placed) == len(set(placed)), "a unit is named twice in docs/architecture.md's Layers line"
    units = set(unit_graph(graph))
    assert units - set(placed) == set(), "add these to docs/architecture.md's Layers line"
    assert set(placed) - units == set(), "docs/architecture.md's Layers line names units that do not exist"


def test_no_module_import_cycle_beyond_the_allowances():
    found = cycles(import_edges())
    assert {tuple(sorted(c)) for c in found} == {tuple(sorted(c)) for c in ALLOWED_MODULE_CYCLES}


def test_no_unit_import_cycle_beyond_the_allowances():
    found = cycles(unit_graph(import_edges()))
    assert {tuple(sorted(c)) for c in found} == {tuple(sorted(c)) for c in ALLOWED_UNIT_CYCLES}


def test_no_upward_import_beyond_the_allowances():
    assert sorted(upward_edges(import_edges(), layers())) == sorted(ALLOWED_UPWARD)


def test_no_unit_is_named_by_path():
    """Every unit of the Layers line is a top-level module or package: a module named by path (a "leaf" let into a
    lower layer than its package's) would hide an upward import from the checks above (issue 40, item 5)."""
    named = [u for layer in layers() for u in layer if u.count(".") > 1]
    assert named == [], "move the shared code into a unit of its own (edgesdk/contracts/) instead"


def test_contracts_import_only_the_lowest_layer():
    """What the build and the runtime share (edgesdk/contracts/) is the lowest layer's: it imports nothing above it."""
    graph = import_edges()
    lowest = set(layers()[0])
    assert "edgesdk.contracts" in lowest
    found = {(m, d) for m, ts in graph.items() if unit_of(m) == "edgesdk.contracts" for d in ts}
    assert {(m, d) for m, d in found if unit_of(d) not in lowest} == set()


def test_root_package_imports_nothing_at_module_level():
    """``from edgesdk import __version__`` is a leaf edge only while the root package imports nothing itself
    at module level (its ``load`` facade imports the runtime lazily)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    eager = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom, ast.If))
        and any(isinstance(x, (ast.Import, ast.ImportFrom)) for x in ast.walk(n))
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    ]
    assert eager == []


def test_the_checks_see_lazy_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "edgesdk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0'\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgesdk.b import X\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    from edgesdk import __version__\n")
    (pkg / "sub" / "__init__.py").write_text("from .c import y\n")
    (pkg / "sub" / "c.py").write_text("from ..a import z\nimport edgesdk.sub\n")
    graph = import_edges(pkg)
    assert graph["edgesdk.a"] == {"edgesdk.b": 3}
    assert graph["edgesdk.b"] == {"edgesdk.a": 2, VERSION: 3}
    assert graph["edgesdk.sub"] == {"edgesdk.sub.c": 1}
    assert graph["edgesdk.sub.c"] == {"edgesdk.a": 1, "edgesdk.sub": 2}
    assert cycles(graph) == {frozenset({"edgesdk.a", "edgesdk.b"}), frozenset({"edgesdk.sub", "edgesdk.sub.c"})}
    assert upward_edges(graph, [[VERSION, "edgesdk.a"], ["edgesdk.b", "edgesdk.sub", "edgesdk"]]) == {
        ("edgesdk.a", "edgesdk.b")
    }
