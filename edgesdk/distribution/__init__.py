# SPDX-License-Identifier: Apache-2.0
"""Bundles on OCI registries: push, pull into a content-addressed store, list, remove (issue 36).

Any registry that speaks the OCI distribution API (CNCF distribution, Harbor, Zot, ECR, GHCR) holds bundles; no
registry of our own. :mod:`.oci` is the client (the distribution API over the standard library's HTTP, so the
runtime-only install on a device can pull), :mod:`.store` the local store. The layout a registry holds:

* one **OCI image manifest per bundle** (``artifactType`` :data:`ARTIFACT_TYPE`): the empty config, one layer
  per bundle file (``manifest.json`` first, media type :data:`MANIFEST_MEDIA_TYPE`; every other file
  :data:`FILE_MEDIA_TYPE`, its path in ``org.opencontainers.image.title``), annotations naming the profile,
  format, precision, quantization, bundle id and the device facts (SM, JetPack, L4T) it was built for;
* several profiles of one model under one tag: an **OCI image index** with one entry per profile
  (annotation :data:`PROFILE_KEY`), which ``pull --profile`` resolves as ``docker pull`` resolves a platform.

Pulled bundles are verified twice before anyone can use them: every blob against the registry's digest as it
is downloaded, then the assembled directory against the bundle's own sha256 table (``open_bundle``); it
appears in the store by an atomic rename, so a half bundle is never visible.
"""

from __future__ import annotations

ARTIFACT_TYPE = "application/vnd.edgesdk.bundle.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.edgesdk.bundle.manifest.v1+json"
FILE_MEDIA_TYPE = "application/vnd.edgesdk.bundle.file.v1"
PROFILE_KEY = "io.edgesdk.profile"
TITLE_KEY = "org.opencontainers.image.title"

__all__ = ["ARTIFACT_TYPE", "FILE_MEDIA_TYPE", "MANIFEST_MEDIA_TYPE", "PROFILE_KEY", "TITLE_KEY"]
