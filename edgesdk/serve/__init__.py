# SPDX-License-Identifier: Apache-2.0
"""``edgesdk serve``: an OpenAI-compatible HTTP server over loaded bundles (Starlette + uvicorn).

Usage::

    from edgesdk.serve import load_models, create_app, run
    entries = load_models(["out/llm-nano", "out/minilm"])      # names: the bundle directory names
    run(entries, ServeConfig(port=8080))                       # blocks; SIGTERM drains and exits

GGUF bundles answer ``/v1/chat/completions`` and ``/v1/completions``; VLM bundles answer them too, with
``image_url`` parts in chat messages (:mod:`edgesdk.serve.images`), one request at a time; text-encoder bundles
answer ``/v1/embeddings``. docs/serve.md has the limits, back-pressure and telemetry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import json
import signal
import socket
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import InputError
from edgesdk.manifest import Manifest
from edgesdk.serve.app import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TOKENS_CAP,
    ModelEntry,
    ServeConfig,
    create_app,
)

__all__ = [
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

_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def serve_limits(manifest: Manifest) -> dict:
    """Per-bundle limits: a ``serve`` table in the manifest (or in its profile summary), else the defaults."""
    table, where = manifest.serve_table()
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise InputError(
            f"manifest {where} must be a table of limits (max_tokens, default_max_tokens), got {_show(table)}"
        )
    cap = table.get("max_tokens", DEFAULT_MAX_TOKENS_CAP)
    default = table.get("default_max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise InputError(f"manifest {where}.max_tokens must be a positive integer, got {_show(cap)}")
    if not isinstance(default, int) or isinstance(default, bool) or default < 1:
        raise InputError(f"manifest {where}.default_max_tokens must be a positive integer, got {_show(default)}")
    return {"max_tokens_cap": cap, "default_max_tokens": min(default, cap)}


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def model_entry(name: str, session, *, allow_local_images: Path | None = None) -> ModelEntry:
    """Wrap a loaded session: GGUF and VLM bundles are LLMs (a VLM's chats take images: its entry's
    ``images`` policy, local files only under ``allow_local_images``); feature-extraction bundles are embedding
    models."""
    bundle = session.bundle
    task = bundle.manifest.model.task
    images = None
    if bundle.format == "vlm":
        from edgesdk.serve.images import vlm_policy

        kind, images = "llm", vlm_policy(session, allow_local_images)
    elif bundle.format == "gguf":
        kind = "llm"
    elif task == "feature-extraction":
        kind = "embedding"
    else:
        raise InputError(
            f"bundle {bundle.path} ({bundle.format}, task {task!r}) is neither an LLM (GGUF), a VLM "
            "nor a text-embedding model: edgesdk serve answers chat/completions and embeddings only"
        )
    limits = serve_limits(bundle.manifest)
    if kind == "llm":
        # the context: the llama.cpp session's settings; a VLM's report
        settings = getattr(session.backend, "settings", None) or (
            session.backend.report() if bundle.format == "vlm" else {}
        )
        n_ctx = int(settings.get("n_ctx") or limits["max_tokens_cap"])
        limits["max_tokens_cap"] = min(limits["max_tokens_cap"], n_ctx)
        limits["default_max_tokens"] = min(limits["default_max_tokens"], limits["max_tokens_cap"])
    return ModelEntry(name=name, session=session, kind=kind, images=images, **limits)


def load_models(
    bundles: list[str | Path],
    names: list[str] | None = None,
    *,
    profile: str | None = None,
    threads: int | None = None,
    chat_template: str | None = None,
    allow_local_images: str | Path | None = None,
    llm_options: dict | None = None,
) -> list[ModelEntry]:
    """Load each bundle with :func:`edgesdk.load`; a model's name is its directory name unless ``names`` says.

    ``chat_template`` (a shipped name or a Jinja file) formats the chats of every GGUF bundle, over the one
    bundled at build time or the GGUF's own; with no GGUF bundle to apply it to it is refused.
    ``allow_local_images``: a directory whose files VLM chats may name as ``image_url`` (else data URLs only).
    ``llm_options``: load options of the LLM bundles (``n_ctx``, ``n_gpu_layers`` for GGUF and VLM bundles;
    ``speculative`` for GGUF ones); refused when no bundle takes them."""
    import edgesdk
    from edgesdk.bundle import open_bundle
    from edgesdk.runtime.session import check_load_options
    from edgesdk.serve.images import allowed_dir

    if threads is not None:
        check_load_options({"threads": threads})  # before any bundle is loaded: --threads -4 fails at once
    if chat_template is not None:
        from edgesdk.formats.gguf.chat_templates import resolve

        resolve(chat_template)  # a bad name or file fails before any bundle is loaded
    local = allowed_dir(allow_local_images)
    formats = [open_bundle(p, verify=False).format for p in bundles]  # the manifests only
    if chat_template is not None and "gguf" not in formats:
        raise InputError(
            f"--chat-template formats the chats of GGUF bundles; none of these is one "
            f"({', '.join(sorted(set(formats)))})"
        )
    llm_options = dict(llm_options or {})
    if llm_options and not {"gguf", "vlm"} & set(formats):
        raise InputError(f"{', '.join(sorted(llm_options))} apply to LLM bundles; none of these is one")
    if "speculative" in llm_options and "gguf" not in formats:
        raise InputError("--speculative applies to GGUF bundles; none of these is one")
    if local is not None and "vlm" not in formats:
        raise InputError("--allow-local-images lets VLM chats name image files; none of these bundles is a VLM")
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
        options: dict = {"threads": threads} if threads is not None else {}
        if chat_template is not None and formats[i] == "gguf":
            options["chat_template"] = chat_template
        if formats[i] in ("gguf", "vlm"):
            options.update({k: v for k, v in llm_options.items() if formats[i] == "gguf" or k != "speculative"})
        session = edgesdk.load(path, profile=profile, **options)
        entries.append(model_entry(name, session, allow_local_images=local))
    return entries


@dataclass(frozen=True)
class ConnectionLimits:
    """How long the server waits for a client and how many connections it holds (docs/security.md).

    uvicorn itself closes an idle keep-alive connection after a response but has no deadline for a
    request's headers or body and no cap on open connections: a client that connects and sends nothing,
    or trickles its headers (slowloris), held a connection for ever. ``header_timeout_s`` runs from the
    connection (or from the first byte of a later request on it) to the end of the request's headers;
    ``body_timeout_s`` from the end of the headers to the end of the body (408 and the connection closed);
    ``keep_alive_s`` is uvicorn's idle time between requests.

    Caps (issue 34 item 5: one client re-opening 260 silent sockets kept every other client out of a global
    cap of 256): one client address holds at most ``max_connections_per_client`` connections (as nginx's
    ``limit_conn``), all clients together ``max_connections``. When either is reached, the connection idle the
    longest (waiting for a request head: nothing in flight) is closed to make room (that client's own, for
    the per-client cap), with a 503 when nothing of ours was written on it; only when every such connection
    has a request in flight is the new one answered 503 and closed. 128 per client: a benchmark of 64
    concurrent streams from one host, its probes and an idle pool beside them fit. :func:`run` lowers
    ``max_connections`` to fit the process's file-descriptor limit (:func:`connection_cap`)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 5
    max_connections: int = 1024
    max_connections_per_client: int = 128

    def __post_init__(self) -> None:
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "max_connections",
            "max_connections_per_client",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InputError(f"ConnectionLimits.{name} must be a positive number, got {value!r}")


