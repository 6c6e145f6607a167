# SPDX-License-Identifier: Apache-2.0
"""Bundle = a directory with ``manifest.json`` plus the artifacts it lists (sha256 each).

Written atomically: builders fill a staging directory next to the destination and
:func:`commit_staging` renames it into place, so a failed or interrupted build leaves nothing
behind and an existing bundle is replaced only with ``force``. :func:`open_bundle` verifies
every hash before the runtime loads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import BundleIntegrityError, InputError, OutputExistsError

MANIFEST = "manifest.json"
SCHEMA = "edgesdk.bundle/1"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_tree(path: Path) -> str:
    """Hash of a file, or of a directory's files (relative names + contents), for source identity."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts):
        digest.update(str(f.relative_to(path)).encode())
        digest.update(sha256_file(f).encode())
    return digest.hexdigest()


def artifact_entry(staging: Path, rel: str, role: str) -> dict:
    full = staging / rel
    return {"path": rel, "role": role, "sha256": sha256_file(full), "bytes": full.stat().st_size}


def make_staging(out_dir: Path, force: bool) -> Path:
    """Check the destination and create a staging directory beside it (same filesystem: rename is atomic)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise OutputExistsError(f"output directory exists: {out_dir}", hint="pass --force to replace it")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output path exists and is not a directory: {out_dir}")
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=parent))


def write_manifest(staging: Path, manifest: dict) -> Path:
    manifest = dict(manifest)
    manifest["schema"] = SCHEMA
    body = json.dumps(manifest, indent=2, sort_keys=False, default=str)
    path = staging / MANIFEST
    path.write_text(body + "\n", encoding="utf-8")
    return path


def commit_staging(staging: Path, out_dir: Path, force: bool) -> Path:
    """Move the finished staging dir to ``out_dir``; an old bundle is removed only after the new one is in place."""
    out_dir = Path(out_dir)
    backup = None
    if out_dir.exists():
        if not force:
            raise OutputExistsError(f"output directory exists: {out_dir}", hint="pass --force to replace it")
        backup = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, backup)
    try:
        os.replace(staging, out_dir)
    except OSError:
        if backup is not None:
            os.replace(backup, out_dir)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    return out_dir


def discard_staging(staging: Path | None) -> None:
    if staging is not None and Path(staging).exists():
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class Bundle:
    path: Path
    manifest: dict

    @property
    def bundle_id(self) -> str:
        return self.manifest.get("bundle_id", "")

    @property
    def format(self) -> str:
        return self.manifest.get("format", "")

    @property
    def precision(self) -> str:
        return self.manifest.get("precision", "")

    @property
    def model_name(self) -> str:
        return (self.manifest.get("model") or {}).get("name", self.path.name)

    def artifacts(self, role: str | None = None) -> list[dict]:
        return [a for a in self.manifest.get("artifacts", []) if role is None or a.get("role") == role]

    def artifact_path(self, role: str) -> Path:
        for a in self.artifacts(role):
            return self.path / a["path"]
        raise BundleIntegrityError(f"bundle {self.path} has no artifact with role {role!r}")

    def has_artifact(self, role: str) -> bool:
        return bool(self.artifacts(role))

    def verify(self) -> None:
        for a in self.manifest.get("artifacts", []):
            rel = Path(a["path"])
            if rel.is_absolute() or ".." in rel.parts:
                raise BundleIntegrityError(f"bundle {self.path}: artifact path escapes the bundle: {a['path']}")
            full = self.path / rel
            if not full.is_file():
                raise BundleIntegrityError(f"bundle {self.path}: artifact missing: {a['path']}")
            if full.stat().st_size != a.get("bytes", full.stat().st_size):
                raise BundleIntegrityError(f"bundle {self.path}: size mismatch for {a['path']}")
            if sha256_file(full) != a["sha256"]:
                raise BundleIntegrityError(f"bundle {self.path}: sha256 mismatch for {a['path']} (file changed "
                                           "since the build)")


def open_bundle(path: str | os.PathLike, verify: bool = True) -> Bundle:
    path = Path(path)
    if not path.exists():
        raise InputError(f"bundle not found: {path}")
    if not path.is_dir():
        raise InputError(f"not a bundle directory: {path}")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise BundleIntegrityError(f"{path} is not a bundle: {MANIFEST} missing")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleIntegrityError(f"{mpath}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise BundleIntegrityError(f"{mpath}: unknown manifest schema {manifest.get('schema')!r} (expected {SCHEMA})"
                                   if isinstance(manifest, dict) else f"{mpath}: manifest is not an object")
    bundle = Bundle(path=path, manifest=manifest)
    if verify:
        bundle.verify()
    return bundle
