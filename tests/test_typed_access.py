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

* **load options reach the loaders typed** (item 1): in ``edgesdk/runtime/`` no code turns a ``LoadOptions`` back
  into a dict (``.to_dict()``, ``dict(ctx.options ...)``) or reads options as one (``ctx.options.get(...)``,
  ``ctx.options[...]``, ``opts.get(...)``, ``opts[...]``, ``"x" in opts``); ``edgesdk.load`` hands the loader the
  dataclass itself (test_load_options checks the object).
* **the LLM contract is typed**: ``generate``/``stream``/``chat`` in the session and the backends take their sampling
  options as ``**options: Unpack[GenerationOptions]``, never ``**kwargs: Any``; the last request's figures are a
  ``RequestStats`` (``last_stats``; ``last`` is its dict view).
* **serve picks capabilities by protocol** (``isinstance`` on ``BatchingBackend``, ``VisionBackend``, ``LLMBackend``):
  in ``edgesdk/serve/`` no ``hasattr(...)`` (a module's, ``socket``'s, is a platform probe, not a capability), no
  ``getattr(x, name, default)`` on a backend, pipe, engine or worker or for a backend member, and no comparison
  with a bundle format's name (``fmt == "gguf"``, ``formats[i] in ("gguf", "vlm")``).

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


OPTION_NAMES = {"opts"}  # what a loader calls its typed options; ``<x>.options`` is LoadContext's
DICT_READS = {"get", "items", "keys", "values"}


def _is_options(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "options") or (
        isinstance(node, ast.Name) and node.id in OPTION_NAMES
    )


def options_findings(tree: ast.AST, where: str) -> list[str]:
    """Load options turned back into a dict, or read as one."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "to_dict":
                out.append(f"{where}:{node.lineno}: .to_dict()")
            elif isinstance(func, ast.Name) and func.id == "dict" and node.args:
                arg = node.args[0]
                inner = arg.values[0] if isinstance(arg, ast.BoolOp) else arg
                if _is_options(inner):
                    out.append(f"{where}:{node.lineno}: dict({ast.unparse(arg)})")
            elif isinstance(func, ast.Attribute) and func.attr in DICT_READS and _is_options(func.value):
                out.append(f"{where}:{node.lineno}: {ast.unparse(func)}()")
        elif isinstance(node, ast.Subscript) and _is_options(node.value):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if any(_is_options(c) for c in node.comparators):
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


LLM_CALLS = {"generate", "stream", "chat"}


def untyped_llm_findings(tree: ast.AST, where: str) -> list[str]:
    """``generate``/``stream``/``chat`` whose keyword options are ``**kwargs: Any`` (or unannotated)."""
    return [
        f"{where}:{node.lineno}: {node.name}(**{node.args.kwarg.arg}: "
        f"{ast.unparse(node.args.kwarg.annotation) if node.args.kwarg.annotation else '(none)'})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name in LLM_CALLS
        and node.args.kwarg is not None
        and (node.args.kwarg.annotation is None or "GenerationOptions" not in ast.unparse(node.args.kwarg.annotation))
    ]


PROBED = {"backend", "pipe", "engine", "worker"}  # objects whose capabilities are protocols
BACKEND_MEMBERS = {
    "backend",
    "settings",
    "planned_slots",
    "heavy_encode",
    "last",
    "pipe",
    "engine",
    "batch_engine",
    "count_tokens",
    "kv_bytes_per_token",
    "speculative_plan",
    "prefill_budget",
}
PLATFORM_MODULES = {"socket", "os", "sys", "signal"}  # hasattr on these asks the platform, not a backend
FORMAT_NAMES = {"gguf", "vlm", "onnx", "tensorrt", "torch"}


def _format_names_in(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and n.value in FORMAT_NAMES for n in ast.walk(node))


def probe_findings(tree: ast.AST, where: str) -> list[str]:
    """Capability probes: ``hasattr``, ``getattr(..., default)`` on a backend, comparisons with format names."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            obj = node.args[0]
            if node.func.id == "hasattr" and not (isinstance(obj, ast.Name) and obj.id in PLATFORM_MODULES):
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            elif node.func.id == "getattr" and len(node.args) == 3:
                name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
                if name in BACKEND_MEMBERS or any(w in ast.unparse(obj) for w in PROBED):
                    out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare) and _format_names_in(node):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd | ast.BitOr) and _format_names_in(node):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return out


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


