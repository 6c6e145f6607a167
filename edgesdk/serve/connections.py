# SPDX-License-Identifier: Apache-2.0
"""The connection layer of ``edgesdk serve``, below the ASGI app: the listening sockets, the file-descriptor cap and
a guard around uvicorn's HTTP/1.1 protocol (request-head deadline, connection caps, a body deadline as ASGI
middleware). docs/security.md says what each limit answers.

Usage (:func:`edgesdk.serve.run` and the loading server of :mod:`edgesdk.serve.loading` do this)::

    sockets = bind_sockets(host, port)                   # a taken port: one InputError
    limits = ConnectionLimits.of(config)                  # the config's caps, the default deadlines
    ucfg = uvicorn.Config(with_body_deadline(app, limits.body_timeout_s), ...)
    guard(ucfg, limits)                                   # uvicorn's protocol behind the caps and head deadline
    uvicorn.Server(ucfg).run(sockets=sockets)
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import socket
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgesdk.errors import InputError

if TYPE_CHECKING:
    import uvicorn

    from edgesdk.serve.config import ServeConfig

__all__ = [
    "FD_RESERVE",
    "ConnectionLimits",
    "bind_sockets",
    "connection_cap",
    "guard",
    "with_body_deadline",
]


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
    concurrent streams from one host, its probes and an idle pool beside them fit. :func:`edgesdk.serve.run` lowers
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

    @classmethod
    def of(cls, config: ServeConfig) -> ConnectionLimits:
        """The caps ``config`` sets (``max_connections``, ``max_connections_per_client``), the default deadlines."""
        return cls(max_connections=config.max_connections, max_connections_per_client=config.max_connections_per_client)


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


def guard(ucfg: uvicorn.Config, limits: ConnectionLimits) -> None:
    """Load ``ucfg`` (which picks uvicorn's HTTP protocol class) and put that protocol behind ``limits``' connection
    caps and request-head deadline: one table of open connections for the server ``ucfg`` configures."""
    ucfg.load()
    ucfg.http_protocol_class = functools.partial(  # type: ignore[assignment]
        _GuardedProtocol, ucfg.http_protocol_class, limits, _Open()
    )


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


def with_body_deadline(app, timeout_s: float):
    """``app`` behind the request-body deadline (ASGI middleware): a body not fully arrived ``timeout_s`` after its
    headers gets 408 and ``connection: close``."""
    return _BodyDeadline(app, timeout_s)


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
