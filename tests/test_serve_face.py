# SPDX-License-Identifier: Apache-2.0
"""``edgesdk/serve/__init__.py`` is the package's face only (issue 40 item 4): a docstring, imports and ``__all__``,
no code of its own. Model loading is ``serve/models.py``, the sockets and connection guard ``serve/connections.py``,
the server loop ``serve/server.py``."""

from __future__ import annotations

import ast
from pathlib import Path

FACE = Path(__file__).resolve().parents[1] / "edgesdk" / "serve" / "__init__.py"


def test_the_serve_package_face_holds_only_imports_and_all():
    tree = ast.parse(FACE.read_text())
    kinds = []
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        kinds.append(f"line {node.lineno}: {type(node).__name__}")
    assert not kinds, f"edgesdk/serve/__init__.py should only re-export; it defines: {kinds}"


def test_every_public_name_of_the_face_is_there():
    import edgesdk.serve as serve

    missing = [name for name in serve.__all__ if not hasattr(serve, name)]
    assert not missing
    for name in ("load_models", "model_entry", "serve_limits", "run", "bind_sockets", "connection_cap"):
        assert getattr(serve, name).__module__ != "edgesdk.serve", name  # defined in a module of its own
