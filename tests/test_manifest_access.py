# SPDX-License-Identifier: Apache-2.0
"""No ``.get(`` on manifest data outside edgesdk/manifest.py (issue 22 item 3): what the runtime steers by is read
through the typed accessors of :mod:`edgesdk.manifest` (``LLMConfig.layers/.planned()/.thread_count``,
``Manifest.embed_max_batch``, ``.shape_buckets``, ``.io_entries``, ``.vlm_image_size``, ``.mmproj_encodes``,
``.torch_fallback``, ``.tensorrt_planned``, ``.serve_table``), which check types where the dict look-ups
guessed; a manifest read as found (``check licenses`` on a damaged bundle, ``build --force``) through
``LenientManifest`` / ``component_table`` / ``ArtifactRecord``, which never raise; the build summary through
``Manifest.parity_checks()`` / ``.license_verdict``. ``ALLOWED`` is empty.

The scan, over every function of edgesdk/ (manifest.py included as a caller, its findings not reported):

* a value is manifest data when it is reached from a ``manifest`` name or attribute, or from a parameter that
  manifest data is passed to (below), through attributes, subscripts, ``.get``/``.to_dict()``/``.values()``/
  ``.items()``/``.pop()``/``dict()``/``list()`` calls, ``or``/``if`` expressions, list/tuple displays,
  comprehensions over it, ``for`` targets over it, or a local name assigned from one; a ``.get(`` call on
  such a value is a finding. A call to anything else (an accessor, ``resolve_profile``,
  ``LenientManifest.from_json``) ends the chain.
* a parameter is manifest data when some call in edgesdk/ passes manifest data to it: the call names the
  function (``f(...)`` or ``x.f(...)``), and the argument's position (not counting a ``self``/``cls``
  parameter) or keyword names the parameter, in every function of that name. Repeated until nothing new is
  found. This is how ``compliance/components.py`` was caught: ``component_labels(extras, artifacts)`` did
  ``section.get("components")`` on the ``extras`` that ``build.py`` passes as ``ctx.manifest.extras``.

What it cannot see: manifest data that reaches a function only through a call it cannot name (a callback, a
``getattr``), or through a container filled by ``append``; what a call returns, from an accessor
(``io_entries`` gives plain dicts) or any other function."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "edgesdk"

# Files allowed to keep such look-ups, and why: none. bundle.py, compliance/gate.py, compliance/components.py and
# commands/build.py (the build summary, now from Manifest.parity_checks()) left it when their reads moved to
# manifest.py. An entry added here needs its reason; one with no finding left fails the test.
ALLOWED: dict[str, str] = {}

_PASS_THROUGH_METHODS = {"get", "to_dict", "values", "items", "pop"}
_PASS_THROUGH_FUNCTIONS = {"dict", "list"}
_Fn = ast.FunctionDef | ast.AsyncFunctionDef


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
        if isinstance(func, ast.Attribute) and func.attr in _PASS_THROUGH_METHODS:
            return _is_manifest(func.value, tainted)
        if isinstance(func, ast.Name) and func.id in _PASS_THROUGH_FUNCTIONS and node.args:
            return _is_manifest(node.args[0], tainted)
        return False
    if isinstance(node, ast.BoolOp):
        return any(_is_manifest(v, tainted) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _is_manifest(node.body, tainted) or _is_manifest(node.orelse, tainted)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(_is_manifest(e, tainted) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        return any(_is_manifest(g.iter, tainted) for g in node.generators)
    return False


def _targets(node: ast.AST) -> Iterator[str]:
    """The names an assignment or loop target binds (``self.x`` as ``"self.x"``)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        yield f"self.{node.attr}"
    elif isinstance(node, (ast.Tuple, ast.List)):
        for e in node.elts:
            yield from _targets(e)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _params(fn: _Fn) -> tuple[list[str], set[str]]:
    """(positional parameters without a leading ``self``/``cls``, every parameter name)."""
    a = fn.args
    positional = [p.arg for p in [*a.posonlyargs, *a.args]]
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return positional, {*positional, *(p.arg for p in a.kwonlyargs)}


def _tainted(fn: _Fn, nodes: list[ast.AST], keys: frozenset[int | str]) -> set[str]:
    """The names of ``fn`` (``nodes``: its nodes) that hold manifest data: its parameters that calls pass
    manifest data to (``keys``: positions, keywords), and every name assigned or looped from manifest data."""
    positional, names = _params(fn)
    tainted = {
        p
        for key in keys
        for p in ([positional[key]] if isinstance(key, int) and key < len(positional) else [key])
        if p in names
    }
    while True:
        before = len(tainted)
        for n in nodes:
            if isinstance(n, ast.Assign) and _is_manifest(n.value, tainted):
                for t in n.targets:
                    tainted.update(_targets(t))
            elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value and _is_manifest(n.value, tainted):
                tainted.update(_targets(n.target))
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and _is_manifest(n.iter, tainted):
                tainted.update(_targets(n.target))
        if len(tainted) == before:
            return tainted


