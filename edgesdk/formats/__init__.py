# SPDX-License-Identifier: Apache-2.0
"""Output formats as plugins: one package per format, one line per format in :data:`BUILTIN`.

A format is an object implementing :class:`Format`: its name, how it takes part in the plan
(:meth:`Format.check_source`, :meth:`Format.claims` asked in ``claim_priority`` order,
:meth:`Format.plan_precision`, :meth:`Format.plan`), its build stages and :meth:`Format.build`, and where the
runtime finds its loader
(``runtime_loader``, a ``"module:function"`` string imported only when a bundle of that format is
loaded, so a device needs only its own backend's packages). The planner, the build, the runtime's
loader lookup, ``edgesdk build --format`` and the profiler all ask this registry; nothing else
lists formats.

Adding a format: a package ``edgesdk/formats/<name>/`` whose ``__init__`` defines ``FORMAT`` (keep
that module light: import heavy libraries inside ``plan``/``build``), plus its line in
:data:`BUILTIN`; or, from outside edgesdk, :func:`register` an object at import time. Its own
``edgesdk build`` options are declared there too (:class:`FormatOptions`, the format's ``options``).

:class:`BuildContext` (what :meth:`Format.build` is given) lives here beside the protocol, so a format
imports nothing from :mod:`edgesdk.build`; the build creates one per build. A format sits below the runtime and
imports nothing from :mod:`edgesdk.runtime`: one whose parity stage runs the runtime's own path names that
function in an optional ``parity_backend`` attribute (a ``"module:function"`` string, like ``runtime_loader``),
and the build imports it and hands it over as :attr:`BuildContext.parity_backend`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from edgesdk.errors import InputError

#: ``claim_priority`` of the catch-all (ONNX: it claims whatever reaches it), asked last. A registered format
#: without a ``claim_priority`` attribute gets this too, so it is asked after the built-in ones, in registry order.
CATCH_ALL = 0
#: ``claim_priority`` of a built-in format that claims only the sources it is made for (GGUF, VLM), asked before
#: the catch-all. A registered format that should be asked before these sets a higher number.
SPECIFIC = 10

if TYPE_CHECKING:
    from edgesdk.host import HostFacts
    from edgesdk.manifest import Artifact
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, Decision, ModelFacts, Plan, PlanSection


#: what ``click.option(...)`` returns: a decorator adding one option to a command
ClickOption = Callable[[Callable[..., Any]], Callable[..., Any]]
_O = TypeVar("_O", bound="FormatOptions")


@dataclasses.dataclass
class FormatOptions:
    """A format's own ``edgesdk build`` options, declared by the format: a dataclass subclass (named by the
    format's ``options`` attribute) with one field per option, named as its click parameter, holding what the
    command line gave (None: not given). ``edgesdk build`` adds each format's :meth:`click_options` to its shared
    ones, asks :meth:`check_request` before any work and :meth:`check_plan` once planned, and hands the values to
    the planner and the build in :class:`~edgesdk.types.BuildOptions` (:meth:`apply`).

    So adding an option to a format touches only its package: a field, its click option, and where the format
    reads it: ``options.option(name)``, the same-named ``BuildOptions`` field (the Python API's keyword, where
    there is one) or else ``BuildOptions.extra[name]``.
    """

    @staticmethod
    def click_options() -> list[ClickOption]:
        """The click options setting the fields, in the order ``edgesdk build --help`` lists them (import click
        inside: the format's package stays light)."""
        return []

    @classmethod
    def from_values(cls: type[_O], values: Mapping[str, Any]) -> _O:
        """The options as given: each field from the click command's keyword argument of its name."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def check_request(self, fmt: str | None) -> None:
        """Refuse (:class:`~edgesdk.errors.InputError`) an option that ``--format fmt`` has no use for, before any
        work (``fmt`` None: no ``--format``)."""

    def check_plan(self, fmt: str) -> None:
        """Refuse (:class:`~edgesdk.errors.InputError`) an option the planned format ``fmt`` has no use for."""

    def apply(self, options: BuildOptions) -> None:
        """Hand the values given to the planner and the build: each into the ``BuildOptions`` field of its name,
        or ``options.extra`` where there is none; a value not given (None, an empty repeatable) changes nothing."""
        names = {f.name for f in dataclasses.fields(options)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if f.name in names:
                setattr(options, f.name, value)
            else:
                options.extra[f.name] = value


@runtime_checkable
class Format(Protocol):
    """What every output format provides (see the module docstring).

    Optional attributes (read with a default, so a registered format may leave them out): ``claim_priority``
    (an int, :func:`claim_priority`; higher is asked first by the planner, :data:`CATCH_ALL` when absent),
    ``options`` (its :class:`FormatOptions` subclass: the ``edgesdk build`` options it owns; absent: none),
    ``facts`` (a method ``facts(path) -> ModelFacts | None``: the model facts of a file source it reads, e.g. the
    ONNX format's ``.onnx``, None for any other file, headers only; :func:`read_facts`; absent: reads no file)
    and ``parity_backend`` (below).
    """

    name: str
    #: build stages in order (a progress bar's steps); ``license_gate`` and ``package`` end every build
    stages: tuple[str, ...]
    #: ``"module:function"`` of the runtime loader ``(bundle, ctx) -> backend``
    runtime_loader: str
    #: (importable module, what to install) the runtime needs on the device, for a one-line refusal
    runtime_requires: tuple[str, str]
    #: the backend the profiler's roofline prediction assumes (None: no prediction for this format)
    profiler_backend: str | None
    #: offered by ``edgesdk build --format`` (False for formats a build falls back to by itself)
    selectable: bool

    def check_source(self, facts: ModelFacts) -> None:
        """Raise :class:`~edgesdk.errors.InputError` when ``--format <name>`` cannot take this source."""
        ...

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        """The ``format`` decision when this format is the natural choice for the model, else None (the planner
        asks the formats in :func:`claim_order` and takes the first claim; raising ends the search)."""
        ...

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        """A format-specific ``precision`` decision (None: the profile's precision order decides)."""
        ...

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> PlanSection | list[Decision]:
        """This format's decisions as its typed :class:`~edgesdk.types.PlanSection` (a registered format may
        return a list of decisions, kept untyped). Pure: no file, device or network access."""
        ...

    def build(self, ctx: BuildContext) -> None:
        """Fill ``ctx.staging`` with the artifacts and ``ctx.manifest`` with what was done."""
        ...


class StageProgress(Protocol):
    """The build's progress display as :class:`BuildContext` drives it (``edgesdk.build._Progress``)."""

    def stage(self, name: str) -> None: ...

    def done(self) -> None: ...

    def note(self, msg: str) -> None: ...


class BuildContext:
    """What a format builder sees: inputs, the staging dir, and ways to record what it did."""

    def __init__(
        self,
        source: Any,
        facts: ModelFacts,
        profile: Profile,
        plan: Plan,
        options: BuildOptions,
        staging: Path,
        progress: StageProgress,
    ):
        from edgesdk.manifest import Manifest

        self.source = source
        self.facts = facts
        self.profile = profile
        self.plan = plan
        self.options = options
        self.staging = staging
        # What the format builder records (typed): io, parity, embedding/llm settings, extras, and
        # format / runtime.backend_chain when they differ from the plan's. build() completes the rest.
        self.manifest = Manifest()
        self.runtime_requires: list[str] = []
        self.tools: dict[str, str] = {}
        self.stage_times: dict[str, float] = {}
        self._artifacts: dict[str, Artifact] = {}
        self._progress = progress
        self.precision = plan.precision
        self.fallbacks: list[dict[str, Any]] = []
        # the format's ``parity_backend`` (a runtime function), imported by the build, which may import the runtime
        self.parity_backend: Callable[..., Any] | None = None

    @contextlib.contextmanager
    def stage(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
        from edgesdk import telemetry

        self._progress.stage(name)
        t0 = time.perf_counter()
        with telemetry.build_stage(name, attributes) as span:
            yield span
        self.stage_times[name] = round(self.stage_times.get(name, 0.0) + time.perf_counter() - t0, 3)
        self._progress.done()

    def progress(self, msg: str) -> None:
        self._progress.note(msg)

    def add_artifact(self, rel: str, role: str) -> None:
        from edgesdk.bundle import artifact_entry

        self._artifacts[rel] = artifact_entry(self.staging, rel, role)

    def set_precision(self, precision: str) -> None:
        self.precision = precision

    def record_precision_fallback(self, from_: str, to: str, reason: str) -> None:
        from edgesdk import telemetry

        self.fallbacks.append({"from": from_, "to": to, "reason": reason, "stage": "verify"})
        telemetry.fallback_event(from_, to, reason)
        self.progress(f"parity miss at {from_} ({reason}); falling back to {to}")

    @property
    def artifacts(self) -> list[Artifact]:
        return list(self._artifacts.values())


# name -> module whose FORMAT attribute is the format; imported on first use. One line per format.
BUILTIN: dict[str, str] = {
    "onnx": "edgesdk.formats.onnx",
    "tensorrt": "edgesdk.formats.tensorrt",
    "gguf": "edgesdk.formats.gguf",
    "torch": "edgesdk.formats.torch",
    "vlm": "edgesdk.formats.vlm",
}

_registered: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add (or replace) a format; returns it, so it can be used as ``FORMAT = register(MyFormat())``."""
    if not isinstance(fmt, Format):
        raise TypeError(f"{fmt!r} does not implement edgesdk.formats.Format")
    _registered[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    _registered.pop(name, None)


def find_format(name: str) -> Format | None:
    """The format called ``name``, or None."""
    if name not in _registered and name in BUILTIN:
        _registered[name] = importlib.import_module(BUILTIN[name]).FORMAT
    return _registered.get(name)


def format_names(*, selectable: bool | None = None) -> list[str]:
    """Known format names, built-in ones first (``selectable=True``: those ``--format`` offers)."""
    names = list(dict.fromkeys([*BUILTIN, *_registered]))
    if selectable is None:
        return names
    return [n for n in names if (fmt := find_format(n)) is not None and fmt.selectable == selectable]


def get_format(name: str) -> Format:
    fmt = find_format(name)
    if fmt is None:
        raise InputError(f"unknown format {name!r} (known: {', '.join(format_names(selectable=True))})")
    return fmt


def all_formats() -> list[Format]:
    return [f for n in format_names() if (f := find_format(n)) is not None]


def option_classes() -> list[type[FormatOptions]]:
    """Each format's :class:`FormatOptions` subclass (``options``), in registry order; formats without one are
    left out. ``edgesdk build`` makes its format options from these."""
    out: list[type[FormatOptions]] = []
    for fmt in all_formats():
        cls = getattr(fmt, "options", None)
        if cls is None:
            continue
        if not (isinstance(cls, type) and issubclass(cls, FormatOptions) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"format {fmt.name!r}: options must be a FormatOptions dataclass, got {cls!r}")
        out.append(cls)
    return out


def read_facts(path: Path) -> ModelFacts | None:
    """The model facts of the file ``path`` from the first format (registry order) whose ``facts`` reads it
    (:func:`edgesdk.inspect.inspect_model` asks this for a file; None: no format reads this kind of file)."""
    for fmt in all_formats():
        reader: Callable[[Path], ModelFacts | None] | None = getattr(fmt, "facts", None)
        facts = reader(path) if reader is not None else None
        if facts is not None:
            return facts
    return None


def claim_priority(fmt: Format) -> int:
    """``fmt.claim_priority``, or :data:`CATCH_ALL` for a format without one."""
    priority = getattr(fmt, "claim_priority", CATCH_ALL)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"format {fmt.name!r}: claim_priority must be an int, got {priority!r}")
    return priority


def claim_order() -> list[Format]:
    """The formats in the order the planner asks them to claim a source: higher ``claim_priority`` first,
    registry order (:func:`format_names`) among equals. A specific format (GGUF: causal LMs and GGUF files;
    VLM: vision-language models) is asked before the catch-all (ONNX), which so need not know their tasks."""
    return sorted(all_formats(), key=lambda f: -claim_priority(f))  # sorted() is stable


__all__ = [
    "BUILTIN",
    "CATCH_ALL",
    "SPECIFIC",
    "BuildContext",
    "ClickOption",
    "Format",
    "FormatOptions",
    "StageProgress",
    "all_formats",
    "claim_order",
    "claim_priority",
    "find_format",
    "format_names",
    "get_format",
    "option_classes",
    "read_facts",
    "register",
    "unregister",
]
