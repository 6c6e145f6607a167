# SPDX-License-Identifier: Apache-2.0
"""What ``edgesdk serve`` answers while its models load: ``GET /health`` is 503 ``{"status": "loading"}`` (with
llama-server's error object beside it), every other route 503 in OpenAI's error shape with ``Retry-After``, behind
the same Host allow-list, API key and connection guard as the real app. Once the models are loaded this server
stops and the real one takes over the same listening sockets (connections that arrive in between wait in the
socket's backlog: none is refused).

Without it the port was bound (:func:`edgesdk.serve.bind_sockets`, so that a taken port fails at once) but nothing
accepted: a probe's connection hung until the models were in (issue 39: 13 probes timed out over 14 s).

Usage (``edgesdk serve`` does this)::

    sockets = bind_sockets(host, port)
    with answering_while_loading(sockets, config):
        entries = load_models(...)
    run(entries, config, sockets=sockets)
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgesdk.serve.app import _Server, middleware_stack
from edgesdk.serve.config import ServeConfig
from edgesdk.serve.connections import ConnectionLimits, guard
from edgesdk.serve.protocol import APIError

RETRY_AFTER_S = 1
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def loading_health() -> JSONResponse:
    """``/health`` while loading: ``{"status": "loading"}``, and llama-server's error object for its clients."""
    return JSONResponse(
        {
            "status": "loading",
            "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"},
        },
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def create_loading_app(config: ServeConfig) -> Starlette:
    """The app of the loading phase: ``/health`` -> :func:`loading_health`; anything else -> 503
    ``model_loading`` (an unknown path too: the routes are not known yet), behind the real app's guard."""
    server = _Server([], config)

    async def health(request: Request) -> Response:
        return loading_health()

    async def loading(request: Request) -> Response:
        return APIError(
            503,
            "the server is loading its models; try again shortly (GET /health answers 200 once they are ready)",
            "unavailable_error",
            code="model_loading",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ).response()

    routes = [Route("/health", health, methods=["GET"]), Route("/{path:path}", loading, methods=_METHODS)]
    middleware = middleware_stack(server, routes, frozenset(), config)
    return Starlette(routes=routes, middleware=middleware)


@contextlib.contextmanager
def answering_while_loading(sockets: list[socket.socket], config: ServeConfig) -> Iterator[None]:
    """Serve :func:`create_loading_app` on ``sockets`` (duplicates of them: the originals stay open and listening
    for the real server) from a thread until the block ends, then stop it (about 0.3 s)."""
    import uvicorn

    dups = [s.dup() for s in sockets]
    ucfg = uvicorn.Config(
        create_loading_app(config),
        log_config=None,  # the real server configures logging; nothing of this one is worth a line
        access_log=False,
        server_header=False,
        lifespan="off",
        timeout_keep_alive=1,
        timeout_graceful_shutdown=2,
    )
    guard(ucfg, ConnectionLimits.of(config))
    server = uvicorn.Server(ucfg)
    thread = threading.Thread(target=server.run, kwargs={"sockets": dups}, name="edgesdk-serve-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
        for s in dups:  # (uvicorn closed them; a thread that never started did not)
            s.close()
