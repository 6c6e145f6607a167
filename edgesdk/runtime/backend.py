# SPDX-License-Identifier: Apache-2.0
"""The backend contract: what every runtime backend implements, and what its loader is given.

A *backend* runs one loaded model on one device. ``edgesdk.load(bundle)`` finds the bundle format's
*loader* (a ``Loader``: ``(bundle, ctx) -> Backend``), which walks its own fallback chain (GPU
engine -> GPU provider -> CPU; the CPU is always the last resort) and calls
``ctx.record_fallback(from_, to, reason)`` for every step down. The session checks inputs against
``backend.inputs`` (:func:`check_feeds`, written once here) before it calls ``backend.run``, so a
backend never validates feeds itself.

Members (:class:`Backend`):

``name``        runtime name: ``onnxruntime``, ``llama.cpp``, ``tensorrt``, ``torch``
``provider``    the ``gen_ai.provider.name`` telemetry reports
``device``      where it runs, e.g. ``CPUExecutionProvider`` or ``cuda:0``
``inputs``      :class:`TensorSpec` per input (dynamic dims ``None`` or a symbolic name)
``outputs``     :class:`TensorSpec` per output
``run(feeds)``  one inference on checked feeds -> ``{output name: ndarray}``
``report()``    what ran where (placement, settings), for ``session.report()``
``close()``     release native resources

:class:`LLMBackend` adds ``generate``, ``stream``, ``chat`` (sampling options typed as
:class:`GenerationOptions`), ``tokenize`` and ``last_stats`` (the last request's counts and timings, a
:class:`RequestStats`; ``last`` is the same as a dict, kept for callers that read it so). Capabilities beyond that
are protocols too, asked with ``isinstance``: :class:`BatchingBackend` (a continuous-batching engine on the loaded
weights, ``edgesdk serve --parallel N``) and :class:`VisionBackend` (prompts with images: a VLM).

Example -- a complete backend (``y = x * scale`` in numpy) and its loader; ``tests/test_backend.py``
runs this very text::

    import numpy as np

    from edgesdk.runtime.backend import Backend, LoadContext, TensorSpec, check_feeds
    from edgesdk.runtime.options import LoadOptions


    class ScaleBackend:
        name = "numpy"
        provider = "numpy"
        device = "cpu"

        def __init__(self, scale: float):
            self.scale = np.float32(scale)
            self.inputs = (TensorSpec("x", "float32", (None, 4)),)     # batch is dynamic, 4 features
            self.outputs = (TensorSpec("y", "float32", (None, 4)),)
            self.calls = 0

        def run(self, feeds):
            self.calls += 1
            return {"y": feeds["x"] * self.scale}

        def report(self):
            return {"backend": self.name, "calls": self.calls, "placement": {"source": "numpy on the CPU"}}

        def close(self):
            self.scale = None


    def load_scale(bundle, ctx: LoadContext) -> Backend:
        # A real loader reads its artifact from ``bundle`` (``bundle.artifact_path("model")``) and tries
        # the faster device first; here the "GPU" step is absent, so it records the step down.
        # ``ctx.options`` is a LoadOptions; a registered format's own option names (its ``load_options``) are in
        # ``extra``, the built-in kinds' in typed fields (GgufLoadOptions.n_ctx, ...).
        ctx.record_fallback("numpy-gpu", "numpy", "no GPU build of numpy here")
        return ScaleBackend(float(ctx.options.extra.get("scale", 2.0)))


    ctx = LoadContext(bundle=None, profile=None, options=LoadOptions(extra={"scale": 3.0}), on_fallback=None)
    backend = load_scale(None, ctx)
    assert isinstance(backend, Backend)
    feeds = check_feeds(backend.inputs, {"x": [[1, 2, 3, 4]]})     # ints cast to float32, rank checked
    assert backend.run(feeds)["y"].tolist() == [[3.0, 6.0, 9.0, 12.0]]
    assert ctx.fallbacks == [{"from": "numpy-gpu", "to": "numpy", "reason": "no GPU build of numpy here"}]
    backend.close()

To ship it, add the loader to the format's registry entry (``edgesdk/formats``); ``edgesdk.load``
then returns a session whose ``run``, ``report`` and telemetry work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import numpy as np

from edgesdk.errors import ShapeError
from edgesdk.manifest import Manifest
from edgesdk.runtime.options import LoadOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from edgesdk.bundle import Bundle
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile

Dim = int | str | None

# ONNX Runtime spells element types "tensor(float)"; manifests and numpy say "float32".
_ORT_TYPES = {
    "float": "float32",
    "double": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "int32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "string": "str",
}


def normalize_dtype(dtype: Any) -> str:
    """One spelling for element types: ``tensor(float)``, ``float``, ``np.float32`` -> ``float32``."""
    text = str(dtype.__name__ if isinstance(dtype, type) else dtype)
    if text.startswith("tensor(") and text.endswith(")"):
        text = text[7:-1]
    text = _ORT_TYPES.get(text, text)
    try:
        return "bool" if text == "bool" else np.dtype(text).name
    except TypeError:
        return text  # a type numpy does not know (bfloat16, str): kept as written


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: name, element type (numpy name) and shape.

    ``shape`` dims are ints (static), ``None`` or a symbolic name (dynamic); ``shape=None`` means the
    rank itself is unknown.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if self.shape is not None:
            dims = tuple(d if isinstance(d, str) or d is None else (int(d) if int(d) > 0 else None) for d in self.shape)
            object.__setattr__(self, "shape", dims)

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> TensorSpec:
        """A manifest ``io`` entry ``{"name", "dtype", "shape"}``."""
        shape = entry.get("shape")
        return cls(
            str(entry["name"]), str(entry.get("dtype") or "float32"), tuple(shape) if shape is not None else None
        )


def check_feeds(specs: Sequence[TensorSpec], feeds: Any) -> dict[str, np.ndarray]:
    """Feeds checked against ``specs``: names, rank, static dims, dtype (numeric values cast within their
    kind, e.g. int32 -> int64). Anything else is a one-line :class:`~edgesdk.errors.ShapeError` (exit 3)."""
    if not isinstance(feeds, Mapping):
        raise ShapeError(f"inputs must be a mapping of input name to array, got {type(feeds).__name__}")
    names = [s.name for s in specs]
    missing = [n for n in names if n not in feeds]
    extra = [n for n in feeds if n not in names]
    if missing or extra:
        raise ShapeError(
            f"inputs do not match the model: missing {missing or '-'}, unexpected {extra or '-'} (expected {names})"
        )
    out = {}
    named: dict[str, tuple[str, int]] = {}  # a symbolic dimension -> (the first input giving it, its size)
    for spec in specs:
        arr = np.asarray(feeds[spec.name])
        if spec.shape is not None:
            if arr.ndim != len(spec.shape):
                raise ShapeError(
                    f"input {spec.name!r}: expected rank {len(spec.shape)} {list(spec.shape)}, got "
                    f"shape {list(arr.shape)}"
                )
            for axis, (got, want) in enumerate(zip(arr.shape, spec.shape)):
                if isinstance(want, int) and got != want:
                    raise ShapeError(
                        f"input {spec.name!r}: dimension {axis} must be {want}, got {got} (shape {list(arr.shape)})"
                    )
                if isinstance(want, str) and want:  # one name, one size: ONNX Runtime's kernels assume it
                    first = named.setdefault(want, (spec.name, int(got)))
                    if first[1] != got:
                        raise ShapeError(
                            f"input {spec.name!r}: dimension {axis} ({want}) is {got}, but {first[0]!r} has "
                            f"{want} = {first[1]}: inputs sharing a dimension must have the same length there"
                        )
        try:
            want_dtype = np.dtype(spec.dtype)
        except TypeError:
            want_dtype = None
        if want_dtype is not None and arr.dtype != want_dtype:
            if np.issubdtype(arr.dtype, np.number) and np.can_cast(arr.dtype, want_dtype, casting="same_kind"):
                arr = arr.astype(want_dtype)
            else:
                raise ShapeError(f"input {spec.name!r}: expected dtype {want_dtype.name}, got {arr.dtype}")
        out[spec.name] = arr
    return out


# ---------------------------------------------------------------- the protocols


@runtime_checkable
class Backend(Protocol):
    """One loaded model on one device (see the module docstring for an example)."""

    name: str
    provider: str
    device: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def report(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class GenerationOptions(TypedDict, total=False):
    """The sampling options ``generate``/``stream``/``chat`` take as keywords (``**options``), typed: what
    :meth:`~edgesdk.runtime.requests.GenerationRequest.from_options` checks (a bad value is one InputError naming
    it; ``None`` means the default; ``temp`` is ``temperature``'s llama.cpp spelling)."""

    max_tokens: int | None
    temperature: float | None
    temp: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    repeat_penalty: float | None
    frequency_penalty: float | None
    presence_penalty: float | None
    logit_bias: Mapping[int | str, float] | None
    seed: int | None
    stop: str | Sequence[str] | None
    n: int | None
    grammar: str | None
    logprobs: int | None
    tools: Sequence[Mapping[str, Any]] | None
    tool_choice: str | None
    speculative: str | None


@dataclass(frozen=True)
class RequestStats:
    """What an LLM backend measured of its last finished request (``LLMBackend.last_stats``): token counts, why it
    ended, time to first token and decode rate, the perf_counter() instants of its first and last token, llama.cpp's
    own per-request decode counters, prompt tokens whose KV cells were kept from before, and speculative decoding's
    figures. :meth:`as_dict` is the ``last`` view (the same figures under the same names)."""

    input_tokens: int
    output_tokens: int
    finish_reason: str
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    llama_cpp_timings: Mapping[str, float] = field(default_factory=dict)
    cached_tokens: int = 0
    speculative: str = "off"
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_k_start: int = 0  # adaptive k: the most tokens a step drafted at the first drafted step and at the end
    draft_k: int = 0

    @classmethod
    def of_result(cls, res: Any, end: float | None = None, **more: Any) -> Any:
        """The figures of the engine's finished request ``res`` (a ``runtime.batching.GenerationResult``): counts,
        why it ended, TTFT, the decode rate between its first token and ``end`` (default: when it finished), the
        token instants, llama.cpp's counters, cached prompt tokens and speculative decoding's figures; ``more`` sets
        or overrides fields (a subclass's own: :class:`VisionRequestStats`)."""
        first, n_out = res.first_token_at, len(res.tokens)
        end = res.finished_at if end is None else end
        figures: dict[str, Any] = {
            "input_tokens": res.prompt_tokens,
            "output_tokens": n_out,
            "finish_reason": res.finish_reason,
            "ttft_s": round(res.ttft_s, 6) if res.ttft_s is not None else None,
            "decode_tok_s": round((n_out - 1) / (end - first), 2)
            if first and end and n_out > 1 and end > first
            else None,
            # perf_counter() instants, for callers timing tokens (not text chunks: a token may yield no text, so
            # chunk times can lag token times)
            "first_token_at": first,
            "last_token_at": end if first else None,
            # the decode steps' time in llama.cpp (engine-measured, per request), as llama-bench names the counters
            "llama_cpp_timings": dict(res.timings),
            "cached_tokens": res.cached_tokens,
            "speculative": res.speculative,
            "drafted_tokens": res.drafted_tokens,
            "accepted_tokens": res.accepted_tokens,
            "draft_k_start": res.draft_k_start,
            "draft_k": res.draft_k,
        }
        return cls(**{**figures, **more})

    def as_dict(self) -> dict[str, Any]:
        """The figures as ``LLMBackend.last`` gives them (and ``report()["last_request"]``)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "finish_reason": self.finish_reason,
            "ttft_s": self.ttft_s,
            "decode_tok_s": self.decode_tok_s,
            "first_token_at": self.first_token_at,
            "last_token_at": self.last_token_at,
            "llama_cpp_timings": dict(self.llama_cpp_timings),
            "cached_tokens": self.cached_tokens,
            "speculative": self.speculative,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "draft_k_start": self.draft_k_start,
            "draft_k": self.draft_k,
        }

    def usage(self) -> dict[str, Any]:
        """The request's figures named as OpenAI/llama.cpp users know them (``Generation.usage``)."""
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "ttft_ms": round(self.ttft_s * 1000, 2) if self.ttft_s is not None else None,
            "tokens_per_s": self.decode_tok_s,
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True)
class VisionRequestStats(RequestStats):
    """A VLM request's :class:`RequestStats` plus its images: image tokens in the prompt, images whose features
    were cached, the generated token ids, encoder runs so far, and the time of each stage (preprocess, encode,
    prefill, decode). ``input_tokens`` counts text and image tokens; ``ttft_s`` runs from the call."""

    image_tokens: int = 0
    images_cached: int = 0
    output_ids: tuple[int, ...] = ()
    encoder_runs: int = 0
    stages_s: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "image_tokens": self.image_tokens,
            "output_ids": list(self.output_ids),
            "images_cached": self.images_cached,
            "kv_reused_tokens": self.cached_tokens,
            "encoder_runs": self.encoder_runs,
            "stages_s": dict(self.stages_s),
        }


