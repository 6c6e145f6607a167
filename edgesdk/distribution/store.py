# SPDX-License-Identifier: Apache-2.0
"""Push a bundle to an OCI registry, pull one into the local content-addressed store, list and remove.

The store is ``$EDGESDK_HOME`` (default ``~/.cache/edgesdk``): ``bundles/<manifest digest hex>/`` holds each
pulled bundle, ``bundles/.partial-<hex>/`` one being pulled (an interrupted pull resumes there, file by file
and within a file), ``refs.json`` which reference and profile each digest came from. A bundle directory
appears only by an atomic rename after every file matched its registry digest and the bundle's own sha256
table, so nothing half-pulled is ever loadable. What is in the store is used offline: a pull whose reference
cannot be resolved (no network) uses the digest the store last recorded for it, and says so.

Signatures (:mod:`.signing`): ``push`` attaches ``BUNDLE.sig/`` (``--sign KEY`` writes it first) as an OCI
artifact whose ``subject`` is the bundle's manifest, tagged ``sha256-<hex>.sig`` (cosign's convention, for
registries without the OCI 1.1 referrers API). Under a trust policy ``pull`` finds it (referrers API, else that
tag), checks that a trusted key signed a statement naming exactly the registry's files before downloading
anything, then the whole signature over the assembled directory before the rename that makes it visible; the
signature is kept as ``bundles/<hex>.sig/`` beside the bundle.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgesdk.bundle import open_bundle, sha256_file
from edgesdk.distribution import ARTIFACT_TYPE, FILE_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, PROFILE_KEY, TITLE_KEY
from edgesdk.distribution import signing as sig
from edgesdk.distribution.oci import (
    EMPTY_CONFIG,
    EMPTY_DIGEST,
    EMPTY_JSON,
    OCI_INDEX,
    OCI_MANIFEST,
    Client,
    Reference,
    RegistryError,
    sha256_digest,
)
from edgesdk.errors import BundleIntegrityError, InputError

MANIFEST = "manifest.json"
Progress = Callable[[str], None]


def home() -> Path:
    return Path(os.environ.get("EDGESDK_HOME") or Path.home() / ".cache" / "edgesdk")


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _annotations(bundle: Any) -> dict[str, str]:
    m = bundle.manifest
    out = {
        PROFILE_KEY: m.profile.name or "unknown",
        "io.edgesdk.format": m.format,
        "io.edgesdk.precision": m.precision,
        "io.edgesdk.bundle_id": m.bundle_id,
        "io.edgesdk.manifest_sha256": m.manifest_sha256,
        "io.edgesdk.model": m.model.name or "",
        "org.opencontainers.image.created": m.created,
    }
    if m.llm is not None and getattr(m.llm, "quant_type", None):
        out["io.edgesdk.quant_type"] = str(m.llm.quant_type)
    out.update({f"io.edgesdk.device.{key}": value for key, value in m.device_facts().items()})
    return {k: v for k, v in out.items() if v}


def push(
    path: str | os.PathLike[str] | list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
    ref_text: str,
    progress: Progress | None = None,
    sign_key: str | None = None,
    insecure: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Push the bundle(s) at ``path`` to ``ref_text`` (``oci://...:TAG``): each bundle's manifest by digest, then
    the tag as one OCI image index holding one entry per profile (a pushed bundle replaces an entry of the same
    profile; entries of other profiles stay). Several bundles must be builds of one model for distinct profiles;
    every one is opened and verified before anything is uploaded. ``sign_key``: sign each bundle first
    (``BUNDLE.sig/``); a ``BUNDLE.sig/`` present is attached either way. ``annotations``: added to each bundle's
    manifest (the build cache's key)."""
    ref = Reference.parse(ref_text)
    if ref.digest:
        raise InputError("push takes a tag, not a digest: oci://REGISTRY/NAMESPACE/NAME:TAG")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise InputError("push needs at least one bundle")
    bundles = [open_bundle(p) for p in paths]  # verified: what is pushed is what was built
    by_profile: dict[str, Path] = {}
    for b in bundles:
        prof = b.manifest.profile.name or "unknown"
        if prof in by_profile:
            raise InputError(f"{by_profile[prof]} and {b.path} are both for profile {prof}: one bundle per profile")
        by_profile[prof] = b.path
    models = {b.manifest.model.name or "" for b in bundles}
    if len(models) > 1:
        raise InputError(
            f"one push takes bundles of one model; these are of {', '.join(sorted(models))}: push them to other tags"
        )
    client = Client(ref, insecure=insecure)
    say = progress or (lambda _msg: None)
    signed = []
    for b in bundles:
        signed.append(sig.sign(b.path, sign_key) if sign_key else None)
        sigdir = sig.signature_dir(b.path)
        if sigdir.is_dir():
            built = {MANIFEST: sha256_file(b.path / MANIFEST)} | {a.path: a.sha256 for a in b.manifest.artifacts}
            if sig.unverified_subjects(sigdir) != built:
                raise InputError(
                    f"{sigdir} signs another build of {b.path}: sign it again (edgesdk sign, or push --sign KEY)"
                )
    pushed = [_push_bundle(client, b, say, annotations or {}) for b in bundles]
    new = {r["profile"] for r in pushed}
    existing = client.get_manifest(ref.tag)
    entries: list[dict[str, Any]] = []
    if existing is not None:
        media, old, old_digest = existing
        if media == OCI_INDEX:
            entries = [e for e in old.get("manifests", []) if (e.get("annotations") or {}).get(PROFILE_KEY) not in new]
        elif old.get("artifactType") == ARTIFACT_TYPE:
            old_profile = (old.get("annotations") or {}).get(PROFILE_KEY)
            if old_profile not in new:
                size = len(_canonical(old))
                entries = [
                    {
                        "mediaType": OCI_MANIFEST,
                        "digest": old_digest,
                        "size": size,
                        "artifactType": ARTIFACT_TYPE,
                        "annotations": {PROFILE_KEY: old_profile},
                    }
                ]
        else:
            raise InputError(f"{ref} holds something that is not an edgesdk bundle ({media}); push to another tag")
    for r in pushed:
        entries.append(
            {
                "mediaType": OCI_MANIFEST,
                "digest": r["manifest_digest"],
                "size": r["manifest_size"],
                "artifactType": ARTIFACT_TYPE,
                "annotations": {PROFILE_KEY: r["profile"]},
            }
        )
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "artifactType": ARTIFACT_TYPE, "manifests": entries}
    index_digest = client.put_manifest(ref.tag, _canonical(index), OCI_INDEX)
    for b, r, s_ in zip(bundles, pushed, signed, strict=True):
        sigdir = sig.signature_dir(b.path)
        r["signature"] = None
        if sigdir.is_dir():
            r["signature"] = attach_signature(client, r["manifest_digest"], r["manifest_size"], sigdir)
            say(f"signature attached: {r['signature']['tag']}")
        r["key_id"] = s_["key_id"] if s_ else None
        r.pop("manifest_size")
    one = pushed[0] if len(pushed) == 1 else None
    return {
        "reference": str(ref),
        "profile": one["profile"] if one else None,
        "manifest_digest": one["manifest_digest"] if one else None,
        "index_digest": index_digest,
        "profiles": sorted((e.get("annotations") or {}).get(PROFILE_KEY, "?") for e in entries),
        "bytes": sum(r["bytes"] for r in pushed),
        "uploaded_bytes": sum(r["uploaded_bytes"] for r in pushed),
        "files": sum(r["files"] for r in pushed),
        "signature": one["signature"] if one else None,
        "key_id": one["key_id"] if one else None,
        "bundles": pushed,
    }


