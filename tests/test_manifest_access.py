# SPDX-License-Identifier: Apache-2.0
"""No ``.get(`` on manifest data outside edgesdk/manifest.py (issue 22 item 3): what the runtime steers by is read
through the typed accessors of :mod:`edgesdk.manifest` (``LLMConfig.layers/.planned()/.thread_count``,
``Manifest.embed_max_batch``, ``.shape_buckets``, ``.io_entries``, ``.vlm_image_size``, ``.mmproj_encodes``,
``.torch_fallback``, ``.tensorrt_planned``, ``.serve_table``), which check types where the dict look-ups
guessed. The scan: in each function, a value is manifest data when it is reached from a ``manifest`` name or
attribute through attributes, subscripts, ``.get``/``.to_dict()`` calls, ``or``/``if`` expressions, or a local
name assigned from one; a ``.get(`` call on such a value is a finding. A call to anything else (an accessor,
``resolve_profile``) ends the chain."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "edgesdk"

# Files allowed to keep such look-ups this session, and why; a file here with no finding left fails the test
# (take it off the list).
ALLOWED = {
    "bundle.py": "the manifest reader/writer itself: checks the raw JSON's schema and artifact list before "
    "Manifest.from_dict types it",
    "compliance/gate.py": "`edgesdk check licenses BUNDLE` reads the manifest JSON as found (its license "
    "section, artifacts, extras) so a damaged bundle is still scanned; not runtime steering",
}

_PASS_THROUGH_CALLS = {"get", "to_dict"}


def _is_manifest(node: ast.AST, tainted: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "manifest" or node.id in tainted
    if isinstance(node, ast.Attribute):
        return (
            node.attr == "manifest"
            or _is_manifest(node.value, tainted)
            or (isinstance(node.value, ast.Name) and node.value.id == "self" and f"self.{node.attr}" in tainted)
        )
    if isinstance(node, ast.Subscript):
        return _is_manifest(node.value, tainted)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _PASS_THROUGH_CALLS:
            return _is_manifest(func.value, tainted)
        if isinstance(func, ast.Name) and func.id == "dict" and node.args:
            return _is_manifest(node.args[0], tainted)
        return False
    if isinstance(node, ast.BoolOp):
        return any(_is_manifest(v, tainted) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _is_manifest(node.body, tainted) or _is_manifest(node.orelse, tainted)
    return False


def findings(source: str, rel: str) -> list[str]:
    tree = ast.parse(source)
    out = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        tainted: set[str] = set()
        for _ in range(3):  # a name assigned from a name assigned from manifest data
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and _is_manifest(n.value, tainted):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            tainted.add(t.id)
                        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            tainted.add(f"self.{t.attr}")
        for n in ast.walk(fn):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "get"
                and _is_manifest(n.func.value, tainted)
            ):
                out.append(f"{rel}:{n.lineno}: {ast.unparse(n)[:100]}")
    return sorted(set(out))


def test_no_get_on_manifest_data_outside_manifest_py():
    found: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != "manifest.py":
            hits = findings(path.read_text(encoding="utf-8"), rel)
            if hits:
                found[rel] = hits
    unexpected = [h for rel, hits in found.items() if rel not in ALLOWED for h in hits]
    assert not unexpected, "read manifest data through edgesdk/manifest.py's typed accessors:\n" + "\n".join(unexpected)
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"no finding left in {stale}: take them off ALLOWED"


def test_the_scan_finds_what_it_should():
    src = (
        "def f(bundle):\n"
        "    info = bundle.manifest.llm.to_dict() if bundle.manifest.llm else {}\n"
        "    a = info.get('layers')\n"
        "    b = (bundle.manifest.extras.get('vlm') or {}).get('image_size')\n"
        "    c = bundle.manifest.embed_max_batch('fp16')\n"
        "    d = resolve(bundle.manifest.profile.name).kernels.get('x')\n"
    )
    hits = findings(src, "probe.py")
    assert [h.split(": ", 1)[0].rsplit(":", 1)[1] for h in hits] == ["3", "4", "4"]
