# SPDX-License-Identifier: Apache-2.0
"""edgesdk: build a model for a device profile, ship it as a verified bundle, run and profile it."""

from __future__ import annotations

__version__ = "0.1.0"


__all__ = ["__version__", "load"]


def load(bundle, **kwargs):
    """Open a bundle directory and return a :class:`edgesdk.runtime.session.Session`.

    Verifies every artifact's sha256 before loading, picks the best backend present on this
    machine and falls back along the plan's chain, recording each step (``session.report()``).
    Load options are keywords (``threads=2``, ``n_gpu_layers=...``) or ``options=`` the bundle kind's
    dataclass (:mod:`edgesdk.runtime.options`: ``OnnxLoadOptions``, ``GgufLoadOptions``, ``VlmLoadOptions``);
    one the bundle's loader does not read is an :class:`edgesdk.errors.InputError` (exit 3), not ignored.

    ``bundle`` may be an OCI reference (``oci://REGISTRY/NAMESPACE/NAME:TAG``): the bundle for the profile this
    host matches is pulled into the local store first (verified; used offline once pulled), as ``edgesdk pull``
    does (:mod:`edgesdk.distribution`).
    """
    from edgesdk.runtime.session import load as _load

    if isinstance(bundle, str) and bundle.startswith("oci://"):
        from edgesdk.distribution.store import pull

        bundle = pull(bundle, "auto").path
    return _load(bundle, **kwargs)