def _scan(paths: list[Path], scan) -> list[str]:
    return [f for path in paths for f in scan(ast.parse(path.read_text(encoding="utf-8")), _rel(path))]


def test_load_options_reach_the_loaders_typed():
    runtime = [p for p in sorted((PACKAGE / "runtime").rglob("*.py")) if p.name != "options.py"]
    assert _scan(runtime, options_findings) == []


def test_the_llm_contract_takes_typed_options():
    files = [PACKAGE / "runtime" / "session.py", PACKAGE / "runtime" / "backend.py"]
    files += sorted((PACKAGE / "runtime" / "backends").rglob("*.py"))
    assert _scan(files, untyped_llm_findings) == []


def test_the_llm_protocols_are_typed_and_checkable():
    import inspect

    from edgesdk.runtime.backend import BatchingBackend, LLMBackend, RequestStats, VisionBackend, VisionRequestStats

    for proto in (LLMBackend, VisionBackend):
        for name in LLM_CALLS:
            params = inspect.signature(getattr(proto, name)).parameters.values()
            kwargs = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
            assert [str(p.annotation) for p in kwargs] == ["Unpack[GenerationOptions]"], (proto.__name__, name)
        assert "last_stats" in dir(proto)
    assert {"planned_slots", "context_length", "on_gpu"} <= set(dir(BatchingBackend))
    stats = VisionRequestStats(input_tokens=5, output_tokens=2, finish_reason="stop", ttft_s=0.01234, image_tokens=3)
    assert isinstance(stats, RequestStats) and stats.usage()["ttft_ms"] == 12.34
    last = stats.as_dict()
    assert last["image_tokens"] == 3 and last["kv_reused_tokens"] == 0 and last["input_tokens"] == 5


def test_generation_options_are_what_a_request_takes():
    from dataclasses import fields

    from edgesdk.runtime.backend import GenerationOptions
    from edgesdk.runtime.requests import GenerationRequest

    request_fields = {f.name for f in fields(GenerationRequest)} - {"prompt", "prompt_tokens", "messages", "stream"}
    assert set(GenerationOptions.__annotations__) - {"temp"} == request_fields


def test_serve_picks_capabilities_by_protocol():
    assert _scan(sorted((PACKAGE / "serve").rglob("*.py")), probe_findings) == []


def test_the_item_one_scans_find_what_they_should():
    src = (
        "def load(bundle, ctx, backend, session, formats, fmt):\n"
        "    opts = dict(ctx.options or {})\n"
        "    a = opts.get('n_ctx'); b = opts['n_batch']; c = 'flash_attn' not in opts\n"
        "    d = ctx.options.get('providers'); e = typed.to_dict()\n"
        "    f = getattr(backend, 'planned_slots', None); g = hasattr(backend, 'heavy_encode')\n"
        "    h = getattr(session.backend, 'x', None); i = fmt == 'gguf'; j = formats[0] in ('gguf', 'vlm')\n"
        "    k = {'gguf', 'vlm'} & set(formats)\n"
        "    ok = (opts.n_ctx, hasattr(socket, 'AF_INET6'), getattr(exc, 'strerror', None), fmt == 'base64')\n"
        "def generate(self, prompt, **kw: Any): ...\n"
        "def chat(self, messages, **options: Unpack[GenerationOptions]): ...\n"
    )
    tree = ast.parse(src)
    assert len(options_findings(tree, "x")) == 6
    assert [f.split(": ", 1)[1] for f in untyped_llm_findings(tree, "x")] == ["generate(**kw: Any)"]
    assert sorted(f.split(": ", 1)[1] for f in probe_findings(tree, "x")) == sorted(
        [
            "getattr(backend, 'planned_slots', None)",
            "hasattr(backend, 'heavy_encode')",
            "getattr(session.backend, 'x', None)",
            "fmt == 'gguf'",
            "formats[0] in ('gguf', 'vlm')",
            "{'gguf', 'vlm'} & set(formats)",
        ]
    )


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
