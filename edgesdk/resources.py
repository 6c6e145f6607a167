# SPDX-License-Identifier: Apache-2.0
"""The one way to find data shipped inside the package (``edgesdk/data/...``).

Goes through :mod:`importlib.resources`, so it works from a wheel, an editable install or a zip,
never from a path computed off ``__file__``. Returns a ``Traversable`` (``/``, ``read_text()``,
``read_bytes()``, ``is_file()``, ``iterdir()``); wrap it in ``importlib.resources.as_file`` where a real
file-system path is needed. Imports nothing from edgesdk, so every layer may use it.
"""

from __future__ import annotations

import sys
from importlib.resources import files

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable

__all__ = ["Traversable", "data_file", "read_data_text"]


def data_file(*parts: str) -> Traversable:
    """``edgesdk/data/<parts...>``, e.g. ``data_file("capability", "dla.yaml")``."""
    node = files("edgesdk") / "data"
    for part in parts:
        node = node / part
    return node


def read_data_text(*parts: str) -> str:
    """The UTF-8 text of a shipped data file."""
    return data_file(*parts).read_text(encoding="utf-8")
