# SPDX-License-Identifier: Apache-2.0
"""The on-device session: verify the bundle, pick a backend along the plan's chain, run, report.

Every step down the chain (an EP that is absent, an engine that will not load here, a kernel the
device lacks) is a fallback record ``{from, to, reason}`` in :meth:`Session.report` and a
telemetry span event, so "why is it slow here" has an answer on the device itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk import telemetry
from edgesdk.bundle import Bundle, open_bundle
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.formats.embed_batches import EMBED_MAX_BATCH, EMBED_MAX_LENGTH_RATIO, plan_embed_batches
from edgesdk.manifest import EmbeddingConfig
from edgesdk.profiles import Profile, resolve_profile
from edgesdk.runtime.backend import Backend, LLMBackend, LoadContext, RequestStats, VisionBackend, check_feeds
from edgesdk.runtime.backends import get_loader
from edgesdk.runtime.embed_inputs import encode_inputs, is_token_ids
from edgesdk.runtime.options import LoadOptions, all_option_names, parse_load_options
from edgesdk.runtime.requests import check_messages_text, check_text

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from edgesdk.runtime.backend import GenerationOptions


class Generation(str):
    """What :meth:`Session.generate` and :meth:`Session.chat` return: the text itself (a ``str``: it compares,
    concatenates, prints and JSON-encodes as the text) with ``.text`` (a plain ``str``), ``.usage``
    (prompt_tokens, completion_tokens, ttft_ms, tokens_per_s, finish_reason of this request) and ``.stats`` (the
    backend's typed figures of it, a :class:`~edgesdk.runtime.backend.RequestStats`; ``usage`` is a view of it)."""

    usage: dict[str, Any]
    stats: RequestStats | None

    def __new__(cls, text: str, stats: RequestStats | None = None) -> Generation:
        obj = super().__new__(cls, text)
        obj.stats = stats
        obj.usage = stats.usage() if stats is not None else {}
        return obj

    @property
    def text(self) -> str:
        return str.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (multiprocessing, caches) with its figures
        return (Generation, (self.text, self.stats))


# Every option a built-in loader reads (``edgesdk.load(path, **options)``); anything else is a typo
# (``n_gpu_layer=8``) that would otherwise be ignored in silence. The typed form, per backend kind, is
# edgesdk.runtime.options (LoadOptions and its subclasses); a registered format may add its own names
# with a ``load_options`` attribute.
LOAD_OPTIONS = all_option_names()


def check_load_options(options: dict[str, Any], fmt: str | None = None) -> LoadOptions:
    """``options`` as the typed :class:`~edgesdk.runtime.options.LoadOptions` of ``fmt``'s backend; a
    ``threads`` that is not a positive integer and, once the bundle's format is known (``fmt``), an option
    that format's loader does not read is a one-line :class:`InputError`; ``None`` means "the default"."""
    if fmt is None:
        return parse_load_options(options)
    from edgesdk.formats import find_format

    extra = tuple(getattr(find_format(fmt), "load_options", ()) or ())
    return parse_load_options(options, fmt, extra)


# LoadContext lives in runtime/backend.py
__all__ = [
    "EMBED_MAX_BATCH",
    "EMBED_MAX_LENGTH_RATIO",
    "LOAD_OPTIONS",
    "LoadContext",
    "LoadOptions",
    "Session",
    "check_load_options",
    "load",
    "plan_embed_batches",
]


class Session:
    """A loaded bundle. ``run`` for raw tensors; ``embed`` for text encoders; LLM calls for GGUF bundles."""

    def __init__(self, bundle: Bundle, backend: Backend, ctx: LoadContext, load_s: float):
        self.bundle = bundle
        self.backend = backend
        self._ctx = ctx
        self.load_s = load_s
        self.profile = ctx.profile
        self._tokenizer = None
        m = bundle.manifest
        self._attrs = {
            "edgesdk.device.profile": (ctx.profile.name if ctx.profile else m.profile.name or ""),
            "edgesdk.backend": backend.name,
            "edgesdk.backend.device": str(backend.device),
            "edgesdk.precision": bundle.precision,
            "edgesdk.bundle.id": bundle.bundle_id,
        }
        self._model = bundle.model_name
        self._operation = "embeddings" if m.model.task == "feature-extraction" else "predict"

    # ------------------------------------------------------------------ generic tensors
    def run(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """One inference on named inputs; shapes/dtypes are checked against the model first."""
        feeds = check_feeds(self.backend.inputs, inputs)
        with telemetry.inference(self._operation, self._model, self.backend.provider, attributes=self._attrs) as rec:
            out = self.backend.run(feeds)
            ids = feeds.get("input_ids")
            if ids is not None:
                rec.set_input_tokens(int(np.count_nonzero(feeds.get("attention_mask", ids))))
            return out

    # ------------------------------------------------------------------ text encoders
    def _text_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            # Only through the bundle API: a file the manifest does not list is refused (exit 7), and
            # the bytes are hashed again as they are read.
            raw = self.bundle.read_bytes("tokenizer.json")
            if raw is None:
                raise BackendUnavailableError(
                    f"bundle {self.bundle.path} has no tokenizer.json: use run() with token ids"
                )
            tok = Tokenizer.from_str(raw.decode("utf-8"))
            max_len = 512
            cfg = self.bundle.read_bytes("tokenizer_config.json")
            if cfg is not None:
                max_len = min(int(json.loads(cfg).get("model_max_length", 512) or 512), 8192)
            st = self.bundle.read_bytes("sentence_bert_config.json")
            if st is not None:
                max_len = min(max_len, int(json.loads(st).get("max_seq_length", max_len)))
            pad = tok.token_to_id("[PAD]")
            tok.enable_truncation(max_length=max_len)
            tok.enable_padding(pad_id=0 if pad is None else pad)
            self._tokenizer = tok
        return self._tokenizer

    def embed(
        self,
        texts: str | list[str] | list[str | list[int]],
        *,
        normalize: bool | None = None,
        max_batch: int | None = None,
    ) -> np.ndarray:
        """Sentence embeddings (pooling as the model's sentence-transformers config says), shape [n, dim].

        Texts run in batches of at most ``max_batch`` (default: the largest batch the build verified,
        ``parity.<precision>.padded.embed_max_batch`` in the manifest, else :data:`EMBED_MAX_BATCH`), each padded to its
        own longest text, so memory is bounded by one batch whatever the number of texts. Batches group texts
        of similar length (:func:`plan_embed_batches`), so a text's embedding does not depend on a much
        longer neighbour; results come back in the order of ``texts``. An item may be token ids instead of a
        text (a list of integers of the model's vocabulary: :mod:`edgesdk.runtime.embed_inputs`)."""
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(texts, tuple):
            texts = list(texts)
        if not isinstance(texts, list):  # a generator or set: tokenizers raised a bare TypeError
            raise ShapeError(
                f"embed() takes a string or a list of strings (or of token-id lists), got {type(texts).__name__}"
                + (" (pass list(...))" if hasattr(texts, "__iter__") else "")
            )
        if not texts or not all(isinstance(t, str) or is_token_ids(t) for t in texts):
            raise ShapeError("embed() takes a non-empty string or list of strings (or of token-id lists)")
        for i, t in enumerate(texts):
            if isinstance(t, str):
                check_text(t, f"embed() text {i}")
        if max_batch is None:
            max_batch = self._verified_max_batch()
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ShapeError(f"embed(max_batch=...) must be a positive integer, got {max_batch!r}")
        tok = self._text_tokenizer()
        names = {spec.name for spec in self.backend.inputs}
        info = self.bundle.manifest.embedding or EmbeddingConfig()  # steering: covered by manifest_sha256
        # padded on the right to the longest: each batch slices its own length
        encs = tok.encode_batch(texts) if all(isinstance(t, str) for t in texts) else encode_inputs(tok, texts)
        lengths = [int(sum(e.attention_mask)) for e in encs]
        parts, order = [], []
        for rows in plan_embed_batches(lengths, max_batch):
            width = max(max(lengths[i] for i in rows), 1)
            feeds = {
                "input_ids": np.asarray([encs[i].ids[:width] for i in rows], dtype=np.int64),
                "attention_mask": np.asarray([encs[i].attention_mask[:width] for i in rows], dtype=np.int64),
                "token_type_ids": np.asarray([encs[i].type_ids[:width] for i in rows], dtype=np.int64),
            }
            order.extend(rows)
            mask_all = feeds["attention_mask"]
            feeds = {k: v for k, v in feeds.items() if k in names}
            with telemetry.inference("embeddings", self._model, self.backend.provider, attributes=self._attrs) as rec:
                rec.set_input_tokens(int(mask_all.sum()))
                hidden = next(iter(self.backend.run(feeds).values()))
                rec.set_attribute("gen_ai.embeddings.dimension.count", int(hidden.shape[-1]))  # semconv: recommended
            if hidden.ndim == 3:
                if info.pooling == "cls":
                    emb = hidden[:, 0, :]
                else:
                    mask = mask_all[..., None].astype(np.float32)
                    emb = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            else:
                emb = hidden
            parts.append(np.asarray(emb, dtype=np.float32))
        emb = np.empty_like(parts[0], shape=(len(texts), parts[0].shape[-1]))
        emb[np.asarray(order)] = np.concatenate(parts, axis=0)
        if normalize if normalize is not None else info.normalize:
            emb = emb / np.clip(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12, None)
        return emb.astype(np.float32)

    def count_tokens(self, inputs: list[str | list[int]]) -> list[int]:
        """Tokens per input (a text or token ids) as :meth:`embed` feeds them (after truncation, no padding); an
        InputError for a token id outside the vocabulary."""
        return [int(sum(r.attention_mask)) for r in encode_inputs(self._text_tokenizer(), inputs)]

    def _verified_max_batch(self) -> int:
        """The largest embed() batch whose parity the build measured to hold (INT8 activation scales are per
        batch, so neighbours matter): manifest ``parity.<precision>.padded.embed_max_batch``."""
        verified = self.bundle.manifest.embed_max_batch(self.bundle.precision)
        return min(verified, EMBED_MAX_BATCH) if verified is not None else EMBED_MAX_BATCH

    # ------------------------------------------------------------------ LLMs (delegated)
    def _llm(self, what: str) -> LLMBackend:
        if not isinstance(self.backend, LLMBackend):
            raise BackendUnavailableError(
                f"{what}() needs an LLM bundle; this bundle is {self.bundle.format}/{self.bundle.manifest.model.task}"
            )
        return self.backend

    def _vision(self, what: str) -> VisionBackend:
        llm = self._llm(what)
        if not isinstance(llm, VisionBackend):
            raise InputError(
                f"unknown generation option(s): images ({what}() takes images with a VLM bundle; this bundle is "
                f"{self.bundle.format})"
            )
        return llm

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        images: Sequence[Any] | None = None,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> Any:
        """The completion as a :class:`Generation` (a ``str`` with ``.text``, ``.usage`` and ``.stats``); with
        ``stream=True`` an iterator of text pieces (figures: :attr:`last_stats`). ``images`` (a VLM bundle): the
        images the prompt is about. ``options``: :class:`~edgesdk.runtime.backend.GenerationOptions`."""
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        if images is not None:
            return self._result(self._vision("generate").generate(prompt, images, stream=stream, **options))
        return self._result(self._llm("generate").generate(prompt, stream=stream, **options))

    def stream(
        self, prompt: str | Sequence[int], *, images: Sequence[Any] | None = None, **options: Unpack[GenerationOptions]
    ) -> Iterator[str]:
        """The completion's text pieces as they are generated (figures afterwards: :attr:`last_stats`)."""
        if isinstance(prompt, str):
            check_text(prompt, "prompt")
        if images is not None:
            pieces = self._vision("stream").generate(prompt, images, stream=True, **options)
            assert not isinstance(pieces, str)
            return pieces
        return self._llm("stream").stream(prompt, **options)

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        chat_template: str | None = None,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> Any:
        """The reply as a :class:`Generation`, as :meth:`generate`."""
        llm = self._llm("chat")
        check_messages_text(messages)
        return self._result(llm.chat(messages, chat_template=chat_template, stream=stream, **options))

    @property
    def last_stats(self) -> RequestStats | None:
        """The LLM backend's figures of its last finished request (None before the first, or for another backend)."""
        return self.backend.last_stats if isinstance(self.backend, LLMBackend) else None

    def _result(self, out: str | Iterator[str]) -> Any:
        return Generation(out, self.last_stats) if isinstance(out, str) else out

    def tokenize(self, text: str) -> list[int]:
        return self._llm("tokenize").tokenize(text)

    # ------------------------------------------------------------------ report
    @property
    def fallbacks(self) -> list[dict[str, Any]]:
        return list(self._ctx.fallbacks)

    def report(self) -> dict[str, Any]:
        m = self.bundle.manifest
        return {
            "bundle": str(self.bundle.path),
            "bundle_id": self.bundle.bundle_id,
            "model": self._model,
            "format": self.bundle.format,
            "precision": self.bundle.precision,
            "built_for": m.profile.name,
            "profile": self.profile.name if self.profile else None,
            "backend": self.backend.name,
            "device": str(self.backend.device),
            "load_s": round(self.load_s, 4),
            "fallbacks": self.fallbacks,
            "backend_report": self.backend.report(),
        }

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    path: str | Path,
    *,
    profile: str | Profile | None = None,
    verify: bool = True,
    options: LoadOptions | None = None,
    **kwargs: Any,
) -> Session:
    """Open and verify a bundle, then load it with the best backend present (see module docstring).

    ``profile`` overrides the device profile used for kernel decisions (default: the one the bundle was
    built for). ``host`` (an :class:`edgesdk.host.HostFacts`) replaces this machine's probed facts.
    Options go to the loader, as keywords (``providers=[...]``, ``threads=2``, ``n_gpu_layers=...``) or as
    the bundle format's dataclass (``options=GgufLoadOptions(n_ctx=512)``, :mod:`edgesdk.runtime.options`);
    an option the bundle's loader does not read is refused (exit 3), not ignored.
    """
    t0 = time.perf_counter()
    host = kwargs.pop("host", None)  # HostFacts to load as if on another host (tests, what-if reports)
    if options is not None and kwargs:
        raise InputError(
            f"pass load options as keywords or as options={type(options).__name__}(...), not both "
            f"(got {', '.join(sorted(kwargs))} too)"
        )
    if options is None:
        check_load_options(kwargs)  # threads, before the bundle's bytes are hashed
    bundle = open_bundle(path, verify=verify)
    # a typo (n_gpu_layer=8), or an option of another backend kind, is refused, not ignored
    typed = check_load_options(kwargs, bundle.format) if options is None else parse_load_options(options, bundle.format)
    prof = profile if isinstance(profile, Profile) or profile is None else resolve_profile(profile)
    if prof is None:
        name = bundle.manifest.profile.name
        try:
            prof = resolve_profile(name) if name else None
        except Exception:  # noqa: BLE001 - a custom profile file may not exist on the device
            prof = None
    ctx = LoadContext(bundle=bundle, profile=prof, options=typed, host=host)  # typed: the loader reads the fields
    backend = get_loader(bundle.format)(bundle, ctx)
    return Session(bundle, backend, ctx, time.perf_counter() - t0)