def _http_error(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response (OpenAI error shape) written straight to a socket, then closed."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "service_unavailable",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n" + ("retry-after: 1\r\n" if status == 503 else "") + "\r\n"
    )
    return head.encode("ascii") + body


_HEADERS_TIMEOUT = _http_error(408, "Request Timeout", "the request headers did not arrive in time", "request_timeout")
_TOO_MANY = _http_error(503, "Service Unavailable", "too many open connections", "too_many_connections")
_TOO_MANY_HERE = _http_error(
    503, "Service Unavailable", "too many open connections from your address", "too_many_connections"
)
_EVICTED = _http_error(
    503, "Service Unavailable", "closed while idle to make room for another connection", "too_many_connections"
)
FD_RESERVE = 128  # file descriptors kept for models, logs, telemetry and the event loop beside the connections


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, or fewer where the process's file-descriptor limit (RLIMIT_NOFILE) could not
    hold them with :data:`FD_RESERVE` to spare. The soft limit is raised towards the hard one first (as
    servers do: the soft limit is often 1024)."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to ask
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


class _Watched:
    """The transport handed to uvicorn's protocol: every call goes to the real one; writing a final
    response's status line marks the connection as answering (so the next bytes from the client start a
    new request head)."""

    def __init__(self, transport: asyncio.Transport, owner: _GuardedProtocol):
        self._transport, self._owner = transport, owner

    def write(self, data) -> None:
        self._owner.wrote(data)
        self._transport.write(data)

    def writelines(self, lines) -> None:
        lines = list(lines)
        self._owner.wrote(lines[0] if lines else b"")
        self._transport.writelines(lines)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class _Open:
    """Connections open now, shared by every protocol of one server: how many, how many per client address,
    and those waiting for a request head, longest waiting first (the ones to close when the table is full)."""

    def __init__(self) -> None:
        self.count = 0
        self.per_client: dict[str, int] = {}
        self.waiting: OrderedDict[int, _GuardedProtocol] = OrderedDict()
        self.evicted = 0  # idle connections closed to make room (for tests and logs)

    def evict_idle(self, client: str | None = None) -> bool:
        """Close the connection (of ``client``, when given) that has waited longest for a request head; False
        when none waits."""
        for key, proto in list(self.waiting.items()):
            if client is not None and proto.client != client:
                continue
            del self.waiting[key]
            if proto.evict():
                self.evicted += 1
                return True
        return False