def _functions(tree: ast.AST) -> list[_Fn]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def scan(sources: Mapping[str, str]) -> list[str]:
    """Findings (``rel:line: call``) over ``sources`` (relative path -> text), manifest.py's left out."""
    fns = {rel: [(fn, list(ast.walk(fn))) for fn in _functions(ast.parse(src))] for rel, src in sources.items()}
    params: dict[str, set[int | str]] = {}  # function name -> argument positions / keywords given manifest data
    cache: dict[tuple[int, frozenset[int | str]], set[str]] = {}

    def tainted_in(fn: _Fn, nodes: list[ast.AST]) -> set[str]:
        keys = frozenset(params.get(fn.name, ()))
        if (id(fn), keys) not in cache:
            cache[id(fn), keys] = _tainted(fn, nodes, keys)
        return cache[id(fn), keys]

    while True:
        before = sum(map(len, params.values()))
        for fn, nodes in (item for group in fns.values() for item in group):
            tainted = tainted_in(fn, nodes)
            for call in (n for n in nodes if isinstance(n, ast.Call)):
                func = call.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name is None:
                    continue
                for i, arg in enumerate(call.args):
                    if not isinstance(arg, ast.Starred) and _is_manifest(arg, tainted):
                        params.setdefault(name, set()).add(i)
                for kw in call.keywords:
                    if kw.arg is not None and _is_manifest(kw.value, tainted):
                        params.setdefault(name, set()).add(kw.arg)
        if sum(map(len, params.values())) == before:
            break
    out = []
    for rel, group in fns.items():
        if rel == "manifest.py":
            continue
        for fn, nodes in group:
            tainted = tainted_in(fn, nodes)
            for n in nodes:
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "get"
                    and _is_manifest(n.func.value, tainted)
                ):
                    out.append(f"{rel}:{n.lineno}: {ast.unparse(n)[:100]}")
    return sorted(set(out))


def findings(source: str, rel: str) -> list[str]:
    return scan({rel: source})


def _lines(hits: list[str]) -> list[str]:
    return [h.split(": ", 1)[0].rsplit(":", 1)[1] for h in hits]


def test_no_get_on_manifest_data_outside_manifest_py():
    sources = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.py"))}
    found = scan(sources)
    unexpected = [h for h in found if h.split(":", 1)[0] not in ALLOWED]
    assert not unexpected, "read manifest data through edgesdk/manifest.py's typed accessors:\n" + "\n".join(unexpected)
    stale = sorted(set(ALLOWED) - {h.split(":", 1)[0] for h in found})
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
    assert _lines(findings(src, "probe.py")) == ["3", "4", "4"]


def test_the_scan_follows_manifest_data_into_the_functions_it_is_passed_to():
    """The pattern of compliance/components.py before this scan saw it: sections of the manifest handed to a
    function as parameters with other names, looped over, and ``.get`` on the items."""
    labels = (
        "def component_labels(extras, artifacts):\n"
        "    for section in (extras or {}).values():\n"
        "        comps = section.get('components')\n"
        "        for name, spec in comps.items():\n"
        "            art = spec.get('artifact')\n"
        "    for a in artifacts:\n"
        "        path = a.get('path')\n"
        "    return {k: v.get('x') for k, v in (extras or {}).items()}\n"
        "def unrelated(extras):\n"
        "    return extras.get('pip')\n"
    )
    build = "def build(ctx):\n    return component_labels(ctx.manifest.extras, artifacts=ctx.artifacts)\n"
    gate = (
        "def scan(root):\n"
        "    manifest = load(root)\n"
        "    arts = [a for a in manifest.get('artifacts') or [] if isinstance(a, dict)]\n"
        "    return component_labels(None, arts)\n"
    )
    assert _lines(scan({"components.py": labels})) == []  # nobody passes it manifest data
    assert _lines(scan({"components.py": labels, "build.py": build})) == ["3", "5", "8"]
    hits = scan({"components.py": labels, "build.py": build, "gate.py": gate})
    assert hits == sorted(hits) and [h.split(":")[0] for h in hits] == ["components.py"] * 4 + ["gate.py"]
    assert _lines(hits) == ["3", "5", "7", "8", "3"]


def test_a_method_argument_skips_self():
    src = (
        "class Reader:\n"
        "    def read(self, data, other):\n"
        "        return data.get('a'), other.get('b')\n"
        "def use(bundle, r):\n"
        "    return r.read(bundle.manifest.plan, {})\n"
    )
    assert _lines(findings(src, "probe.py")) == ["3"]
