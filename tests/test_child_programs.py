# SPDX-License-Identifier: Apache-2.0
"""Child programs of ``edgesdk`` are modules run with ``python -m`` (issue 22 item 4), not ``python -c``
strings: ruff, mypy and the duplicates check see them, and they ship in the wheel.

Read from the source (AST): every subprocess command that ``edgesdk/`` writes as a list literal. None holds
the literal ``"-c"``; each ``[sys.executable, "-m", "edgesdk.<module>", ...]`` names a module of the package
that has an ``if __name__ == "__main__":`` block and imports without torch or transformers (the heavy imports
happen in the child's ``main``, so the parent that imports it, or names it, stays light). ``tools/`` is not
scanned: its scripts may keep their ``-c`` strings.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "edgesdk"
HEAVY = ("torch", "transformers")
# The VLM build's children (formerly the -c strings _HF_CHILD and _EXPORT_CHILD)
VLM_CHILDREN = {"edgesdk.formats.vlm._children.hf_reference", "edgesdk.formats.vlm._children.encoder_export"}


def _is_sys_executable(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "executable" and getattr(node.value, "id", "") == "sys"


def _commands(tree: ast.AST) -> list[list[ast.expr]]:
    """Command lists: list/tuple literals that start with ``sys.executable`` or are the first argument (or
    ``args=``) of a call named run/Popen/call/check_call/check_output/create_subprocess_exec/exec*."""
    found: dict[int, list[ast.expr]] = {}  # by the literal's id: one found both ways counts once
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and _is_sys_executable(node.elts[0]):
            found[id(node)] = node.elts
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in {"run", "Popen", "call", "check_call", "check_output"} or name.startswith("exec"):
                args = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "args")]
                found.update((id(a), a.elts) for a in args if isinstance(a, (ast.List, ast.Tuple)))
            elif name == "create_subprocess_exec" and node.args:
                found[id(node)] = list(node.args)
    return sorted(found.values(), key=lambda elts: (elts[0].lineno, elts[0].col_offset))


def _scan(source: str) -> tuple[list[int], list[str]]:
    """(lines of commands holding a literal "-c", modules named by "-m" after sys.executable)."""
    dash_c, modules = [], []
    for elts in _commands(ast.parse(source)):
        consts = [e.value if isinstance(e, ast.Constant) else None for e in elts]
        if "-c" in consts:
            dash_c.append(elts[0].lineno)
        if len(elts) > 2 and _is_sys_executable(elts[0]) and consts[1] == "-m" and isinstance(consts[2], str):
            modules.append(consts[2])
    # formats/gguf/convert.run_child(module, ...) runs `sys.executable -m module`: its callers name the module
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "run_child":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                modules.append(first.value)
    return dash_c, modules


def _package_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def _child_modules() -> set[str]:
    return {m for src in _package_sources().values() for m in _scan(src)[1]}


def test_the_scan_finds_a_dash_c_child_and_a_dash_m_one():
    """The scanner is not vacuous: the shapes it must catch."""
    src = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', CHILD, a], capture_output=True)\n"
        "subprocess.Popen(args=('python3', '-c', 'print(1)'))\n"
        "cmd = [sys.executable, '-c', CHILD]\n"
        "subprocess.run([sys.executable, '-m', 'edgesdk.x.y', a])\n"
        "subprocess.run(['tar', '-xf', a])\n"
    )
    assert _scan(src) == ([2, 3, 4], ["edgesdk.x.y"])


def test_no_python_dash_c_child_program_in_the_package():
    offenders = [f"{path}:{line}" for path, src in _package_sources().items() for line in _scan(src)[0]]
    assert offenders == [], f"child programs as -c strings (make them modules run with -m): {offenders}"


def test_every_dash_m_child_is_a_module_of_the_package_with_a_main_block():
    modules = _child_modules()
    assert VLM_CHILDREN <= modules, modules
    for mod in sorted(modules):
        assert mod.startswith("edgesdk."), mod
        path = REPO.joinpath(*mod.split(".")).with_suffix(".py")
        assert path.is_file(), f"{mod}: no {path.relative_to(REPO)}"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        mains = [
            n
            for n in tree.body
            if isinstance(n, ast.If) and ast.unparse(n.test).replace("'", '"') == '__name__ == "__main__"'
        ]
        assert mains, f'{mod}: no `if __name__ == "__main__":` block'


@pytest.mark.parametrize("module", sorted(_child_modules()))
def test_a_child_module_imports_without_torch_or_transformers(module):
    code = f"import sys, {module}\nheavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\nassert not heavy, heavy\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
