# SPDX-License-Identifier: Apache-2.0
"""llama-server's operational endpoints, for scripts written against it: ``POST /tokenize``, ``POST /detokenize``,
``POST /apply-template``, ``GET /props`` and ``GET /slots``, with llama-server's request and response shapes
(llama.cpp's tools/server/README.md) and this server's limits (the body limit, the Host/API-key guard, 400 in
OpenAI's error shape for anything malformed).

They serve the GGUF (llama.cpp) models only. Which model: the request's ``model`` field (POST) or ``?model=NAME``
(GET), as llama-server's router mode takes it; with one LLM served it may be left out.

Everything here goes through the public faces of what the server already holds: the batch engine's ``tokenize``,
``piece``, ``slots``, ``busy``, ``settings`` (every GGUF model is served by its engine, one slot with
``--parallel 1``); the backend's ``tokenize``, ``encode`` and ``settings``. A worker without an engine would have
no public detokenizer: ``/detokenize``, ``with_pieces`` and ``/apply-template`` then answer 400 naming it. ``/slots``
knows how many slots are busy but not which (the engine says how many): the lowest ids are shown busy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.backend import BatchingBackend
from edgesdk.runtime.requests import DEFAULT_SAMPLING, INT32_MAX
from edgesdk.serve.batch_worker import BatchWorker
from edgesdk.serve.config import ModelEntry
from edgesdk.serve.protocol import APIError, backend_error, parse, read_json
from edgesdk.serve.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest

SEED_RANDOM = 4294967295  # llama-server's "-1": a random seed per request (the runtime's default too)
REPEAT_LAST_N = 64  # the penalties' window (docs/serve.md)


# ------------------------------------------------------------------------------ the model
def llm_entry(models: dict[str, ModelEntry], name: object) -> ModelEntry:
    """The GGUF model a request names, or the only one served; an APIError otherwise."""
    llms = {n: e for n, e in models.items() if e.kind == "llm" and e.images is None}
    if name is None:
        if len(llms) == 1:
            return next(iter(llms.values()))
        raise APIError(
            400,
            "'model' is required: "
            + (f"this server has {len(llms)} LLMs ({', '.join(sorted(llms))})" if llms else "no GGUF LLM is served"),
            param="model",
        )
    if not isinstance(name, str) or not name:
        raise APIError(400, "'model' must be a served model's name (GET /v1/models)", param="model")
    entry = models.get(name)
    if entry is None:
        raise APIError(
            404,
            f"The model '{name[:80]}' does not exist (served: {', '.join(sorted(models))})",
            param="model",
            code="model_not_found",
        )
    if name not in llms:
        raise APIError(
            400, f"model {name!r} is a {entry.kind} bundle; this endpoint needs a GGUF (llama.cpp) LLM", param="model"
        )
    return entry


def _engine(entry: ModelEntry) -> Any:
    """The model's batch engine (continuous batching), or None (``--parallel 1``)."""
    return entry.worker.engine if isinstance(entry.worker, BatchWorker) else None


def _needs_engine(entry: ModelEntry, what: str, param: str | None = None) -> Any:
    engine = _engine(entry)
    if engine is None:
        raise APIError(
            400,
            f"{what} needs the continuous-batching engine (its detokenizer), and {entry.name!r} is served one "
            "request at a time (serve --parallel 1); serve it with --parallel 2 or more (the default)",
            param=param,
            code="unsupported_parameter",
        )
    return engine


# ------------------------------------------------------------------------------ tokens
def _tokenize(entry: ModelEntry, text: str, add_bos: bool, special: bool) -> list[int]:
    engine = _engine(entry)
    if engine is not None:
        return list(engine.tokenize(text, add_bos=add_bos, special=special))
    backend = entry.session.backend  # adds BOS when the model's vocabulary does (llama_tokenize's add_special)
    ids = list(backend.tokenize(text, special=special))
    if not add_bos and ids and backend.tokenize("", special=False)[:1] == ids[:1]:
        ids = ids[1:]  # the BOS it added (an empty text is only that)
    return ids