class _GuardedProtocol(asyncio.Protocol):
    """uvicorn's HTTP protocol (``inner``) behind a connection cap and a request-head deadline. Only the
    asyncio.Protocol interface of ``inner`` is used, so any uvicorn HTTP/1.1 implementation fits.

    A head ends at its blank line; a new one starts with the first byte the client sends after the server
    has written a final status line. Pipelined requests (a second head sent before the first answer, which
    no common client does) would be seen late and could be closed by the deadline."""

    def __init__(self, inner_cls, limits: ConnectionLimits, open_: _Open, **kwargs):
        self._inner = inner_cls(**kwargs)
        self._limits, self._open = limits, open_
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._in_head = True  # waiting for the end of a request head (a connection starts that way)
        self._answered = False  # the server wrote since the last head ended
        self._ever_wrote = False
        self._tail = b""
        self.client: str | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else None
        too_many = None
        if (
            client is not None
            and self._open.per_client.get(client, 0) >= self._limits.max_connections_per_client
            and not self._open.evict_idle(client)
        ):
            too_many = _TOO_MANY_HERE
        elif self._open.count >= self._limits.max_connections and not self._open.evict_idle():
            too_many = _TOO_MANY
        if too_many is not None:
            self._refused = True
            transport.write(too_many)
            transport.close()
            return
        self._open.count += 1
        if client is not None:
            self.client = client
            self._open.per_client[client] = self._open.per_client.get(client, 0) + 1
        self._transport = transport
        self._start_timer()
        self._inner.connection_made(_Watched(transport, self))

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_head and self._answered:  # a new request on a kept-alive connection
            self._in_head, self._answered, self._tail = True, False, b""
            self._start_timer()
        if self._in_head:
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._in_head = False
                self._stop_timer()
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self):
        return None if self._refused else self._inner.eof_received()

    def connection_lost(self, exc) -> None:
        if self._refused:
            return
        self._open.count -= 1
        if self.client is not None:
            left = self._open.per_client.pop(self.client) - 1
            if left:
                self._open.per_client[self.client] = left
        self._stop_timer()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._inner.resume_writing()

    # -- the deadline
    def wrote(self, data) -> None:
        self._ever_wrote = True
        start = bytes(data[:10])
        # a final status line ("HTTP/1.1 200 "), not "HTTP/1.1 100 Continue", whose body is still to come
        if not self._in_head and start.startswith(b"HTTP/") and start[9:10] != b"1":
            self._answered = True

    def _start_timer(self) -> None:  # a wait for a request head starts: the connection is idle
        self._stop_timer()
        self._timer = asyncio.get_running_loop().call_later(self._limits.header_timeout_s, self._expired)
        self._open.waiting[id(self)] = self  # (re-)entered last: the longest waiting stay first
        self._open.waiting.move_to_end(id(self))

    def _stop_timer(self) -> None:  # the head arrived (a request in flight) or the connection is gone
        self._open.waiting.pop(id(self), None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def evict(self) -> bool:
        """Close this idle connection to make room (a 503 first when nothing of ours was written on it);
        False when it is already closing or has a request in flight."""
        transport = self._transport
        if transport is None or transport.is_closing() or not self._in_head:
            return False
        self._stop_timer()
        if not self._ever_wrote:
            transport.write(_EVICTED)
        transport.close()
        return True

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing() or not self._in_head:
            return
        if not self._ever_wrote:  # nothing of ours on the wire yet: say why before closing
            transport.write(_HEADERS_TIMEOUT)
        transport.close()


class _BodyDeadline:
    """ASGI middleware: a request body that has not fully arrived ``timeout_s`` after its headers gets 408
    (and ``connection: close``); what the app sent meanwhile is dropped. Reading stops being timed once the
    body is complete: the app then waits on ``receive`` for the client's disconnect, for as long as it runs."""

    def __init__(self, app, timeout_s: float):
        self.app, self.timeout_s = app, timeout_s

    def __getattr__(self, name: str):  # app.state and the like
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = timed_out = started = False

        async def timed_receive():
            nonlocal body_done, timed_out
            if timed_out:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}  # the app stops reading as if the client had gone
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message):
            nonlocal started
            if timed_out:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not timed_out:
                raise
        if timed_out and not started:
            body = json.dumps(
                {
                    "error": {
                        "message": f"the request body did not arrive within {self.timeout_s:g} s",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "request_timeout",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 408,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"connection", b"close"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host``:``port`` (every address the name resolves to, as uvicorn binds them),
    bound before the server starts so that a taken port is one :class:`InputError` (exit 3), not uvicorn's
    log and exit."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError(f"cannot listen on {where}: {getattr(exc, 'strerror', None) or exc} (check --host)") from None
    sockets: list[socket.socket] = []
    seen: set = set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            if port == 0:  # one address: a second bind would get another port
                break
    except OSError as exc:
        for sock in sockets:
            sock.close()
        why = {
            errno.EADDRINUSE: "the address is already in use (another server? pick another --port)",
            errno.EACCES: "permission denied (ports below 1024 need privileges)",
            errno.EADDRNOTAVAIL: "the address is not one of this machine's (check --host)",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise InputError(f"cannot listen on {where}: {why}") from None
    return sockets


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
        limits = ConnectionLimits(
            max_connections=config.max_connections, max_connections_per_client=config.max_connections_per_client
        )
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
            _BodyDeadline(app, limits.body_timeout_s),
            host=config.host,
            port=config.port,
            log_level=log_level,
            timeout_graceful_shutdown=shutdown_timeout_s,  # type: ignore[arg-type]
            timeout_keep_alive=limits.keep_alive_s,
            access_log=log_level == "debug",
            server_header=False,
            lifespan="on",
        )
        ucfg.load()  # picks uvicorn's HTTP protocol class, which the guard then wraps
        ucfg.http_protocol_class = functools.partial(  # type: ignore[assignment]
            _GuardedProtocol, ucfg.http_protocol_class, limits, _Open()
        )
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
