# SPDX-License-Identifier: Apache-2.0
"""Signing a bundle and the trust policy that ``pull`` and ``verify`` enforce (issue 36, item 3).

A signature lives **beside** the bundle, never inside it: ``BUNDLE.sig/`` next to ``BUNDLE/`` (in the store,
``bundles/<hex>.sig/`` next to ``bundles/<hex>/``). Nothing is added to the bundle directory and
:func:`edgesdk.bundle.open_bundle` learns no reserved name, so a signature cannot be used to smuggle a file
into a bundle. ``BUNDLE.sig/`` holds two files, both signed with the same EC key:

* :data:`MODEL_SIG` (``model.sig``): OpenSSF ``model-signing``'s signature over the bundle directory (a sigstore
  bundle, DSSE envelope of its in-toto statement with predicate ``https://model_signing/signature/v1.0``: every
  file of the directory and its sha256). Any model-signing verifier checks it
  (``model_signing verify key BUNDLE --signature BUNDLE.sig/model.sig --public_key PUB.pem``); files added to,
  removed from or changed in the bundle break it.
* :data:`STATEMENT` (``statement.dsse.json``): edgesdk's own in-toto Statement v1 (:data:`PREDICATE_TYPE`) in a
  DSSE envelope: every bundle file as a subject (name, sha256), and the predicate edgesdk vouches for — the
  license verdict, the CycloneDX SBOM's digest, the parity results and the manifest's ``manifest_sha256``.
  model-signing's public API (``signing.Config().sign(model, signature)``) writes only its own predicate and
  takes no extra fields, so this statement is a second DSSE envelope signed with the same key through
  ``cryptography`` (ECDSA over DSSE's PAE, the scheme model-signing's key signer uses).

Only EC keys on P-256, P-384 or P-521 (the curves model-signing's key signer accepts). A key is named by its
*key id*: the sha256 of its PEM SubjectPublicKeyInfo, which model-signing records as the signature's public key
hint; the verifier picks the trusted key with that id and verifies both files with it.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.bundle import MANIFEST, Bundle, open_bundle, sha256_file
from edgesdk.errors import BundleIntegrityError, InputError
from edgesdk.extras import require

SIG_SUFFIX = ".sig"
MODEL_SIG = "model.sig"
STATEMENT = "statement.dsse.json"
SIGNATURE_FILES = (MODEL_SIG, STATEMENT)
MAX_SIGNATURE_FILE = 4 << 20  # a signature file is KBs; anything larger is not one of ours

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://edgesdk.dev/attestation/bundle/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
MODEL_SIG_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ARTIFACT_TYPE = "application/vnd.edgesdk.signature.v1"
SIGN_MODULES = ("model_signing", "OpenSSL")
CYCLONEDX = "application/vnd.cyclonedx+json"
CURVES = ("secp256r1", "secp384r1", "secp521r1")


class SignatureError(BundleIntegrityError):
    """A bundle is unsigned, signed by an untrusted key, or its signature does not cover its content (exit 7)."""


def signature_dir(bundle: str | os.PathLike[str]) -> Path:
    """Where the signature of ``bundle`` lives: the sibling directory ``BUNDLE.sig``."""
    path = Path(os.path.abspath(bundle))
    return path.with_name(path.name + SIG_SUFFIX)


# ---------------------------------------------------------------------------------------------- keys
def _read(path: Path, label: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"{label}: {exc.strerror or exc}") from None


def _ec(key: Any, cls: Any, label: str, what: str) -> Any:
    if not isinstance(key, cls) or key.curve.name not in CURVES:
        raise InputError(f"{label}: only EC P-256/P-384/P-521 {what} are supported (model-signing)")
    return key


def _load_public(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    label = f"trusted key {path}"
    try:
        key = serialization.load_pem_public_key(_read(path, label))
    except ValueError:
        raise InputError(f"{label} is not a PEM public key") from None
    return _ec(key, ec.EllipticCurvePublicKey, label, "public keys")


def load_private_pem(path: Path, label: str) -> Any:
    """The private key of the PEM file ``path``, decrypted with $EDGESDK_SIGNING_KEY_PASSWORD when that is set; one
    InputError starting with ``label`` (``signing key PATH``, ``--key PATH``) when the file cannot be read, is
    encrypted with no password set (or is not, with one set), or holds no PEM private key."""
    from cryptography.hazmat.primitives import serialization

    data = _read(path, label)
    password = os.environ.get("EDGESDK_SIGNING_KEY_PASSWORD")
    try:
        return serialization.load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        raise InputError(
            f"{label} is encrypted: set EDGESDK_SIGNING_KEY_PASSWORD"
            if not password
            else f"{label} is not encrypted: unset EDGESDK_SIGNING_KEY_PASSWORD"
        ) from None
    except ValueError:
        raise InputError(f"{label} is not a PEM private key (or the password is wrong)") from None


def _load_private(path: Path) -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    label = f"signing key {path}"
    return _ec(load_private_pem(path, label), ec.EllipticCurvePrivateKey, label, "keys")


def key_id(public_key: Any) -> str:
    """sha256 of the PEM SubjectPublicKeyInfo: the hint model-signing writes into its signature."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _hash_for(key: Any) -> Any:
    from cryptography.hazmat.primitives import hashes

    return {256: hashes.SHA256(), 384: hashes.SHA384(), 521: hashes.SHA512()}[key.curve.key_size]


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding (github.com/secure-systems-lab/dsse, protocol.md)."""
    ptype = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(ptype), ptype, len(payload), payload)


# ---------------------------------------------------------------------------------------------- the statement
def _files(bundle: Bundle) -> dict[str, str]:
    """Every file of the bundle -> sha256 (the manifest hashed here; the rest as it lists them, verified)."""
    out = {MANIFEST: sha256_file(bundle.path / MANIFEST)}
    out.update({a.path: a.sha256 for a in bundle.manifest.artifacts})
    return out


def statement(bundle: Bundle) -> dict[str, Any]:
    """The in-toto Statement v1 of a verified bundle: its files as subjects, edgesdk's predicate."""
    m = bundle.manifest
    lic = m.license or {}
    sbom_path = m.sbom_path
    sbom_art = m.artifact(sbom_path) if sbom_path else None
    if sbom_art is None:
        sbom_art = next(iter(m.artifacts_with("sbom")), None)
    predicate = {
        "bundle_id": m.bundle_id,
        "manifest_sha256": m.manifest_sha256,
        "model": m.model.name or "",
        "profile": m.profile.name or "",
        "format": m.format,
        "precision": m.precision,
        "license": {
            k: lic[k]
            for k in ("verdict", "policy_verdict", "counts", "policy", "model_license", "accepted", "waivers_used")
            if k in lic
        },
        "sbom": (
            {"path": sbom_art.path, "mediaType": CYCLONEDX, "digest": {"sha256": sbom_art.sha256}}
            if sbom_art is not None
            else None
        ),
        "parity": m.parity or {},
        "signed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": sha}} for name, sha in sorted(_files(bundle).items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


# ---------------------------------------------------------------------------------------------- signing
def sign(path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Sign the bundle at ``path`` with the EC private key at ``key_path``; write ``BUNDLE.sig/`` (replacing an
    older one only once the new one is complete). Returns where, the key id and the predicate."""
    require("sign", SIGN_MODULES, "edgesdk sign")
    from cryptography.hazmat.primitives.asymmetric import ec
    from model_signing import hashing, signing

    bundle = open_bundle(path)  # what is signed is what was built
    key = _load_private(Path(key_path))
    kid = key_id(key.public_key())
    dest = signature_dir(bundle.path)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        password = os.environ.get("EDGESDK_SIGNING_KEY_PASSWORD")
        # model-signing annotates the password as str but hands it to cryptography, which takes bytes
        pw: Any = password.encode("utf-8") if password else None
        (
            signing.Config()
            .use_elliptic_key_signer(private_key=Path(key_path), password=pw)
            .set_hashing_config(_hashing_config(hashing))
            .sign(bundle.path, tmp / MODEL_SIG)
        )
        doc = statement(bundle)
        payload = json.dumps(doc, sort_keys=True, indent=1).encode("utf-8")
        sig = key.sign(_pae(PAYLOAD_TYPE, payload), ec.ECDSA(_hash_for(key)))
        envelope = {
            "payloadType": PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode("ascii"),
            "signatures": [{"keyid": kid, "sig": base64.b64encode(sig).decode("ascii")}],
        }
        (tmp / STATEMENT).write_text(json.dumps(envelope, indent=1), encoding="utf-8")
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        if dest.exists():
            os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"bundle": str(bundle.path), "signature": str(dest), "key_id": kid, "predicate": doc["predicate"]}


def _hashing_config(hashing: Any) -> Any:
    """Every file of the bundle directory, sha256, no symlinks, nothing ignored (not even ``.git``)."""
    return (
        hashing.Config()
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
        .set_ignored_paths(paths=[], ignore_git_paths=False)
    )


# ---------------------------------------------------------------------------------------------- the trust policy
@dataclass
class TrustPolicy:
    """What a pull or a verify demands: ``require_signature`` refuses unsigned bundles; any signature present
    must be by one of ``trusted_keys`` (EC public keys, PEM) and cover the bundle exactly."""

    require_signature: bool = False
    trusted_keys: list[Path] = field(default_factory=list)
    source: str = "command line"

    @property
    def active(self) -> bool:
        return self.require_signature or bool(self.trusted_keys)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrustPolicy:
        """A policy file (YAML): ``require_signature: true`` and ``trusted_keys: [PUB.pem, ...]`` (paths relative
        to the file)."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"trust policy {p}: {getattr(exc, 'strerror', None) or exc}") from None
        if len(text) > (1 << 20):
            raise InputError(f"trust policy {p} is over 1 MiB")
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"trust policy {p} is not YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(data, dict):
            raise InputError(f"trust policy {p}: expected a mapping with require_signature and trusted_keys")
        unknown = sorted(set(map(str, data)) - {"require_signature", "trusted_keys"})
        if unknown:
            raise InputError(f"trust policy {p}: unknown key(s) {', '.join(unknown)} (require_signature, trusted_keys)")
        req = data.get("require_signature", False)
        keys = data.get("trusted_keys") or []
        if not isinstance(req, bool):
            raise InputError(f"trust policy {p}: require_signature must be true or false")
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise InputError(f"trust policy {p}: trusted_keys must be a list of public key files")
        policy = cls(req, [(p.parent / k) for k in keys], str(p))
        policy.check()
        return policy

    @classmethod
    def from_options(
        cls, policy_file: str | None, require_signature: bool, trusted_keys: tuple[str, ...] | list[str]
    ) -> TrustPolicy:
        """The policy of a command: the file's (or ``$EDGESDK_TRUST_POLICY``'s), tightened by the options."""
        path = policy_file or os.environ.get("EDGESDK_TRUST_POLICY") or None
        base = cls.load(path) if path else cls()
        merged = cls(
            base.require_signature or require_signature,
            [*base.trusted_keys, *(Path(k) for k in trusted_keys)],
            base.source if not (require_signature or trusted_keys) else f"{base.source} + options",
        )
        merged.check()
        return merged

    def check(self) -> None:
        if self.require_signature and not self.trusted_keys:
            raise InputError(f"trust policy ({self.source}): require_signature needs at least one trusted key")
        for k in self.trusted_keys:
            _load_public(k)


# ---------------------------------------------------------------------------------------------- verifying
@dataclass
class Verified:
    bundle: Path
    signature: Path
    key: Path
    key_id: str
    predicate: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "signature": str(self.signature),
            "key": str(self.key),
            "key_id": self.key_id,
            "predicate": self.predicate,
        }


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        if path.is_symlink() or not path.is_file():
            raise SignatureError(f"{path}: {what} missing (not a regular file)")
        if path.stat().st_size > MAX_SIGNATURE_FILE:
            raise SignatureError(f"{path}: {what} is over {MAX_SIGNATURE_FILE >> 20} MiB, not a signature")
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        raise SignatureError(f"{path}: {what} is not readable JSON") from None
    if not isinstance(data, dict):
        raise SignatureError(f"{path}: {what} is not a JSON object")
    return data


def _trusted(trusted_keys: list[Path]) -> dict[str, Path]:
    if not trusted_keys:
        raise InputError("verifying a signature needs a trusted key (--trusted-key PUB.pem or a policy file)")
    keys: dict[str, Path] = {}
    for k in trusted_keys:
        keys.setdefault(key_id(_load_public(k)), k)
    return keys


def _check_statement(sigdir: Path, keys: dict[str, Path]) -> tuple[Path, str, dict[str, str], dict[str, Any]]:
    """Which trusted key signed ``sigdir`` (model-signing's key hint), and the statement it signed, verified
    with that key: (key file, key id, subjects name -> sha256, predicate)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec

    if not sigdir.is_dir():
        raise SignatureError(f"not signed: no signature directory {sigdir}")
    extra = sorted(p.name for p in sigdir.iterdir() if p.name not in SIGNATURE_FILES)
    if extra:
        raise SignatureError(f"{sigdir}: unexpected file(s) {', '.join(extra)} in the signature directory")
    msig = _read_json(sigdir / MODEL_SIG, "model-signing signature")
    hint = ((msig.get("verificationMaterial") or {}).get("publicKey") or {}).get("hint")
    if not isinstance(hint, str) or not hint:
        raise SignatureError(f"{sigdir / MODEL_SIG}: names no signing key (a key-based model-signing signature)")
    if hint not in keys:
        raise SignatureError(f"{sigdir / MODEL_SIG}: signed by key {hint[:16]}, which is not a trusted key")
    key_path = keys[hint]
    spath = sigdir / STATEMENT
    env = _read_json(spath, "edgesdk statement")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
        sigs = [s for s in env["signatures"] if isinstance(s, dict) and s.get("keyid") == hint]
        if env.get("payloadType") != PAYLOAD_TYPE or not sigs:
            raise SignatureError(f"{spath}: no {PAYLOAD_TYPE} signature by key {hint[:16]}")
        pub = _load_public(key_path)
        raw = base64.b64decode(sigs[0]["sig"], validate=True)
        pub.verify(raw, _pae(PAYLOAD_TYPE, payload), ec.ECDSA(_hash_for(pub)))
        doc = json.loads(payload)
    except InvalidSignature:
        raise SignatureError(f"{spath}: the statement's signature does not verify with {key_path}") from None
    except (KeyError, TypeError, ValueError):
        raise SignatureError(f"{spath}: not a DSSE envelope") from None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE or doc.get("predicateType") != PREDICATE_TYPE:
        raise SignatureError(f"{spath}: not an edgesdk in-toto statement ({PREDICATE_TYPE})")
    try:
        subjects = {str(s["name"]): str(s["digest"]["sha256"]) for s in doc["subject"]}
    except (KeyError, TypeError):
        raise SignatureError(f"{spath}: malformed subject list") from None
    predicate = doc.get("predicate")
    if not isinstance(predicate, dict):
        raise SignatureError(f"{spath}: the statement has no predicate")
    return key_path, hint, subjects, predicate


def _same_files(spath: Path, subjects: dict[str, str], files: dict[str, str], where: str) -> None:
    for name in sorted(set(subjects) | set(files)):
        if name not in files:
            raise SignatureError(f"{where}: {name} was signed but is missing ({spath})")
        if name not in subjects:
            raise SignatureError(f"{where}: {name} was not signed ({spath})")
        if subjects[name] != files[name]:
            raise SignatureError(f"{where}: {name} is not the file that was signed ({spath})")


def precheck(sigdir: Path, trusted_keys: list[Path], files: dict[str, str], where: str) -> tuple[str, dict[str, Any]]:
    """Before a pull downloads anything: the signature is by a trusted key and its statement names exactly
    ``files`` (path -> sha256, the registry manifest's layers). Returns (key id, predicate)."""
    require("sign", SIGN_MODULES, "a trust policy")
    _, kid, subjects, predicate = _check_statement(sigdir, _trusted(trusted_keys))
    _same_files(sigdir / STATEMENT, subjects, files, where)
    return kid, predicate


def verify(
    path: str | os.PathLike[str], trusted_keys: list[Path], signature: str | os.PathLike[str] | None = None
) -> Verified:
    """Verify the bundle at ``path`` against its signature (``BUNDLE.sig/`` unless ``signature`` names another
    directory) and one of ``trusted_keys``; raise :class:`SignatureError` (exit 7) naming why and which file.

    In order: the signing key is trusted, edgesdk's statement verifies with it, the bundle opens (every file
    against its own sha256 table), the statement's subjects are exactly the bundle's files, and model-signing's
    signature verifies over the directory (no file added, removed or changed)."""
    require("sign", SIGN_MODULES, "verifying a bundle signature")
    from cryptography.exceptions import InvalidSignature
    from model_signing import hashing, verifying

    keys = _trusted(trusted_keys)
    sigdir = Path(signature) if signature is not None else signature_dir(path)
    if not sigdir.is_dir():
        raise SignatureError(f"{path} is not signed: no signature directory {sigdir}")
    key_path, kid, subjects, predicate = _check_statement(sigdir, keys)
    bundle = open_bundle(path)  # every file against the bundle's own table first (exit 7 naming the file)
    _same_files(sigdir / STATEMENT, subjects, _files(bundle), str(bundle.path))
    if predicate.get("manifest_sha256") != bundle.manifest.manifest_sha256:
        raise SignatureError(f"{sigdir / STATEMENT}: the predicate is not about this bundle's manifest")
    try:
        (
            verifying.Config()
            .use_elliptic_key_verifier(public_key=key_path)
            .set_hashing_config(_hashing_config(hashing))
            .verify(bundle.path, sigdir / MODEL_SIG)
        )
    except InvalidSignature:
        raise SignatureError(f"{sigdir / MODEL_SIG}: the signature does not verify with {key_path}") from None
    except Exception as exc:  # model-signing raises ValueError (mismatch) and protobuf/JSON errors on bad input
        text = " ".join(str(exc).split())[:400] or type(exc).__name__
        raise SignatureError(f"{sigdir / MODEL_SIG} does not cover {bundle.path}: {text}") from None
    return Verified(bundle.path, sigdir, key_path, kid, predicate)


def unverified_subjects(sigdir: Path) -> dict[str, str]:
    """The file -> sha256 list of ``sigdir``'s statement, NOT verified (push uses it to refuse attaching a
    signature of another build; trust comes only from :func:`verify` / :func:`precheck`)."""
    env = _read_json(sigdir / STATEMENT, "edgesdk statement")
    try:
        doc = json.loads(base64.b64decode(env["payload"], validate=True))
        return {str(s["name"]): str(s["digest"]["sha256"]) for s in doc["subject"]}
    except (KeyError, TypeError, ValueError):
        raise SignatureError(f"{sigdir / STATEMENT}: not a DSSE envelope of an edgesdk statement") from None