async def tokenize_text(entry: ModelEntry, text: str, *, add_bos: bool, special: bool) -> list[int]:
    """``text`` as the model's token ids, off the event loop (a 1 MiB text takes a while; ``--parallel 1``'s
    tokenizer waits for the running request)."""
    try:
        return await asyncio.to_thread(_tokenize, entry, text, add_bos, special)
    except EdgeSDKError as exc:
        raise backend_error(exc, "content") from None


async def special_prompt_ids(entry: ModelEntry, text: str) -> list[int]:
    """A ``/v1/completions`` text prompt as token ids with special tokens parsed (``<start_of_turn>`` is one token,
    not eight), and the model's BOS: as llama-server tokenizes a completion's prompt, except that a prompt starting
    with the BOS token's own text (``/apply-template``'s output) gets no second one (llama.cpp warns and keeps both)."""
    ids = await tokenize_text(entry, text, add_bos=True, special=True)
    if len(ids) > 1 and ids[0] == ids[1]:  # a prompt that starts with the BOS token's text (a chat template's
        bos = await tokenize_text(entry, "", add_bos=True, special=False)  # output): one BOS, not two
        if bos[:1] == ids[:1]:
            ids = ids[1:]
    if not ids:
        raise APIError(400, "the prompt is empty (no tokens)", param="prompt")
    return ids


