# SPDX-License-Identifier: Apache-2.0
"""``edgesdk serve``: an OpenAI-compatible HTTP server over loaded bundles (Starlette + uvicorn).

Usage::

    from edgesdk.serve import load_models, create_app, run
    entries = load_models(["out/llm-nano", "out/minilm"])      # names: the bundle directory names
    run(entries, ServeConfig(port=8080))                       # blocks; SIGTERM drains and exits

GGUF bundles answer ``/v1/chat/completions`` and ``/v1/completions``; text-encoder bundles answer
``/v1/embeddings``. docs/serve.md has the limits, back-pressure and telemetry.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from edgesdk.errors import InputError
from edgesdk.serve.app import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TOKENS_CAP,
    ModelEntry,
    ServeConfig,
    create_app,
)

__all__ = ["ServeConfig", "ModelEntry", "create_app", "load_models", "model_entry", "run", "serve_limits"]

_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def serve_limits(manifest: dict) -> dict:
    """Per-bundle limits: a ``serve`` table in the manifest (or in its profile summary), else the defaults."""
    table = manifest.get("serve") or ((manifest.get("profile") or {}).get("summary") or {}).get("serve") or {}
    cap = table.get("max_tokens", DEFAULT_MAX_TOKENS_CAP)
    default = table.get("default_max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise InputError(f"manifest serve.max_tokens must be a positive integer, got {cap!r}")
    if not isinstance(default, int) or isinstance(default, bool) or default < 1:
        raise InputError(f"manifest serve.default_max_tokens must be a positive integer, got {default!r}")
    return {"max_tokens_cap": cap, "default_max_tokens": min(default, cap)}


def model_entry(name: str, session) -> ModelEntry:
    """Wrap a loaded session: GGUF bundles are LLMs; feature-extraction bundles are embedding models."""
    bundle = session.bundle
    task = bundle.manifest.model.task
    if bundle.format == "gguf":
        kind = "llm"
    elif task == "feature-extraction":
        kind = "embedding"
    else:
        raise InputError(f"bundle {bundle.path} ({bundle.format}, task {task!r}) is neither an LLM (GGUF) nor a "
                         "text-embedding model: edgesdk serve answers chat/completions and embeddings only")
    limits = serve_limits(bundle.manifest.to_dict())
    if kind == "llm":
        n_ctx = int((getattr(session.backend, "settings", None) or {}).get("n_ctx") or limits["max_tokens_cap"])
        limits["max_tokens_cap"] = min(limits["max_tokens_cap"], n_ctx)
        limits["default_max_tokens"] = min(limits["default_max_tokens"], limits["max_tokens_cap"])
    return ModelEntry(name=name, session=session, kind=kind, **limits)


def load_models(bundles: list[str | Path], names: list[str] | None = None, *, profile: str | None = None,
                threads: int | None = None) -> list[ModelEntry]:
    """Load each bundle with :func:`edgesdk.load`; a model's name is its directory name unless ``names`` says."""
    import edgesdk

    names = list(names or [])
    if len(names) > len(bundles):
        raise InputError(f"{len(names)} --name values for {len(bundles)} bundles")
    entries: list[ModelEntry] = []
    seen: set[str] = set()
    for i, path in enumerate(bundles):
        path = Path(path)
        name = names[i] if i < len(names) else path.resolve().name
        if not name or not set(name) <= _NAME_OK:
            raise InputError(f"model name {name!r} may hold only letters, digits and -_.: (use --name)")
        if name in seen:
            raise InputError(f"two bundles are both named {name!r}: give each a --name")
        seen.add(name)
        options = {"threads": threads} if threads else {}
        session = edgesdk.load(path, profile=profile, **options)
        entries.append(model_entry(name, session))
    return entries


def run(entries: list[ModelEntry], config: ServeConfig, *, shutdown_timeout_s: float = 30.0,
        log_level: str = "info") -> None:
    """Serve until SIGTERM/SIGINT: then refuse new requests (503), let in-flight ones finish for up to
    ``shutdown_timeout_s``, cancel the rest, stop the workers and flush telemetry."""
    import uvicorn

    app = create_app(entries, config)
    state = app.state.server

    class _Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame):  # uvicorn's public signal hook: start draining first
            state.draining = True
            super().handle_exit(sig, frame)

    # uvicorn annotates timeout_graceful_shutdown as int; it goes to asyncio.timeout(), which takes a float
    ucfg = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                          timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
                          access_log=log_level == "debug", server_header=False, lifespan="on")
    server = _Uvicorn(ucfg)
    # uvicorn re-raises the signal it handled once it has shut down; a quiet handler here lets the
    # command return normally (exit code 0, atexit telemetry flush) after a graceful SIGTERM.
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM,)} if main else {}
    try:
        for sig in previous:
            signal.signal(sig, lambda *_: None)
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
