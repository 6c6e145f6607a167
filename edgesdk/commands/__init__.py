# SPDX-License-Identifier: Apache-2.0
"""CLI commands, one module per command or group. Each module exposes ``register(group)``.

Add a module here to add a command; nothing else needs to change. A command returns an ``int``
exit code (0 when omitted) and raises :class:`~edgesdk.errors.EdgeSDKError` for failures.
"""

from __future__ import annotations

import importlib

import click

COMMAND_MODULES = [
    "profiles",
    "build",
    "run",
    "doctor",
    "check",
    "inspect",
    "engine",
    "profiler",
    "serve",
    "distribution",
]


def register_all(group: click.Group) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"edgesdk.commands.{name}").register(group)
