# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by commands: JSON output, tables (the renderer is ``edgesdk.textable``), verbosity and
progress gating.

Verbosity is process-wide: ``-q/--quiet`` and ``-v/--verbose`` are accepted by the ``edgesdk`` group and by
every command (``edgesdk -q build ...`` and ``edgesdk build ... -q`` are the same). Quiet: no progress bars,
no informational or warning lines on stderr (errors still print). Verbose: the ``edgesdk`` loggers at INFO
and backends' own log lines (llama.cpp).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from edgesdk.textable import format_table as table

__all__ = [
    "also_write_option",
    "at_least_option",
    "emit_json",
    "info",
    "is_quiet",
    "is_verbose",
    "profile_option",
    "progress_enabled",
    "set_verbosity",
    "stderr_is_tty",
    "table",
    "warn",
]

_state = {"level": 0}  # -1 quiet, 0 normal, 1 verbose


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def set_verbosity(level: int) -> None:
    """-1 quiet, 0 normal, 1 verbose. Quiet wins over verbose when both are given."""
    if _state["level"] == -1 and level > 0:
        return
    _state["level"] = level
    log = logging.getLogger("edgesdk")
    if level < 0:
        log.setLevel(logging.ERROR)
    elif level > 0:
        log.setLevel(logging.INFO)
        if not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            log.addHandler(handler)


def is_quiet() -> bool:
    return _state["level"] < 0


def is_verbose() -> bool:
    return _state["level"] > 0


def progress_enabled(requested: bool = True) -> bool:
    """Progress bars only when asked for, not quiet, and stderr is a terminal (never into CI logs)."""
    return bool(requested) and not is_quiet() and stderr_is_tty()


def info(msg: str) -> None:
    """An informational line on stderr (suppressed by -q)."""
    if not is_quiet():
        click.echo(msg, err=True)


def warn(msg: str) -> None:
    """``warning: ...`` on stderr (suppressed by -q)."""
    if not is_quiet():
        click.echo(f"warning: {msg}", err=True)


def _verbosity_option(names: list[str], level: int, help: str) -> click.Option:
    """An eager flag that sets the verbosity ``level`` (-1 quiet, 1 verbose) before the command runs."""

    def set_level(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            set_verbosity(level)

    return click.Option(names, is_flag=True, expose_value=False, is_eager=True, callback=set_level, help=help)


def quiet_option() -> click.Option:
    return _verbosity_option(
        ["-q", "--quiet"], -1, "No progress bars, informational or warning lines on stderr (errors still print)."
    )


def verbose_option() -> click.Option:
    return _verbosity_option(
        ["-v", "--verbose"], 1, "More detail on stderr: edgesdk's INFO log lines and backends' own logs (llama.cpp)."
    )


def add_verbosity_options(cmd: click.Command) -> None:
    """Give ``cmd`` (and every subcommand of a group) ``-q/--quiet`` and ``-v/--verbose`` unless it has them."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            add_verbosity_options(sub)
    taken = {o for p in cmd.params for o in getattr(p, "opts", [])}
    if "-q" not in taken and "--quiet" not in taken:
        cmd.params.append(quiet_option())
    if "-v" not in taken and "--verbose" not in taken:
        cmd.params.append(verbose_option())


# ------------------------------------------------------------------ -p: the prompt (llama.cpp), not the profile
#: ``-p`` is the prompt of ``edgesdk run``, as in llama.cpp. build/inspect/profiler took ``-p`` for --profile
#: before 0.4: still accepted there (hidden from --help), with a deprecation warning on a terminal; removed in 0.5.
P_DEPRECATION = (
    "-p for --profile is deprecated and goes away in edgesdk 0.5 (-p is the prompt, as in "
    "llama.cpp and `edgesdk run`): write --profile"
)


class _ProfileOption(click.Option):
    """--profile that also takes the value(s) of the hidden, deprecated ``-p`` (stored in ``ctx.meta``)."""

    def consume_value(self, ctx: click.Context, opts):  # type: ignore[no-untyped-def]
        value, source = super().consume_value(ctx, opts)
        short = ctx.meta.get("edgesdk.short_p")
        if short and source is not click.core.ParameterSource.COMMANDLINE:
            return short, click.core.ParameterSource.COMMANDLINE
        if short and self.multiple:  # both spellings: every value counts
            return (*value, *short), source
        return value, source


def _short_p_cb(ctx: click.Context, _param: click.Parameter, value):  # type: ignore[no-untyped-def]
    if value:
        ctx.meta["edgesdk.short_p"] = value
        if stderr_is_tty():  # scripts and CI logs keep their output until 0.5 (docs: CLI conventions)
            warn(P_DEPRECATION)


def profile_option(dest: str = "profile", *, help: str, required: bool = False, multiple: bool = False):
    """``--profile`` for build/inspect/profiler, with ``-p`` as a deprecated hidden alias."""

    def decorate(f):  # type: ignore[no-untyped-def]
        f = click.option("--profile", dest, cls=_ProfileOption, required=required, multiple=multiple, help=help)(f)
        return click.option(
            "-p",
            "_short_p",
            hidden=True,
            multiple=multiple,
            is_eager=True,
            expose_value=False,
            callback=_short_p_cb,
            help="Deprecated spelling of --profile.",
        )(f)

    return decorate


def also_write_option(name: str, help: str):
    """``NAME FILE``: another file the command also writes (a file, not a directory), given to it as a
    :class:`~pathlib.Path` in ``<name>_path`` (``--html`` -> ``html_path``), None when not asked for."""
    return click.option(name, f"{name.lstrip('-')}_path", type=click.Path(path_type=Path, dir_okay=False), help=help)


def at_least_option(name: str, low: float, default: float, help: str):
    """``NAME N``: a number of at least ``low`` (a whole number when ``default`` is an int, else a float), its
    ``default`` shown in --help."""
    kind = click.IntRange(min=int(low)) if isinstance(default, int) else click.FloatRange(min=low)
    return click.option(name, type=kind, default=default, show_default=True, help=help)
