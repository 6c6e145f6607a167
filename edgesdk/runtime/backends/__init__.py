# SPDX-License-Identifier: Apache-2.0
"""Backends and the loader registry.

The backend contract is code: :mod:`edgesdk.runtime.backend` defines the ``Backend`` and ``LLMBackend``
protocols, ``TensorSpec``, ``LoadContext`` and ``Loader``, with a complete worked example of a backend
and its loader in its module docstring (run by ``tests/test_backend.py``). Each module here implements
it for one runtime; CPU is always the last resort of every chain.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from edgesdk.runtime.backend import Loader


def get_loader(fmt: str) -> Loader:
    """The runtime loader of bundle format ``fmt`` (the format plugin's ``runtime_loader``, imported now)."""
    from edgesdk.errors import BackendUnavailableError
    from edgesdk.formats import find_format, format_names

    spec = find_format(fmt)
    if spec is None:
        raise BackendUnavailableError(
            f"no runtime backend for bundle format {fmt!r}", hint=f"known formats: {', '.join(sorted(format_names()))}"
        )
    module, func = spec.runtime_loader.split(":")
    return cast("Loader", getattr(importlib.import_module(module), func))
