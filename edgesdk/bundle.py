# SPDX-License-Identifier: Apache-2.0
"""Bundle = a directory with ``manifest.json`` plus the artifacts it lists (sha256 each).

Written atomically: builders fill a staging directory next to the destination and
:func:`commit_staging` renames it into place, so a failed or interrupted build leaves nothing
behind and an existing bundle is replaced only with ``force``. :func:`output_lock` keeps two builds
from writing the same output at once; :func:`make_staging` marks its staging directory with the
owner (pid, host, start time) and removes the staging directories of dead builds (``kill -9``).

:func:`open_bundle` verifies before the runtime loads anything: the manifest (types, schema
version, its own hash, :mod:`edgesdk.manifest`) and every listed artifact (a regular file reached
without symlinks, one hard link, size and sha256). The runtime reads bundle files only through
:meth:`Bundle.file` / :meth:`Bundle.read_bytes`, which refuse a file the manifest does not list.
docs/security.md says what is verified where.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.errors import BundleIntegrityError, InputError, OutputExistsError
from edgesdk.manifest import SCHEMA, Artifact, LenientManifest, Manifest, parse_manifest

MANIFEST = "manifest.json"
OWNER_SUFFIX = ".owner"
_CHUNK = 1 << 20

__all__ = [
    "MANIFEST",
    "SCHEMA",
    "Artifact",
    "Bundle",
    "Manifest",
    "artifact_entry",
    "check_replaceable",
    "commit_staging",
    "clean_stale_staging",
    "discard_staging",
    "make_staging",
    "open_bundle",
    "output_lock",
    "sha256_file",
    "sha256_tree",
    "write_manifest",
]


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


def artifact_entry(staging: Path, rel: str, role: str) -> Artifact:
    full = Path(staging) / rel
    return Artifact(path=rel, role=role, sha256=sha256_file(full), bytes=full.stat().st_size)


# --------------------------------------------------------------------------------------------- writing


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux ``/proc``), to tell a live owner from a reused pid."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return stat_line.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _owner() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "proc_start": _proc_start(os.getpid()),
    }


def _is_stale(owner: dict[str, Any]) -> bool:
    """Only a build of this host whose process is gone (or whose pid now names another process)."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False  # another host's build (a shared file system): not ours to judge
    if not _pid_alive(pid):
        return True
    started = owner.get("proc_start")
    return started is not None and _proc_start(pid) not in (None, started)


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marker(staging: Path) -> Path:
    """The owner file of a staging directory: a sibling, so that nothing inside the bundle-to-be is ours."""
    return staging.with_name(staging.name + OWNER_SUFFIX)