def _push_bundle(client: Client, bundle: Any, say: Progress, extra: dict[str, str]) -> dict[str, Any]:
    """Upload one opened bundle's files (what the registry lacks) and its OCI image manifest, by digest."""
    files = [(MANIFEST, MANIFEST_MEDIA_TYPE, sha256_file(bundle.path / MANIFEST))]
    files += [(a.path, FILE_MEDIA_TYPE, a.sha256) for a in bundle.manifest.artifacts]
    layers, uploaded, total = [], 0, 0
    for rel, media, sha in files:
        fpath = bundle.path / rel
        size = fpath.stat().st_size
        digest = f"sha256:{sha}"
        if client.push_blob(digest, size, fpath):
            uploaded += size
            say(f"uploaded {rel} ({size / 1e6:.1f} MB)")
        else:
            say(f"{rel}: already in the registry")
        total += size
        layers.append({"mediaType": media, "digest": digest, "size": size, "annotations": {TITLE_KEY: rel}})
    client.push_blob(EMPTY_DIGEST, len(EMPTY_JSON), EMPTY_JSON)
    annotations = {**extra, **_annotations(bundle)}
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_CONFIG, "digest": EMPTY_DIGEST, "size": len(EMPTY_JSON), "data": "e30="},
        "layers": layers,
        "annotations": annotations,
    }
    body = _canonical(doc)
    digest = client.put_manifest(sha256_digest(body), body, OCI_MANIFEST)
    return {
        "path": str(bundle.path),
        "profile": annotations[PROFILE_KEY],
        "manifest_digest": digest,
        "manifest_size": len(body),
        "bytes": total,
        "uploaded_bytes": uploaded,
        "files": len(layers),
    }


