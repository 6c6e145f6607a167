# SPDX-License-Identifier: Apache-2.0
"""The ``edgesdk`` command line. Commands live in :mod:`edgesdk.commands`, one module each.

Errors: every :class:`~edgesdk.errors.EdgeSDKError` becomes ``error: <one line>`` on stderr and the
class's exit code (docs/exit-codes.md). Click usage errors exit 3 (bad input). ``--debug`` (or
``EDGESDK_DEBUG=1``) re-raises so the traceback is shown.
"""

from __future__ import annotations

import os
import sys

import click

from edgesdk import __version__
from edgesdk.commands import register_all
from edgesdk.errors import EdgeSDKError, InputError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgesdk")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Build, verify, license-gate, ship and profile models for edge and inference devices."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug or os.environ.get("EDGESDK_DEBUG") == "1"
    if ctx.obj["debug"]:
        os.environ["EDGESDK_DEBUG"] = "1"


register_all(cli)


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("EDGESDK_DEBUG") == "1"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(argv)
    try:
        rv = cli.main(args=argv, prog_name="edgesdk", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        if debug:
            raise
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(InputError.exit_code)
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except EdgeSDKError as exc:
        if debug:
            raise
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last resort: never a traceback by default
        if debug:
            raise
        click.echo(f"error: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                   err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
