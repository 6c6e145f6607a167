# SPDX-License-Identifier: Apache-2.0
"""Running ``edgesdk serve``: the app of :func:`edgesdk.serve.app.create_app` under uvicorn, on sockets bound
beforehand, behind the connection guard (:mod:`edgesdk.serve.connections`), draining on SIGTERM/SIGINT."""

from __future__ import annotations

import dataclasses
import signal
import socket
import threading

from edgesdk.serve.app import create_app
from edgesdk.serve.config import ModelEntry, ServeConfig
from edgesdk.serve.connections import (
    ConnectionLimits,
    bind_sockets,
    connection_cap,
    guard,
    with_body_deadline,
)

__all__ = ["run"]


def run(
    entries: list[ModelEntry],
    config: ServeConfig,
    *,
    shutdown_timeout_s: float = 30.0,
    log_level: str = "info",
    limits: ConnectionLimits | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT: then refuse new requests (503), let in-flight ones finish for up to
    ``shutdown_timeout_s``, cancel the rest, stop the workers and flush telemetry. ``limits``: the
    header/body deadlines and connection cap (:class:`ConnectionLimits`; its defaults otherwise).
    ``sockets``: from :func:`bind_sockets`, called before the models are loaded so that a taken port fails
    at once (default: bound here); they are closed when the server stops."""
    import logging

    import uvicorn

    if limits is None:
        limits = ConnectionLimits.of(config)
    cap = connection_cap(limits.max_connections)
    if cap < limits.max_connections:
        logging.getLogger("uvicorn.error").warning(
            "at most %d open connections (not %d): the file-descriptor limit (ulimit -n) holds no more",
            cap,
            limits.max_connections,
        )
        limits = dataclasses.replace(limits, max_connections=cap)
    if sockets is None:
        sockets = bind_sockets(config.host, config.port)  # a taken port: one error line, nothing started
    try:
        app = create_app(entries, config)
        state = app.state.server

        class _Uvicorn(uvicorn.Server):
            def handle_exit(self, sig, frame):  # uvicorn's public signal hook: start draining first
                state.draining = True
                super().handle_exit(sig, frame)

        # uvicorn annotates timeout_graceful_shutdown as int; it goes to asyncio.timeout(), which takes a float
        ucfg = uvicorn.Config(
            with_body_deadline(app, limits.body_timeout_s),
            host=config.host,
            port=config.port,
            log_level=log_level,
            timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
            timeout_keep_alive=limits.keep_alive_s,
            access_log=log_level == "debug",
            server_header=False,
            lifespan="on",
        )
        guard(ucfg, limits)  # loads the config: uvicorn's HTTP protocol class, behind the connection guard
        server = _Uvicorn(ucfg)
        for sock in sockets:
            host, port = sock.getsockname()[:2]
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", f"[{host}]" if ":" in host else host, port
            )
        # uvicorn re-raises the signal it handled once it has shut down; a quiet handler here lets the
        # command return normally (exit code 0, atexit telemetry flush) after a graceful SIGTERM.
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM,)} if main else {}
        try:
            for sig in previous:
                signal.signal(sig, lambda *_: None)
            server.run(sockets=sockets)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        for sock in sockets:
            sock.close()