def signature_tag(digest: str) -> str:
    """cosign's tag for the signature of ``digest``: ``sha256-<hex>.sig``."""
    return digest.replace(":", "-") + sig.SIG_SUFFIX


def attach_signature(client: Client, subject: str, subject_size: int, sigdir: Path) -> dict[str, Any]:
    """Push ``sigdir`` as an OCI artifact (one layer per signature file) whose ``subject`` is the manifest
    ``subject``, under the tag :func:`signature_tag` (replacing an older signature of the same manifest)."""
    media = {sig.MODEL_SIG: sig.MODEL_SIG_MEDIA_TYPE, sig.STATEMENT: sig.DSSE_MEDIA_TYPE}
    layers = []
    for name in sig.SIGNATURE_FILES:
        data = (sigdir / name).read_bytes()
        digest = sha256_digest(data)
        client.push_blob(digest, len(data), data)
        layers.append({"mediaType": media[name], "digest": digest, "size": len(data), "annotations": {TITLE_KEY: name}})
    client.push_blob(EMPTY_DIGEST, len(EMPTY_JSON), EMPTY_JSON)
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": sig.SIGNATURE_ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_CONFIG, "digest": EMPTY_DIGEST, "size": len(EMPTY_JSON), "data": "e30="},
        "layers": layers,
        "subject": {"mediaType": OCI_MANIFEST, "digest": subject, "size": subject_size},
        "annotations": {"io.edgesdk.predicate_type": sig.PREDICATE_TYPE},
    }
    body = _canonical(doc)
    tag = signature_tag(subject)
    digest = client.put_manifest(tag, body, OCI_MANIFEST)
    return {"tag": tag, "digest": digest}


