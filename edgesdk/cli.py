# SPDX-License-Identifier: Apache-2.0
"""The ``edgesdk`` command line. Commands live in :mod:`edgesdk.commands`, one module each.

Errors: every :class:`~edgesdk.errors.EdgeSDKError` becomes ``error: <one line>`` on stderr and the
class's exit code (docs/exit-codes.md). Click usage errors exit 3 (bad input). With ``--json`` anywhere on
the command line, a failure also prints ``{"error": {"message", "exit_code", "type"}}`` on stdout (this
handler is the one place that does it). ``--debug`` (or ``EDGESDK_DEBUG=1``) re-raises so the traceback is
shown. ``-q/--quiet`` and ``-v/--verbose`` are accepted here and by every command
(:mod:`edgesdk.commands._common`).
"""

from __future__ import annotations

import os
import sys

import click

from edgesdk import __version__
from edgesdk.commands import register_all
from edgesdk.commands._common import add_verbosity_options, emit_json, set_verbosity
from edgesdk.errors import EdgeSDKError, InputError, Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgesdk")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No progress bars, informational or warning lines on stderr "
    "(errors still print). Every command also takes -q.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="edgesdk's INFO log lines and backends' own logs on stderr. Every command also takes -v.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, quiet: bool, verbose: bool) -> None:
    """Build, verify, license-gate, ship and profile models for edge and inference devices."""
    ctx.ensure_object(dict)
    if quiet or verbose:
        set_verbosity(-1 if quiet else 1)
    ctx.obj["debug"] = debug or os.environ.get("EDGESDK_DEBUG") == "1"
    if ctx.obj["debug"]:
        os.environ["EDGESDK_DEBUG"] = "1"


register_all(cli)
for _cmd in cli.commands.values():
    add_verbosity_options(_cmd)


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("EDGESDK_DEBUG") == "1"


def _json_requested(argv: list[str]) -> bool:
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--json" in options


def _fail(message: str, exit_code: int, kind: str, as_json: bool) -> None:
    """The one way a failure leaves the CLI: one line on stderr, a JSON error object on stdout with --json."""
    click.echo(f"error: {message}", err=True)
    if as_json:
        emit_json({"error": {"message": message, "exit_code": exit_code, "type": kind}})
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(argv)
    as_json = _json_requested(argv)
    try:
        rv = cli.main(args=argv, prog_name="edgesdk", standalone_mode=False)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, Terminated):  # click turns KeyboardInterrupt (Terminated too) into Abort
            _fail(str(exc.__cause__), exc.__cause__.exit_code, "Terminated", as_json)
        _fail("aborted", 130, "Abort", as_json)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        if debug:
            raise
        _fail(" ".join(exc.format_message().split()), InputError.exit_code, "UsageError", as_json)
    except click.ClickException as exc:
        if debug:
            raise
        _fail(" ".join(exc.format_message().split()), exc.exit_code, type(exc).__name__, as_json)
    except EdgeSDKError as exc:
        if debug:
            raise
        _fail(exc.one_line(), exc.exit_code, type(exc).__name__, as_json)
    except Terminated as exc:  # SIGTERM during a build (edgesdk/build.py): unwound like Ctrl-C
        _fail(str(exc), exc.exit_code, "Terminated", as_json)
    except KeyboardInterrupt:
        _fail("interrupted", 130, "KeyboardInterrupt", as_json)
    except Exception as exc:  # noqa: BLE001 - last resort: never a traceback by default
        if debug:
            raise
        _fail(
            f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} (run with --debug for the traceback)",
            1,
            "InternalError",
            as_json,
        )
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
