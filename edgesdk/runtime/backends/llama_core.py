# SPDX-License-Identifier: Apache-2.0
"""The llama.cpp core the GGUF backend (:mod:`edgesdk.runtime.backends.llamacpp`) and the VLM backend
(:mod:`edgesdk.runtime.backends.vlm.backend`) share: llama-cpp-python imported for a loader with llama.cpp's log
routed. Both then run their decoder in a :class:`~edgesdk.runtime.batching.BatchEngine` on its
:class:`~edgesdk.runtime.batching.Weights`, and do alike what stands in front of it: a request's pieces read under
its GenAI span (:class:`RecordedPieces`), ``chat`` and a request's recorder (:class:`EngineFront`). (Empty stop
strings are dropped where every request is checked, :func:`edgesdk.runtime.requests.check_stop`.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError
from edgesdk.native import import_llama_cpp, route_llama_logs

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from edgesdk.runtime.backend import GenerationOptions
    from edgesdk.runtime.batching import BatchHandle, GenerationResult
    from edgesdk.runtime.requests import GenerationRequest


def load_llama_cpp(what: str, *, verbose: bool) -> Any:
    """``llama_cpp`` for the loader of ``what`` (``"a GGUF bundle"``, ``"a VLM bundle"``): the ``gguf`` extra required,
    the module imported (:class:`BackendUnavailableError` when it is installed but its native library does not load),
    and llama.cpp's log lines routed (stderr only when ``verbose``; :func:`edgesdk.native.route_llama_logs`)."""
    from edgesdk.extras import require

    require("gguf", "llama_cpp", what)
    try:
        llama_cpp = import_llama_cpp()
    except (ImportError, OSError) as exc:  # installed, but its native library does not load
        raise BackendUnavailableError(f"llama-cpp-python is installed but does not load: {exc}") from exc
    route_llama_logs(verbose)
    return llama_cpp


class RecordedPieces:
    """The text pieces of one engine request (its :class:`~edgesdk.runtime.batching.BatchHandle`) under its GenAI
    recorder ``rec``: each piece a ``rec.chunk()``, the first one also ``on_first()`` (default ``rec.first_chunk``).
    Closing the iteration early cancels the request (its slot is free at the engine's next step). After the
    iteration, however it ended, ``result`` is the request's :class:`~edgesdk.runtime.batching.GenerationResult`
    (None when a cancelled one did not end within 60 s). The backend's own generator delegates to it
    (``yield from``) and reads ``result`` in its ``finally`` to close the span."""

    def __init__(self, handle: BatchHandle, rec: Any, on_first: Callable[[], None] | None = None) -> None:
        self.handle = handle
        self._rec = rec
        self._on_first = on_first if on_first is not None else rec.first_chunk
        self.result: GenerationResult | None = None

    def __iter__(self) -> Generator[str, None, None]:
        first = True
        try:
            for piece in self.handle:
                self._rec.chunk()
                if first:
                    self._on_first()
                    first = False
                yield piece
        except GeneratorExit:
            self.handle.cancel()
            raise
        finally:
            with contextlib.suppress(TimeoutError):
                self.result = self.handle.result(timeout=60.0)  # cancelled: ends at the engine's next step


class EngineFront:
    """What both llama.cpp backends do alike in front of their engine: ``chat`` as
    :class:`~edgesdk.runtime.backend.LLMBackend` has it (the backend's ``_chat`` makes ``messages`` one request and
    returns its pieces; the reply is their text, or the pieces with ``stream=True``) and a request's telemetry
    :meth:`recorder`, from the backend's ``provider``, ``_model`` and ``_attrs`` (its GenAI span attributes)."""

    provider: str
    _model: str
    _attrs: dict[str, Any]

    def chat(
        self,
        messages: list[dict[str, Any]],
        chat_template: str | None = None,
        *,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> str | Iterator[str]:
        """Reply to ``messages`` (formatted as the backend's ``_chat`` says, ``chat_template`` included)."""
        gen = self._chat(messages, chat_template, stream, options)
        return gen if stream else "".join(gen)

    def _chat(
        self, messages: list[dict[str, Any]], chat_template: str | None, stream: bool, options: GenerationOptions
    ) -> Iterator[str]:
        raise NotImplementedError

    def recorder(self, request: GenerationRequest, operation: str | None = None) -> Any:
        """The telemetry recorder (GenAI span and metrics) of one request, not yet started, never made the current
        span (a stream's, or one the engine's thread ends)."""
        return telemetry.inference(
            operation or ("chat" if request.messages is not None else "text_completion"),
            self._model,
            self.provider,
            stream=request.stream,
            request=request.telemetry_record(),
            attributes=self._attrs,
            attach=False,
        )