def _fetch_signature(client: Client, subject: str, dest: Path) -> bool:
    """Download the edgesdk signature of manifest ``subject`` into ``dest`` (replaced); False when there is
    none. The referrers API where the registry has one, else cosign's tag."""
    found = client.referrers(subject, sig.SIGNATURE_ARTIFACT_TYPE)
    doc = None
    if found:
        got = client.get_manifest(str(found[-1].get("digest")))
        doc = got[1] if got else None
    if doc is None:
        got = client.get_manifest(signature_tag(subject))
        doc = got[1] if got else None
    if doc is None:
        return False
    if doc.get("artifactType") != sig.SIGNATURE_ARTIFACT_TYPE:
        return False  # another tool's signature (cosign's own) under the tag: not one edgesdk can check
    if (doc.get("subject") or {}).get("digest") != subject:
        raise sig.SignatureError(f"{client.ref}: the signature under {signature_tag(subject)} names another manifest")
    layers = doc.get("layers") or []
    titles = [str((x.get("annotations") or {}).get(TITLE_KEY)) for x in layers]
    if sorted(titles) != sorted(sig.SIGNATURE_FILES):
        raise sig.SignatureError(f"{client.ref}: the signature of {subject} holds {titles}, not {sig.SIGNATURE_FILES}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for layer, title in zip(layers, titles, strict=True):
        size = int(layer.get("size") or 0)
        if size > sig.MAX_SIGNATURE_FILE:
            raise sig.SignatureError(f"{client.ref}: the signature file {title} is {size} bytes, not a signature")
        client.fetch_blob(str(layer.get("digest")), size, dest / title)
    return True


# ---------------------------------------------------------------------------------------------- the store
@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _refs(root: Path) -> dict[str, Any]:
    try:
        data = json.loads((root / "refs.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_refs(root: Path, refs: dict[str, Any]) -> None:
    tmp = root / "refs.json.tmp"
    tmp.write_text(json.dumps(refs, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, root / "refs.json")


def _want_profile(profile: str | None) -> tuple[str | None, str]:
    """The canonical profile name ``--profile`` asks for, and how it was chosen (None: take the only entry)."""
    if profile is None:
        return None, "no profile asked for"
    if profile == "auto":
        from edgesdk.profiler.device import detect_device

        found = detect_device()
        if not found.best_match:
            raise InputError("--profile auto: no device profile matches this host; name one with --profile")
        why = "; ".join(found.evidence[:3])
        return found.best_match, f"auto: this host matches {found.best_match} ({why})"
    from edgesdk.profiles import resolve_profile

    return resolve_profile(profile).name, f"asked for {profile}"


@dataclass
class Pulled:
    path: Path
    reference: str
    digest: str
    profile: str
    how: str  # "pulled" | "already in the store" | "offline: the store's copy"
    choice: str

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) for k, v in self.__dict__.items()}


def pull(
    ref_text: str,
    profile: str | None = "auto",
    progress: Progress | None = None,
    trust: sig.TrustPolicy | None = None,
    insecure: bool = False,
) -> Pulled:
    """Pull ``ref_text`` into the store (the index entry of ``profile``; ``auto``: this host's detected
    profile), verified; return where it is. Works offline for what is already pulled.

    ``trust`` (default: the file ``$EDGESDK_TRUST_POLICY`` names, else none): when it requires a signature,
    an unsigned bundle is refused before anything is downloaded; any signature present must be by a trusted
    key and cover the bundle exactly, checked before the bundle becomes visible in the store (exit 7)."""
    ref = Reference.parse(ref_text)
    root = home()
    say = progress or (lambda _msg: None)
    policy = trust if trust is not None else sig.TrustPolicy.from_options(None, False, ())
    wanted, choice = _want_profile(profile)
    key = f"{ref}|{wanted or '*'}"
    client = Client(ref, insecure=insecure)
    try:
        found = client.get_manifest(ref.reference)
    except RegistryError as exc:
        known = _refs(root).get(key)
        if known and (root / "bundles" / known["digest"].split(":")[1]).is_dir():
            digest = known["digest"]
            if policy.active:
                _check_stored(root / "bundles" / digest.split(":")[1], policy)
            return Pulled(
                root / "bundles" / digest.split(":")[1],
                str(ref),
                digest,
                known["profile"],
                f"offline: the store's copy ({exc})",
                choice,
            )
        raise
    if found is None:
        raise InputError(f"{ref}: no such tag or digest in the registry")
    media, doc, digest = found
    if media == OCI_INDEX:
        entries = [e for e in doc.get("manifests", []) if e.get("artifactType", ARTIFACT_TYPE) == ARTIFACT_TYPE]
        names = [(e.get("annotations") or {}).get(PROFILE_KEY, "?") for e in entries]
        if wanted is None:
            if len(entries) != 1:
                raise InputError(f"{ref} holds {len(entries)} profiles ({', '.join(names)}): pick one with --profile")
            entry = entries[0]
        else:
            match = [e for e, n in zip(entries, names, strict=True) if n == wanted]
            if not match:
                raise InputError(f"{ref} has no bundle for profile {wanted} ({choice}); it holds: {', '.join(names)}")
            entry = match[0]
        digest = str(entry["digest"])
        got = client.get_manifest(digest)
        if got is None:
            raise RegistryError(f"{ref}: the index names {digest}, which the registry does not have")
        media, doc, digest = got
    if doc.get("artifactType") != ARTIFACT_TYPE:
        raise InputError(f"{ref} is not an edgesdk bundle (artifactType {doc.get('artifactType')!r})")
    bundle_profile = (doc.get("annotations") or {}).get(PROFILE_KEY, "?")
    if wanted is not None and bundle_profile != wanted:
        raise InputError(f"{ref}@{digest} is a bundle for {bundle_profile}, not {wanted}")
    hexd = digest.split(":")[1]
    final = root / "bundles" / hexd
    signed = False
    sig_partial = root / "bundles" / f".partial-{hexd}{sig.SIG_SUFFIX}"
    if policy.active:
        signed = _fetch_signature(client, digest, sig_partial)
        if not signed and policy.require_signature:
            raise sig.SignatureError(
                f"{ref}@{digest} is not signed (no edgesdk signature referrer, no tag {signature_tag(digest)}); "
                f"the trust policy ({policy.source}) requires a signature: nothing pulled"
            )
        if signed:  # a trusted key signed exactly these files: checked before any download
            layer_files = {
                str((x.get("annotations") or {}).get(TITLE_KEY)): str(x.get("digest", "")).removeprefix("sha256:")
                for x in doc.get("layers") or []
            }
            try:
                kid, predicate = sig.precheck(sig_partial, policy.trusted_keys, layer_files, f"{ref}@{digest}")
                if (predicate.get("profile") or "unknown") != bundle_profile:
                    raise sig.SignatureError(
                        f"{ref}@{digest}: annotated as a bundle for {bundle_profile}, signed as one for "
                        f"{predicate.get('profile')}"
                    )
            except sig.SignatureError:
                shutil.rmtree(sig_partial, ignore_errors=True)
                raise
            say(f"signed by trusted key {kid[:16]}")
        else:
            say(f"{ref}@{digest} is unsigned (the trust policy allows it)")

    def check(bundle_dir: Path) -> None:
        if signed:
            try:
                sig.verify(bundle_dir, policy.trusted_keys, sig_partial)
            except sig.SignatureError:
                shutil.rmtree(sig_partial, ignore_errors=True)
                if bundle_dir != final:
                    shutil.rmtree(bundle_dir, ignore_errors=True)
                raise

    with _locked(root):
        stored_sig = final.with_name(final.name + sig.SIG_SUFFIX)
        if final.is_dir():
            check(final)
            how = "already in the store"
        else:
            _assemble(client, doc, root / "bundles" / f".partial-{hexd}", final, say, check=check, before=(
                (lambda: _place(sig_partial, stored_sig)) if signed else None))  # fmt: skip
            how = "pulled"
        if signed and sig_partial.is_dir():
            _place(sig_partial, stored_sig)
        refs = _refs(root)
        refs[key] = {
            "digest": digest,
            "profile": bundle_profile,
            "reference": str(ref),
            "pulled": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        _save_refs(root, refs)
    return Pulled(final, str(ref), digest, bundle_profile, how, choice)


def _place(src: Path, dest: Path) -> None:
    """Move the directory ``src`` to ``dest``, replacing what is there."""
    if dest.exists():
        shutil.rmtree(dest)
    os.rename(src, dest)


def _check_stored(final: Path, policy: sig.TrustPolicy) -> None:
    """The store's copy under the policy: its kept signature verified again (offline use)."""
    stored = final.with_name(final.name + sig.SIG_SUFFIX)
    if not stored.is_dir():
        if policy.require_signature:
            raise sig.SignatureError(
                f"{final}: the store's copy has no signature and the trust policy ({policy.source}) requires one"
            )
        return
    sig.verify(final, policy.trusted_keys, stored)


def _assemble(
    client: Client,
    doc: dict[str, Any],
    partial: Path,
    final: Path,
    say: Progress,
    check: Callable[[Path], None] | None = None,
    before: Callable[[], None] | None = None,
) -> None:
    layers = doc.get("layers") or []
    partial.mkdir(parents=True, exist_ok=True)
    titles = []
    for layer in layers:
        title = str((layer.get("annotations") or {}).get(TITLE_KEY) or "")
        rel = PurePosixPath(title)
        if not title or rel.is_absolute() or ".." in rel.parts or "\\" in title or title in titles:
            raise BundleIntegrityError(f"{client.ref}: a layer names the path {title!r}: not a bundle file")
        titles.append(title)
        dest = partial / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            continue  # an earlier, interrupted pull finished this file
        size = int(layer.get("size") or 0)
        say(f"downloading {title} ({size / 1e6:.1f} MB)")
        client.fetch_blob(str(layer.get("digest")), size, dest)
    if MANIFEST not in titles:
        raise BundleIntegrityError(f"{client.ref}: the artifact has no {MANIFEST}")
    bundle = open_bundle(partial)  # every file against the bundle's own sha256 table
    listed = {MANIFEST} | {a.path for a in bundle.manifest.artifacts}
    if set(titles) != listed:
        raise BundleIntegrityError(
            f"{client.ref}: the registry's files differ from the bundle's list "
            f"(extra: {sorted(set(titles) - listed)}, missing: {sorted(listed - set(titles))})"
        )
    by_title = {str((x.get("annotations") or {}).get(TITLE_KEY)): str(x.get("digest")) for x in layers}
    for a in bundle.manifest.artifacts:
        if by_title[a.path] != f"sha256:{a.sha256}":
            raise BundleIntegrityError(f"{client.ref}: {a.path} is not the file the bundle lists")
    if check is not None:
        check(partial)  # the trust policy: the signature over the assembled directory, before it is visible
    if before is not None:
        before()
    os.rename(partial, final)


def entries() -> list[dict[str, Any]]:
    """What the store holds: one row per pulled bundle, with the references and profiles that name it."""
    root = home()
    refs = _refs(root)
    rows = []
    base = root / "bundles"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if d.name.startswith(".") or d.name.endswith(sig.SIG_SUFFIX) or not d.is_dir():
            continue
        names = [r for r, v in refs.items() if v.get("digest", "").endswith(d.name)]
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        first = refs[names[0]] if names else {}
        rows.append(
            {
                "digest": f"sha256:{d.name}",
                "references": sorted({refs[n]["reference"] for n in names}),
                "profile": first.get("profile", "?"),
                "bytes": size,
                "pulled": first.get("pulled", ""),
                "path": str(d),
                "signed": d.with_name(d.name + sig.SIG_SUFFIX).is_dir(),
            }
        )
    return rows


def remove(target: str) -> list[str]:
    """Remove the stored bundles ``target`` names (a reference, or a digest / its first 12+ hex characters)."""
    root = home()
    with _locked(root):
        refs = _refs(root)
        hexes = set()
        if target.startswith("oci://"):
            ref = str(Reference.parse(target))
            hexes = {v["digest"].split(":")[1] for v in refs.values() if v.get("reference") == ref}
        else:
            want = target.removeprefix("sha256:")
            if len(want) < 12:
                raise InputError("give a reference or at least 12 hex characters of a digest")
            base = root / "bundles"
            hexes = (
                {d.name for d in base.iterdir() if d.name.startswith(want) and not d.name.endswith(sig.SIG_SUFFIX)}
                if base.is_dir()
                else set()
            )
        if not hexes:
            raise InputError(f"nothing in the store matches {target}")
        for h in hexes:
            shutil.rmtree(root / "bundles" / h, ignore_errors=True)
            shutil.rmtree(root / "bundles" / (h + sig.SIG_SUFFIX), ignore_errors=True)
        _save_refs(root, {k: v for k, v in refs.items() if v.get("digest", "").split(":")[-1] not in hexes})
    return sorted(f"sha256:{h}" for h in hexes)
