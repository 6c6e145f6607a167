# SPDX-License-Identifier: Apache-2.0
"""``edgesdk export --mender``: a bundle as a Mender module-image artifact (issue 36, item 5), written by Mender's
own ``mender-artifact`` tool (Debian package ``mender-artifact``), so the artifact format is Mender's, not ours.

The artifact has one payload of update-module type :data:`MODULE_TYPE`: ``bundle.tar``, a tar of the bundle
directory (and its ``BUNDLE.sig/`` when it is signed, so the device can run ``edgesdk verify``), with the bundle's
identity as the payload's meta-data (bundle id, profile, format, precision, ``manifest_sha256``). It provides
``edgesdk.<model>.version = <bundle id>`` (``--software-filesystem edgesdk``), so Mender's inventory shows which
build a device runs. ``--key`` signs the artifact (RSA, or ECDSA P-256: what mender-artifact signs with); the
result is checked with ``mender-artifact validate`` (with the public key when signed) before it is renamed into
place, so a half-written or unverifiable artifact never appears at the output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from edgesdk.bundle import open_bundle
from edgesdk.distribution import signing as sig
from edgesdk.errors import ExternalToolError, InputError, OutputExistsError

MODULE_TYPE = "edgesdk-bundle"
PAYLOAD = "bundle.tar"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def mender_artifact() -> str:
    exe = shutil.which("mender-artifact")
    if exe is None:
        raise ExternalToolError(
            "edgesdk export --mender needs Mender's mender-artifact tool: apt-get install mender-artifact "
            "(Debian/Ubuntu) or https://docs.mender.io/downloads"
        )
    return exe


def _signing_key(key: Path, tmp: Path) -> tuple[Path, Path]:
    """The private key as mender-artifact reads it (PKCS#1 RSA or SEC1 EC, unencrypted) and its public key, both
    written into the private temporary directory ``tmp``; an encrypted key reads $EDGESDK_SIGNING_KEY_PASSWORD."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
    except ImportError:
        raise ExternalToolError(
            "edgesdk export --mender --key needs the cryptography package: pip install 'edgesdk[sign]'"
        ) from None
    private = sig.load_private_pem(key, f"--key {key}")
    ok = isinstance(private, rsa.RSAPrivateKey) or (
        isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp256r1"
    )
    if not ok:
        raise InputError(f"--key {key}: mender-artifact signs with RSA or ECDSA P-256 keys only")
    out, pub = tmp / "signing.pem", tmp / "signing.pub.pem"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(
            private.private_bytes(  # type: ignore[union-attr]
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            )
        )
    pub.write_bytes(
        private.public_key().public_bytes(  # type: ignore[union-attr]
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return out, pub


def _mender_artifact(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)  # noqa: S603 - our own argument list
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr or proc.stdout).splitlines() if x.strip()]
        raise ExternalToolError(f"mender-artifact {what} failed ({proc.returncode}): {(lines or ['?'])[-1][:300]}")
    return proc.stdout


def export_mender(
    bundle_path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    device_types: list[str] | tuple[str, ...],
    *,
    key: str | os.PathLike[str] | None = None,
    artifact_name: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write ``bundle_path`` as a Mender module-image artifact at ``output`` (see the module docstring)."""
    exe = mender_artifact()
    bundle = open_bundle(bundle_path)  # verified: what is exported is what was built
    m = bundle.manifest
    if not device_types:
        raise InputError("--device-type is required: the Mender device type(s) the artifact installs on")
    for t in device_types:
        if not _NAME.match(t):
            raise InputError(f"--device-type {t!r}: use letters, digits and . _ + - (at most 128)")
    model = re.sub(r"[^A-Za-z0-9._-]", "-", m.model.name or bundle.path.name)[:64] or "model"
    name = artifact_name or f"{model}-{m.profile.name or 'unknown'}-{m.bundle_id}"
    if not _NAME.match(name):
        raise InputError(f"--artifact-name {name!r}: use letters, digits and . _ + - (at most 128)")
    out = Path(output)
    if out.suffix != ".mender":
        raise InputError(f"-o/--output {out}: a Mender artifact's name ends in .mender")
    if out.exists() and not force:
        raise OutputExistsError(f"output exists: {out}", hint="pass --force to replace it")
    if not out.parent.is_dir():
        raise InputError(f"-o/--output {out}: the directory {out.parent} does not exist")
    sigdir = sig.signature_dir(bundle.path)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        tar_path = tmp / PAYLOAD
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(bundle.path, arcname=bundle.path.name)
            if sigdir.is_dir():
                tar.add(sigdir, arcname=sigdir.name)
        meta = {
            "bundle": bundle.path.name,
            "bundle_id": m.bundle_id,
            "manifest_sha256": m.manifest_sha256,
            "model": m.model.name,
            "profile": m.profile.name,
            "format": m.format,
            "precision": m.precision,
            "signed": sigdir.is_dir(),
        }
        meta_path = tmp / "meta-data.json"
        meta_path.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        written = tmp / out.name
        cmd = [exe, "write", "module-image", "-T", MODULE_TYPE, "-n", name, "-o", str(written), "-f", str(tar_path),
               "-m", str(meta_path), "--software-filesystem", "edgesdk", "--software-name", model,
               "--software-version", str(m.bundle_id)]  # fmt: skip
        for t in device_types:
            cmd += ["-t", t]
        public = None
        if key is not None:
            private, public = _signing_key(Path(key), tmp)
            cmd += ["-k", str(private)]
        _mender_artifact(cmd, "write")
        _mender_artifact([exe, "validate", str(written), *(["-k", str(public)] if public else [])], "validate")
        os.replace(written, out)
    return {
        "artifact": str(out),
        "artifact_name": name,
        "bytes": out.stat().st_size,
        "type": MODULE_TYPE,
        "device_types": list(device_types),
        "provides": {f"edgesdk.{model}.version": m.bundle_id},
        "signed": key is not None,
        "bundle_signature_included": meta["signed"],
        "meta_data": meta,
    }