def _piece_json(piece: bytes) -> str | list[int]:
    """A token's piece as llama-server writes it: text when it is whole UTF-8, else its bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


async def tokenize(routes: Any, request: Request) -> Response:
    """``POST /tokenize``: ``{"content", "add_special" (false), "parse_special" (true), "with_pieces" (false)}``
    -> ``{"tokens": [ids]}`` or ``{"tokens": [{"id", "piece"}]}``."""
    try:
        body = parse(TokenizeRequest, await read_json(request, routes.config.max_body_bytes))
        entry = llm_entry(routes.models, body.model)
        engine = _needs_engine(entry, "'with_pieces'", "with_pieces") if body.with_pieces else None
        special = body.parse_special is not False
        ids = await tokenize_text(entry, body.content, add_bos=body.add_special is True, special=special)
        if engine is None:
            return JSONResponse({"tokens": ids})
        out = await asyncio.to_thread(lambda: [{"id": t, "piece": _piece_json(engine.piece(t, True))} for t in ids])
        return JSONResponse({"tokens": out})
    except APIError as exc:
        return exc.response()


async def detokenize(routes: Any, request: Request) -> Response:
    """``POST /detokenize``: ``{"tokens": [ids]}`` -> ``{"content": text}`` (special tokens as their text, as
    llama-server renders them)."""
    try:
        body = parse(DetokenizeRequest, await read_json(request, routes.config.max_body_bytes))
        entry = llm_entry(routes.models, body.model)
        tokens = body.tokens
        engine = _needs_engine(entry, "/detokenize")
        n_vocab = int(engine.n_vocab)
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            shown = bad if -INT32_MAX <= bad <= INT32_MAX else f"{str(bad)[:20]}..."
            raise APIError(400, f"'tokens' must be token ids from 0 to {n_vocab - 1}, got {shown}", param="tokens")
        data = await asyncio.to_thread(lambda: b"".join(engine.piece(t, True) for t in tokens))
        return JSONResponse({"content": data.decode("utf-8", errors="replace")})
    except APIError as exc:
        return exc.response()


async def apply_template(routes: Any, request: Request) -> Response:
    """``POST /apply-template``: a chat request's ``messages`` (and ``tools``) -> ``{"prompt": text}``: the text
    the model is given for that chat (its chat template, the tools' system turn where the template has none, the
    BOS token), without generating. Every field is checked as ``/v1/chat/completions`` checks it."""
    try:
        body = parse(ApplyTemplateRequest, await read_json(request, routes.config.max_body_bytes))
        entry = llm_entry(routes.models, body.model)
        engine = _needs_engine(entry, "/apply-template")
        req = body.to_generation_request(entry)
        try:
            encoded = await asyncio.to_thread(entry.session.backend.encode, req)
        except EdgeSDKError as exc:
            raise backend_error(exc, "messages") from None
        ids = encoded.prompt_tokens or ()
        data = await asyncio.to_thread(lambda: b"".join(engine.piece(t, True) for t in ids))
        return JSONResponse({"prompt": data.decode("utf-8", errors="replace")})
    except APIError as exc:
        return exc.response()


# ------------------------------------------------------------------------------ state
def _query_model(routes: Any, request: Request) -> ModelEntry:
    names = request.query_params.getlist("model")
    if len(names) > 1:
        raise APIError(400, "give 'model' once", param="model")
    return llm_entry(routes.models, names[0] if names else None)


def _params(entry: ModelEntry) -> dict:
    """The generation settings a request gets when it gives none (llama-server's ``params`` names)."""
    return {
        "n_predict": entry.default_max_tokens,
        "max_tokens": entry.default_max_tokens,
        "seed": SEED_RANDOM,
        **{k: float(v) if k != "top_k" else int(v) for k, v in DEFAULT_SAMPLING.items()},
        "repeat_last_n": REPEAT_LAST_N,
        "stop": [],
        "n_probs": 0,
        "stream": False,
        "grammar": "",
    }


def _slot(entry: ModelEntry, i: int, busy: bool, n_ctx: int) -> dict:
    return {
        "id": i,
        "id_task": -1,
        "n_ctx": n_ctx,
        "speculative": False,
        "is_processing": busy,
        "params": _params(entry),
    }


def _state(entry: ModelEntry) -> tuple[int, int, int]:
    """(slots, busy slots, context per slot) of an LLM."""
    engine = _engine(entry)
    if engine is not None:
        return int(engine.slots), int(engine.busy), int(engine.settings.get("n_ctx_per_slot") or 0)
    backend = entry.session.backend
    n_ctx = backend.context_length if isinstance(backend, BatchingBackend) else 0
    depth = int(entry.worker.depth) if entry.worker is not None else 0  # an LLMWorker (one request at a time)
    return 1, 1 if depth else 0, n_ctx


async def props(routes: Any, request: Request) -> Response:
    """``GET /props``: llama-server's global properties of a model (``?model=NAME``)."""
    try:
        entry = _query_model(routes, request)
        slots, _busy, n_ctx = _state(entry)
        return JSONResponse(
            {
                "default_generation_settings": _slot(entry, 0, False, n_ctx),
                "total_slots": slots,
                "model_alias": entry.name,
                "model_path": str(entry.session.bundle.path),
                "modalities": {"vision": False, "audio": False},
                "build_info": f"edgesdk {__version__}",
                "is_sleeping": False,
            }
        )
    except APIError as exc:
        return exc.response()


async def slots(routes: Any, request: Request) -> Response:
    """``GET /slots``: each slot's state (``?model=NAME``; ``?fail_on_no_slot=1``: 503 when none is free). No
    prompt text: the engine keeps it to itself."""
    try:
        entry = _query_model(routes, request)
        total, busy, n_ctx = _state(entry)
        fail = request.query_params.get("fail_on_no_slot")
        if fail not in (None, "0", "1", "false", "true"):
            raise APIError(400, "'fail_on_no_slot' must be 0 or 1", param="fail_on_no_slot")
        if fail in ("1", "true") and busy >= total:
            raise APIError(
                503,
                f"no slot of {entry.name!r} is free ({busy} of {total} busy)",
                "unavailable_error",
                code="no_slot_available",
            )
        return JSONResponse([_slot(entry, i, i < busy, n_ctx) for i in range(total)])
    except APIError as exc:
        return exc.response()
