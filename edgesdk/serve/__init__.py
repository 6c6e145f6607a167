# SPDX-License-Identifier: Apache-2.0
"""``edgesdk serve``: an OpenAI-compatible HTTP server over loaded bundles (Starlette + uvicorn).

Usage::

    from edgesdk.serve import load_models, create_app, run
    entries = load_models(["out/llm-nano", "out/minilm"])      # names: the bundle directory names
    run(entries, ServeConfig(port=8080))                       # blocks; SIGTERM drains and exits

GGUF bundles answer ``/v1/chat/completions`` and ``/v1/completions``; VLM bundles answer them too, with
``image_url`` parts in chat messages (:mod:`edgesdk.serve.images`), one request at a time; text-encoder bundles
answer ``/v1/embeddings``. docs/serve.md has the limits, back-pressure and telemetry.

This module is the package's face only: the models by format are :mod:`edgesdk.serve.models`, the ASGI app
:mod:`edgesdk.serve.app`, the sockets and connection guard :mod:`edgesdk.serve.connections`, the server loop
:mod:`edgesdk.serve.server`.
"""

from __future__ import annotations

from edgesdk.serve.app import create_app
from edgesdk.serve.config import ModelEntry, ServeConfig
from edgesdk.serve.connections import FD_RESERVE, ConnectionLimits, bind_sockets, connection_cap
from edgesdk.serve.models import load_models, model_entry, serve_limits
from edgesdk.serve.server import run

__all__ = [
    "FD_RESERVE",
    "ConnectionLimits",
    "ServeConfig",
    "ModelEntry",
    "bind_sockets",
    "connection_cap",
    "create_app",
    "load_models",
    "model_entry",
    "run",
    "serve_limits",
]