@runtime_checkable
class LLMBackend(Backend, Protocol):
    """A backend that generates text: typed sampling options (:class:`GenerationOptions`), ``stream=True`` for an
    iterator of text pieces, and the last finished request's figures as :class:`RequestStats` (``last_stats``;
    ``last`` is its dict view)."""

    @property
    def last_stats(self) -> RequestStats | None: ...

    @property
    def last(self) -> Mapping[str, Any]: ...

    def generate(
        self, prompt: str | Sequence[int], *, stream: bool = False, **options: Unpack[GenerationOptions]
    ) -> str | Iterator[str]: ...

    def stream(self, prompt: str | Sequence[int], **options: Unpack[GenerationOptions]) -> Iterator[str]: ...

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        chat_template: str | None = None,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> str | Iterator[str]: ...

    def tokenize(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class ImageLimits:
    """What a server checks of a VLM chat's images before it queues the request: the preprocessor's size check
    (raises InputError for an image it cannot take), the image tokens an image of a size costs and a slot's
    context in tokens."""

    check_size: Callable[[int, int, str], None]  # (width, height, what): raises InputError for an image it refuses
    image_tokens: Callable[[int, int], int | None] | None  # (width, height) -> image tokens (None: unknown)
    context: int | None


@runtime_checkable
class VisionBackend(LLMBackend, Protocol):
    """An LLM backend whose prompts take images (a VLM): ``generate(prompt, images)``, image parts in chat messages.
    Its ``encode`` preprocesses and encodes images, so a server runs it off its event loop."""

    def generate(
        self,
        prompt: str | Sequence[int],
        images: Sequence[Any] | None = None,
        *,
        stream: bool = False,
        **options: Unpack[GenerationOptions],
    ) -> str | Iterator[str]: ...

    def image_limits(self) -> ImageLimits: ...


@runtime_checkable
class BatchingBackend(Protocol):
    """An LLM backend whose model a continuous-batching engine can serve (``edgesdk serve --parallel N``):
    the engine on the already-loaded weights, requests as token ids, the engine's prompt budget per step, the
    KV bytes one token takes (for the slot count), the speculative-decoding plan, the plan's slot count for this
    placement (``(None, why)`` where there is none), a sequence's context in tokens and whether the model's layers
    are on a GPU. The server asks for this
    protocol, not for a format name or an attribute."""

    def batch_engine(self, *, slots: int, max_queue: int, reuse_prefix: bool = True) -> Any: ...

    def encode(self, request: Any) -> Any: ...

    def prefill_budget(self) -> tuple[int, str]: ...

    def kv_bytes_per_token(self) -> int: ...

    def speculative_plan(self) -> tuple[str, int, str]: ...

    def planned_slots(self) -> tuple[int | None, str]: ...

    @property
    def context_length(self) -> int: ...

    @property
    def on_gpu(self) -> bool: ...


def _telemetry_fallback(from_: str, to: str, reason: str) -> None:
    from edgesdk import telemetry

    telemetry.fallback_event(from_, to, reason)


@dataclass
class LoadContext:
    """What a loader gets: the bundle, the device profile, options, this host, and the fallback recorder.

    ``on_fallback`` is the telemetry hook each recorded step also goes to (a span event on the current
    span by default; ``None`` records only).
    """

    bundle: Bundle | None
    profile: Profile | None
    #: the bundle format's typed options (a loader narrows them: ``GgufLoadOptions.narrow(ctx.options)``)
    options: LoadOptions = field(default_factory=LoadOptions)
    host: HostFacts | None = None
    on_fallback: Callable[[str, str, str], None] | None = _telemetry_fallback
    fallbacks: list[dict[str, Any]] = field(default_factory=list)

    def record_fallback(self, from_: str, to: str, reason: str, **extra: Any) -> None:
        self.fallbacks.append({"from": from_, "to": to, "reason": reason, **extra})
        if self.on_fallback is not None:
            self.on_fallback(from_, to, reason)

    def host_facts(self) -> HostFacts:
        """This host (probed once per process unless the caller passed facts in)."""
        if self.host is None:
            from edgesdk.host import probe

            self.host = probe()
        return self.host

    @property
    def manifest(self) -> Manifest:
        """The bundle's manifest: the plan's decisions, io, runtime chain (empty without a bundle)."""
        return self.bundle.manifest if self.bundle is not None else Manifest()


Loader = Callable[["Bundle", LoadContext], Backend]

__all__ = [
    "Backend",
    "BatchingBackend",
    "GenerationOptions",
    "ImageLimits",
    "LLMBackend",
    "LoadContext",
    "Loader",
    "RequestStats",
    "TensorSpec",
    "VisionBackend",
    "VisionRequestStats",
    "check_feeds",
    "normalize_dtype",
]
