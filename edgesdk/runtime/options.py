# SPDX-License-Identifier: Apache-2.0
"""Load options (``edgesdk.load(path, **options)``) as dataclasses, one per kind of backend.

Every backend reads :class:`LoadOptions` (``threads``, ``verbose``); the ONNX Runtime family (formats
``onnx``, ``tensorrt``, ``torch``) reads :class:`OnnxLoadOptions`, llama.cpp (``gguf``)
:class:`GgufLoadOptions` and the VLM pipeline (``vlm``) :class:`VlmLoadOptions`. :func:`parse_load_options`
turns the keyword arguments into the bundle format's dataclass and refuses, with one line (an
:class:`~edgesdk.errors.InputError`, exit 3), a key that format's loader does not read: before this,
``edgesdk.load(p, n_gpu_layer=8)`` (a typo) or ``n_gpu_layers`` on an ONNX bundle were ignored in silence.

The loader receives the dataclass itself (``LoadContext.options``), never a dict made from it: a field left
``None`` means "the default" (a loader tells "not given" from a given value, e.g. llama.cpp's ``flash_attn is
None``), and :meth:`LoadOptions.narrow` gives a loader its own kind's class when it was handed the shared one (a
loader called directly, outside :func:`edgesdk.load`). A registered (non built-in) format's own names arrive in
``extra``. :meth:`LoadOptions.to_dict` is a view for reports (the options that were set), not what loaders read.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from edgesdk.errors import InputError

_Options = TypeVar("_Options", bound="LoadOptions")


@dataclass(frozen=True)
class LoadOptions:
    """Options every backend reads."""

    threads: int | None = None  # CPU threads (a positive integer; default: the backend's own choice)
    verbose: bool | None = None  # the runtime's own log lines (llama.cpp) on stderr
    #: names a registered (non built-in) format reads besides these (its ``load_options`` attribute)
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    #: the formats whose loader reads exactly this class's fields
    formats: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise InputError(f"threads must be a positive integer (CPU threads), got {t!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names this class takes (``extra`` is not one)."""
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    @classmethod
    def narrow(cls: type[_Options], options: LoadOptions | None) -> _Options:
        """``options`` as this kind's class, for its loader: the object itself when it is one; the shared options
        (``threads``, ``verbose``, ``extra``) of a plain :class:`LoadOptions` (or ``None``: all defaults) in this
        class, the rest left unset; another kind's class is one :class:`InputError` (exit 3)."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if type(options) is not LoadOptions:
            raise InputError(
                f"{type(options).__name__} is for {', '.join(type(options).formats) or 'any'} bundles, "
                f"not {', '.join(cls.formats) or 'this format'}: use {cls.__name__}"
            )
        return cls(threads=options.threads, verbose=options.verbose, extra=dict(options.extra))

    def to_dict(self) -> dict[str, Any]:
        """The options that were set (not None): a view for reports and logs (loaders read the fields)."""
        out = {name: getattr(self, name) for name in self.names() if getattr(self, name) is not None}
        out.update((k, v) for k, v in self.extra.items() if v is not None)
        return out


@dataclass(frozen=True)
class OnnxLoadOptions(LoadOptions):
    """ONNX Runtime bundles (``onnx``), TensorRT engines with their ONNX Runtime fallback (``tensorrt``) and
    torch programs (``torch``)."""

    providers: list[str] | None = None  # execution providers to try, best first (default: the manifest's chain)
    cuda_graphs: bool | None = None  # capture CUDA graphs per shape bucket (default: as the profile says)
    placement: bool | None = None  # TensorRT: report which provider ran each node (default True)
    device: str | None = None  # torch: "cpu" keeps a torch program off the GPU (default "auto")
    eager_fallback: bool | None = None  # False: never measure the eager CUDA fallback (GPU bundles)
    eager_device: str | None = None  # the eager fallback's torch device (default: cuda when present)
    eager_measure: Callable[..., Any] | None = None  # replaces the load-time CPU-vs-eager measurement (tests)

    formats: ClassVar[tuple[str, ...]] = ("onnx", "tensorrt", "torch")


@dataclass(frozen=True)
class GgufLoadOptions(LoadOptions):
    """llama.cpp bundles (``gguf``); unset values come from the plan (manifest ``extras.llm``)."""

    chat_template: str | None = None  # a built-in template name or a Jinja file (default: the GGUF's own)
    n_ctx: int | None = None
    n_gpu_layers: int | str | None = None  # an integer, -1 or "all"
    flash_attn: bool | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    probe_in_child: bool | None = None  # try each GPU attempt in a child process first
    speculative: str | None = None  # "auto", "lookup" or "off" (default: the planner's, auto on a GPU, off on the CPU)

    formats: ClassVar[tuple[str, ...]] = ("gguf",)


@dataclass(frozen=True)
class VlmLoadOptions(LoadOptions):
    """Vision-language bundles (``vlm``): llama.cpp decoder + libmtmd, an optional ONNX vision encoder."""

    n_ctx: int | None = None
    n_gpu_layers: int | str | None = None
    use_mmap: bool | None = None  # False reads the decoder GGUF into memory (default: memory-mapped)
    vision_encoder: str | None = None  # "onnx" or "mmproj" (default: ONNX on TensorRT/CUDA, else the mmproj)

    formats: ClassVar[tuple[str, ...]] = ("vlm",)


OPTION_CLASSES: tuple[type[LoadOptions], ...] = (OnnxLoadOptions, GgufLoadOptions, VlmLoadOptions)


def options_class(fmt: str | None) -> type[LoadOptions]:
    """The dataclass of ``fmt``'s load options (:class:`LoadOptions` for a format registered from outside)."""
    return next((c for c in OPTION_CLASSES if fmt in c.formats), LoadOptions)


