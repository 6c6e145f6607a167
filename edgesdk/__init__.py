# SPDX-License-Identifier: Apache-2.0
"""edgesdk: build a model for a device profile, ship it as a verified bundle, run and profile it."""

from __future__ import annotations

__version__ = "0.1.0"


__all__ = ["__version__", "load"]


def load(bundle, *, verify_key=None, **kwargs):
    """Open a bundle directory and return a :class:`edgesdk.runtime.session.Session`.

    Verifies every artifact's sha256 before loading, picks the best backend present on this
    machine and falls back along the plan's chain, recording each step (``session.report()``).
    Load options are keywords (``threads=2``, ``n_gpu_layers=...``) or ``options=`` the bundle kind's
    dataclass (:mod:`edgesdk.runtime.options`: ``OnnxLoadOptions``, ``GgufLoadOptions``, ``VlmLoadOptions``);
    one the bundle's loader does not read is an :class:`edgesdk.errors.InputError` (exit 3), not ignored.

    ``bundle`` may be an OCI reference (``oci://REGISTRY/NAMESPACE/NAME:TAG``): the bundle for the profile this
    host matches is pulled into the local store first (verified; used offline once pulled), as ``edgesdk pull``
    does (:mod:`edgesdk.distribution`).

    ``verify_key`` (a public key file, PEM, or a list of them): the bundle must carry a signature by one of these
    keys that covers exactly its files (``edgesdk sign``; ``BUNDLE.sig/`` beside a directory, the registry's
    signature for an ``oci://`` reference, checked before any bundle byte is downloaded); unsigned, signed by
    another key or changed after signing is a :class:`edgesdk.errors.BundleIntegrityError` (exit 7) and nothing
    is loaded. Needs ``pip install 'edgesdk[sign]'``. ``$EDGESDK_TRUST_POLICY`` applies as well.
    """
    from edgesdk.runtime.session import load as _load

    policy = None
    if verify_key is not None:
        from edgesdk.distribution.signing import TrustPolicy

        keys = [verify_key] if isinstance(verify_key, (str, bytes)) or hasattr(verify_key, "__fspath__") else verify_key
        policy = TrustPolicy.from_options(None, True, [str(k) for k in keys])
    if isinstance(bundle, str) and bundle.startswith("oci://"):
        from edgesdk.distribution.store import pull

        bundle = pull(bundle, "auto", trust=policy).path
    elif policy is not None:
        from edgesdk.distribution.signing import verify

        verify(bundle, policy.trusted_keys, None)
    return _load(bundle, **kwargs)
