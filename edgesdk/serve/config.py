# SPDX-License-Identifier: Apache-2.0
"""What ``edgesdk serve`` is started with: the server's settings (:class:`ServeConfig`, with the Host and Origin
checks its ``--allowed-host`` / ``--cors-origin`` values go through) and the served models (:class:`ModelEntry`).

The request-independent half of the server: the request fields are :mod:`edgesdk.serve.fields`, their parsing
:mod:`edgesdk.serve.protocol`, the handlers :mod:`edgesdk.serve.routes`, the ASGI app :mod:`edgesdk.serve.app`.
"""

from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import InputError
from edgesdk.serve.batch_worker import BatchWorker
from edgesdk.serve.workers import DEFAULT_REQUEST_TIMEOUT_S, EmbeddingBatcher, LLMWorker

# Documented defaults (docs/serve.md); a bundle's manifest may lower/raise them with a "serve" table.
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB of JSON per request
DEFAULT_MAX_TOKENS_CAP = 2048  # most tokens one request may ask for
DEFAULT_MAX_TOKENS = 256  # when the request gives none
DEFAULT_QUEUE = 16  # LLM requests waiting behind the running one
DEFAULT_MAX_CONNECTIONS = 1024  # open connections, all clients (lowered to fit the file-descriptor limit)
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 128  # open connections from one client address (as nginx's limit_conn)
MAX_PARALLEL = 256  # serve --parallel: sequences per LLM


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue: int = DEFAULT_QUEUE
    max_batch: int = 32
    max_wait_ms: float = 5.0
    max_pending_embeddings: int = 1024
    tracer_provider: Any = None  # None: edgesdk.telemetry's provider when it offers one, else the global one
    prompt_cache_mb: float | None = None  # per LLM; None: the profile's policy.llm.prompt_cache_mb, else off; 0: off
    untraced: tuple[str, ...] | None = None  # URL regexes with no plain HTTP span; None: see untraced_patterns()
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides localhost and IP addresses; "*": any
    cors_origins: tuple[str, ...] = ()  # origins that get CORS answers ("*": any); none: no CORS at all
    parallel: int | None = None  # sequences per LLM decoded together; None: decide_parallel() (the plan's); 1: one
    prefix_reuse: bool = True  # batched LLMs: a slot keeps its last prompt's KV cells for a request sharing it
    # Connection caps (edgesdk.serve.ConnectionLimits, docs/security.md); no serve option yet: the Python API sets
    # them. Behind a reverse proxy every connection comes from the proxy's address: raise the per-client cap.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    # serve --request-timeout: wall-clock seconds a generation request may take, queueing included; past it the
    # request ends (504, or an error event mid-stream) and its slot is freed. None: no limit.
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S

    def __post_init__(self) -> None:
        t = self.request_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise InputError(f"request_timeout_s must be a positive number of seconds (or None), got {t!r}")
        for name in ("max_connections", "max_connections_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if self.parallel is not None and (
            isinstance(self.parallel, bool)
            or not isinstance(self.parallel, int)
            or not 1 <= self.parallel <= MAX_PARALLEL
        ):
            raise InputError(f"parallel must be an integer from 1 to {MAX_PARALLEL}, got {self.parallel!r}")
        if self.api_key is not None and (not self.api_key.strip() or self.api_key != self.api_key.strip()):
            raise InputError(
                "the API key is empty or has surrounding whitespace: an empty key would turn "
                "authentication off (give a key, or leave --api-key and EDGESDK_API_KEY out)"
            )
        self.allowed_hosts = tuple(check_allowed_host(h) for h in self.allowed_hosts)
        self.cors_origins = tuple(check_cors_origin(o) for o in self.cors_origins)


# Host names a browser only sends for this machine (RFC 6761: *.localhost is loopback); IP literals are
# answered too: DNS rebinding needs a name the attacker controls (docs/security.md, "The server").
HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")
_ORIGIN = re.compile(r"^https?://(\[[0-9a-f:.]+\]|[a-z0-9_]([a-z0-9_.-]{0,252}))(:[0-9]{1,5})?$")


def check_allowed_host(value: str) -> str:
    """A ``--allowed-host`` value: a host name or IP address (no port, no scheme), or ``*``; lower case."""
    v = str(value).strip().lower().rstrip(".")
    if v == "*" or HOST_NAME.match(v) or _ip_literal(v.strip("[]")):
        return v.strip("[]")
    raise InputError(f"--allowed-host {value!r} is not a host name or IP address (no scheme or port; '*' for any)")


def check_cors_origin(value: str) -> str:
    """A ``--cors-origin`` value: ``scheme://host[:port]`` as browsers send it in ``Origin``, or ``*``."""
    v = str(value).strip()
    if v == "*" or _ORIGIN.match(v.lower()):
        return v.lower()
    raise InputError(
        f"--cors-origin {value!r} is not an origin (scheme://host[:port], http or https, no path; '*' for any)"
    )


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(header: str | None) -> str | None:
    """The host of a ``Host`` header (port and IPv6 brackets removed, lower case, no trailing dot); None when
    it is missing or malformed."""
    v = (header or "").strip().lower()
    if v.startswith("["):
        end = v.find("]")
        name, port = (v[1:end], v[end + 1 :]) if end > 0 else ("", "")
        if not _ip_literal(name):
            return None
        return name if port == "" or re.fullmatch(r":[0-9]{1,5}", port) else None
    name, _, port = v.partition(":")
    if port and not re.fullmatch(r"[0-9]{1,5}", port):
        return None
    name = name.rstrip(".")
    return name if HOST_NAME.match(name) or _ip_literal(name) else None


def host_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return name == "localhost" or name.endswith(".localhost") or _ip_literal(name) or name in allowed or "*" in allowed


@dataclass
class ModelEntry:
    """A bundle served under ``name``: ``kind`` is "llm" (GGUF) or "embedding" (text encoder)."""

    name: str
    session: Any
    kind: str
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    created: int = field(default_factory=lambda: int(time.time()))
    worker: LLMWorker | BatchWorker | None = None
    batcher: EmbeddingBatcher | None = None
    prompt_cache: Any = None  # edgesdk.serve.prompt_cache.PromptCache when enabled
    parallel: int | None = None  # LLMs: sequences decoded together (set at start: ServeConfig / decide_parallel)
    parallel_reason: str = ""
    images: Any = None  # a VLM's edgesdk.serve.images.ImagePolicy (image_url parts); None: text only

    @property
    def provider(self) -> str:
        from edgesdk.runtime.session import Session

        return self.session.backend.provider if isinstance(self.session, Session) else "edgesdk"
