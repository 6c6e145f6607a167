# SPDX-License-Identifier: Apache-2.0
"""One exception hierarchy for the whole SDK.

Every error a user can cause is an :class:`EdgeSDKError` subclass with a documented exit code
(docs/exit-codes.md). The CLI prints ``error: <message>`` on one line and exits with ``exit_code``;
``--debug`` shows the traceback. Library callers catch the class they care about.
"""

from __future__ import annotations


class EdgeSDKError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; ``hint`` is an optional second clause."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(text.split())


class VerdictError(EdgeSDKError):
    """A check ran and said no: license deny, trace violations, performance regression, budget miss."""

    exit_code = 2


class InputError(EdgeSDKError):
    """Bad input: unknown profile, invalid profile file, missing/corrupt/unsupported model, bad shapes."""

    exit_code = 3


class ProfileError(InputError):
    """A device profile is unknown or invalid (message names file, key and expected type)."""


class ModelError(InputError):
    """The model source is missing, corrupt, unsafe (pickle) or of an unsupported architecture."""


class ShapeError(InputError):
    """Runtime inputs do not match the model's input spec."""


class OutputExistsError(EdgeSDKError):
    """The output bundle directory exists and ``--force`` was not given."""

    exit_code = 4


class ParityError(EdgeSDKError):
    """The built artifact does not match the source model within the plan's thresholds."""

    exit_code = 5


class BackendUnavailableError(EdgeSDKError):
    """No backend on this machine can run the bundle (after every fallback was tried)."""

    exit_code = 6


class BundleIntegrityError(EdgeSDKError):
    """A bundle's manifest is missing/invalid or an artifact's sha256 does not match."""

    exit_code = 7


class ResourceError(EdgeSDKError):
    """The model does not fit the device's memory budget at any allowed precision/context."""

    exit_code = 8


class DiskFullError(EdgeSDKError):
    """The output's file system ran out of space (ENOSPC/EDQUOT) while writing; nothing was written."""

    exit_code = 11


class Terminated(KeyboardInterrupt):
    """SIGTERM (``docker stop``, systemd, CI cancellation) during a build: unwound like Ctrl-C (staging
    removed). A ``KeyboardInterrupt`` so that no ``except Exception`` in a stage can swallow it."""

    exit_code = 143


class LicenseGateError(VerdictError):
    """The license gate denied packaging (report written next to the would-be bundle)."""


class ExternalToolError(EdgeSDKError):
    """A required external tool or service failed or is unreachable (scanner, TensorRT, exporter)."""

    exit_code = 10


class MissingExtraError(ExternalToolError):
    """An optional part of edgesdk is not installed; the message names the pip extra that adds it
    (``edgesdk build needs the build extra: pip install 'edgesdk[build]'``). Raised by
    :func:`edgesdk.extras.require`."""

    def __init__(self, message: str, *, hint: str | None = None, extra: str):
        super().__init__(message, hint=hint)
        self.extra = extra


def shown(value: object) -> str:
    """``repr(value)`` cut to one short piece for an error message: a 4000-digit number is not echoed whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