def all_option_names() -> frozenset[str]:
    """Every option some built-in loader reads."""
    classes: tuple[type[LoadOptions], ...] = (LoadOptions, *OPTION_CLASSES)
    return frozenset(name for cls in classes for name in cls.names())


def parse_load_options(
    options: Mapping[str, Any] | LoadOptions, fmt: str | None = None, extra_names: tuple[str, ...] = ()
) -> LoadOptions:
    """``options`` as ``fmt``'s dataclass; an unknown key is one :class:`InputError` naming it and the known ones.

    ``fmt=None`` (the bundle not opened yet) checks only the options every backend shares (``threads``);
    ``extra_names`` are the names a registered format adds (its ``load_options`` attribute).
    """
    if isinstance(options, LoadOptions):
        if fmt is not None and not isinstance(options, options_class(fmt)):
            raise InputError(
                f"{type(options).__name__} is for {', '.join(type(options).formats) or 'any'} bundles, "
                f"not {fmt}: use {options_class(fmt).__name__}"
            )
        return options
    if fmt is None:
        return LoadOptions(**{k: v for k, v in options.items() if k in LoadOptions.names()})
    cls = options_class(fmt)
    known = set(cls.names()) | set(extra_names)
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise InputError(_unknown_message(unknown, known, fmt))
    typed = {k: v for k, v in options.items() if k in cls.names()}
    return cls(**typed, extra={k: v for k, v in options.items() if k not in cls.names()})


def _unknown_message(unknown: list[str], known: set[str], fmt: str) -> str:
    """One line: the unknown names, what this format knows, and where a name (or its near spelling) applies."""
    hints = []
    for name in unknown:
        for cand in [name, *difflib.get_close_matches(name, sorted(all_option_names() | known), n=1, cutoff=0.8)]:
            if cand in known and cand != name:
                hints.append(f"did you mean {cand}?")
                break
            owners = [f for c in OPTION_CLASSES if cand in c.names() for f in c.formats]
            if cand not in known and owners:
                hints.append(f"{cand} applies to {', '.join(owners)} bundles, not {fmt}")
                break
    more = f"; {'; '.join(hints)}" if hints else ""
    return (
        f"unknown load option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
        f"(known: {', '.join(sorted(known))}{more})"
    )


__all__ = [
    "OPTION_CLASSES",
    "GgufLoadOptions",
    "LoadOptions",
    "OnnxLoadOptions",
    "VlmLoadOptions",
    "all_option_names",
    "options_class",
    "parse_load_options",
]