def clean_stale_staging(out_dir: Path) -> list[Path]:
    """Remove ``.NAME.staging-*`` directories of dead builds of this host (only those with our owner file
    ``.NAME.staging-*.owner``), and put back a ``.NAME.old-PID`` bundle that a dead ``--force`` build moved
    aside before its new bundle landed. Returns what was removed."""
    out_dir = Path(out_dir)
    parent = out_dir.absolute().parent
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        if entry.name.startswith(f".{out_dir.name}.staging-") and entry.name.endswith(OWNER_SUFFIX):
            owner = _read_owner(entry)
            if owner is None or not _is_stale(owner):
                continue
            staging = entry.with_name(entry.name[: -len(OWNER_SUFFIX)])
            if staging.is_dir() and not staging.is_symlink():
                shutil.rmtree(staging, ignore_errors=True)
                removed.append(staging)
            entry.unlink(missing_ok=True)
        elif entry.name.startswith(f".{out_dir.name}.old-") and entry.is_dir() and not entry.is_symlink():
            pid = entry.name.rsplit("-", 1)[-1]
            if pid.isdigit() and _is_stale({"pid": int(pid), "host": socket.gethostname()}):
                if not out_dir.exists() and (entry / MANIFEST).is_file():
                    os.replace(entry, out_dir)  # the new bundle never landed: the old one is still the bundle
                else:
                    shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def _writable(out_dir: Path, parent: Path) -> Iterator[None]:
    """A read-only or forbidden output directory as one InputError line (exit 3), not an internal error."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise InputError(
            f"cannot write the output {out_dir}: {parent} is not writable ({exc.strerror})",
            hint="choose an output directory you can write to",
        ) from None


@contextlib.contextmanager
def output_lock(out_dir: Path) -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``out_dir`` (``fcntl.flock``) for a whole build.

    A second build into the same output does not wait: it fails at once with
    :class:`OutputExistsError` (exit 4) naming the build that holds the lock. The lock file is removed
    when the build ends (the inode is re-checked after locking, so a removed file is never trusted)."""
    out_dir = Path(out_dir)
    parent = out_dir.absolute().parent
    lock = parent / f".{out_dir.name}.lock"
    with _writable(out_dir, parent):
        parent.mkdir(parents=True, exist_ok=True)
    while True:
        with _writable(out_dir, parent):
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(os.pread(fd, 4096, 0) or b"{}")
                holder = f" (pid {info.get('pid')} on {info.get('host')})"
            os.close(fd)
            raise OutputExistsError(
                f"another edgesdk build is writing {out_dir}{holder}",
                hint="wait for it to finish, or build into another directory",
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and flock: take the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_owner()).encode(), 0)
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def make_staging(out_dir: Path, force: bool) -> Path:
    """Check the destination and create a staging directory beside it (same filesystem: rename is atomic).

    Beside it, ``.NAME.staging-XXXX.owner`` names the owner (pid, host, start time) so that a later build
    can remove it if this process dies (``kill -9``); stale staging directories of dead builds of this
    host are removed first (never another host's, never a live process's, never one without an owner file)."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise InputError(f"output path exists and is not a directory: {out_dir}")
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(out_dir)
    if out_dir.exists() and not force:
        raise OutputExistsError(f"output directory exists: {out_dir}", hint="pass --force to replace it")
    if out_dir.exists():
        check_replaceable(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes 0700; the bundle gets the usual directory mode
    _marker(staging).write_text(json.dumps(_owner()), encoding="utf-8")
    return staging


def check_replaceable(out_dir: Path) -> None:
    """``--force`` replaces only an edgesdk bundle (its manifest.json parses as one) or an empty directory;
    anything else is refused (exit 4), so a wrong ``-o`` cannot delete unrelated files."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    try:
        found = LenientManifest.from_json(json.loads((out_dir / MANIFEST).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        found = LenientManifest()
    if found.schema == SCHEMA:
        return
    raise OutputExistsError(
        f"refusing to replace {out_dir}: it is not an edgesdk bundle (no valid {MANIFEST}) and not empty",
        hint="choose another -o, or remove the directory yourself",
    )


def write_manifest(staging: Path, manifest: Manifest | dict[str, Any]) -> Path:
    """Write ``manifest.json`` (with its self-hash). A dict is read as the JSON layout (tests, tools)."""
    if not isinstance(manifest, Manifest):
        manifest = Manifest.from_layout(manifest)
    path = Path(staging) / MANIFEST
    path.write_text(manifest.to_json(), encoding="utf-8")
    return path


def commit_staging(staging: Path, out_dir: Path, force: bool) -> Path:
    """Move the finished staging dir to ``out_dir``; an old bundle is removed only after the new one is in place."""
    out_dir = Path(out_dir)
    backup = None
    if out_dir.exists():
        if not force:
            raise OutputExistsError(f"output directory exists: {out_dir}", hint="pass --force to replace it")
        check_replaceable(out_dir)
        backup = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, backup)
    try:
        os.replace(staging, out_dir)
    except OSError:
        if backup is not None:
            os.replace(backup, out_dir)
        raise
    _marker(Path(staging)).unlink(missing_ok=True)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    return out_dir


def discard_staging(staging: Path | None) -> None:
    if staging is not None:
        if Path(staging).exists():
            shutil.rmtree(staging, ignore_errors=True)
        _marker(Path(staging)).unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- reading


def _open_regular(root: Path, rel: str) -> tuple[int, os.stat_result]:
    """Open ``root/rel`` read-only without following any symlink; refuse anything but a regular file
    with one link. Returns the fd (caller closes) and its stat."""
    where = f"bundle {root}: {rel}"
    current = root
    parts = rel.split("/")
    for i, part in enumerate(parts):
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            raise BundleIntegrityError(f"bundle {root}: artifact missing: {rel}") from None
        except OSError as exc:
            raise BundleIntegrityError(f"{where}: cannot be read ({exc.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            raise BundleIntegrityError(
                f"{where}: is a symbolic link ({'/'.join(parts[: i + 1])}); bundles hold regular files only"
            )
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise BundleIntegrityError(f"{where}: {'/'.join(parts[: i + 1])} is not a directory")
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device file"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "not a regular file"
        )
        raise BundleIntegrityError(f"{where}: is {kind}; bundles hold regular files only")
    try:
        fd = os.open(current, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BundleIntegrityError(f"{where}: cannot be opened ({exc.strerror})") from None
    fst = os.fstat(fd)
    if not stat.S_ISREG(fst.st_mode) or (fst.st_ino, fst.st_dev) != (st.st_ino, st.st_dev):
        os.close(fd)
        raise BundleIntegrityError(f"{where}: changed while it was being opened")
    if fst.st_nlink > 1:
        os.close(fd)
        raise BundleIntegrityError(
            f"{where}: has {fst.st_nlink} hard links; a bundle file must have one "
            "(copy the bundle instead of hard-linking it)"
        )
    return fd, fst


def _read_fd(fd: int, limit: int | None = None) -> tuple[bytes | None, str]:
    """(contents if ``limit`` allows keeping them, sha256 hex)."""
    digest = hashlib.sha256()
    keep: list[bytes] | None = [] if limit is not None else None
    with os.fdopen(fd, "rb", closefd=True) as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            if keep is not None:
                keep.append(chunk)
    return (b"".join(keep) if keep is not None else None), digest.hexdigest()


@dataclass
class Bundle:
    path: Path
    manifest: Manifest

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def precision(self) -> str:
        return self.manifest.precision

    @property
    def model_name(self) -> str:
        return self.manifest.model.name or self.path.name

    def artifacts(self, role: str | None = None) -> list[Artifact]:
        return self.manifest.artifacts_with(role)

    def artifact_path(self, role: str) -> Path:
        for a in self.artifacts(role):
            return self.path / a.path
        raise BundleIntegrityError(f"bundle {self.path} has no artifact with role {role!r}")

    def has_artifact(self, role: str) -> bool:
        return bool(self.artifacts(role))

    def _listed(self, rel: str) -> Artifact | None:
        art = self.manifest.artifact(rel)
        if art is None and os.path.lexists(self.path / rel):
            raise BundleIntegrityError(
                f"bundle {self.path}: {rel} is present but not listed in the manifest "
                "(unverified files are never read)",
                hint="rebuild the bundle",
            )
        return art

    def file(self, rel: str) -> Path | None:
        """Path of the listed file ``rel`` (verified when the bundle was opened); ``None`` if the bundle
        neither lists nor holds it; exit 7 if it holds it without listing it."""
        return self.path / rel if self._listed(rel) is not None else None

    def read_bytes(self, rel: str) -> bytes | None:
        """Contents of the listed file ``rel``, hashed again as they are read (so a file swapped after
        :func:`open_bundle` is refused); ``None`` if neither listed nor present."""
        art = self._listed(rel)
        if art is None:
            return None
        fd, _ = _open_regular(self.path, art.path)
        data, sha = _read_fd(fd, limit=-1)
        if sha != art.sha256:
            raise BundleIntegrityError(f"bundle {self.path}: sha256 mismatch for {rel} (file changed since the build)")
        return data

    def verify(self) -> None:
        for a in self.manifest.artifacts:
            fd, st = _open_regular(self.path, a.path)
            if a.bytes is not None and st.st_size != a.bytes:
                os.close(fd)
                raise BundleIntegrityError(f"bundle {self.path}: size mismatch for {a.path}")
            _, sha = _read_fd(fd)
            if sha != a.sha256:
                raise BundleIntegrityError(
                    f"bundle {self.path}: sha256 mismatch for {a.path} (file changed since the build)"
                )


def open_bundle(path: str | os.PathLike[str], verify: bool = True) -> Bundle:
    path = Path(path)
    if not path.exists():
        raise InputError(f"bundle not found: {path}")
    if not path.is_dir():
        raise InputError(f"not a bundle directory: {path}")
    mpath = path / MANIFEST
    if not os.path.lexists(mpath):
        raise BundleIntegrityError(f"{path} is not a bundle: {MANIFEST} missing")
    fd, st = _open_regular(path, MANIFEST)
    if st.st_size > (16 << 20):
        os.close(fd)
        raise BundleIntegrityError(f"{mpath}: manifest is {st.st_size} bytes, not a bundle manifest")
    raw, _ = _read_fd(fd, limit=-1)
    bundle = Bundle(path=path, manifest=parse_manifest(raw or b"", str(mpath)))
    if verify:
        bundle.verify()
    return bundle


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is ENOSPC / EDQUOT."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False
