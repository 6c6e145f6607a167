# SPDX-License-Identifier: Apache-2.0
"""Hugging Face model ids as build sources: ``edgesdk build org/name`` (or ``hf://org/name``).

A model id is looked up in the local Hugging Face cache first, as ``huggingface_hub`` lays it out
(``<cache>/models--org--name/refs/main`` names the revision, ``snapshots/<revision>/`` holds the files, each a
symlink into ``blobs/``); the cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``, as in ``huggingface_hub.constants``.
That needs no network and no ``huggingface_hub``. Only an id missing from the cache is downloaded, with
``huggingface_hub.snapshot_download`` (its public API, imported then), into that same cache and with its
progress bars; with ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``), or when the download fails, the
caller gets one :class:`~edgesdk.errors.ModelError` line (exit 3) naming the cache it looked in.

A local file or directory of the same name always wins: ``org/name`` is read as a model id only when no such
path exists (``hf://`` asks for the hub explicitly). A path that does not exist and ends in a model file's suffix
(``x/model.onnx``) stays a path, so its error stays "model not found".
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ModelError

PREFIX = "hf://"
# huggingface_hub's repo id rules (validate_repo_id): one "/", letters, digits, "-", "_", "."; no "--" or ".."; no
# leading or trailing "-" or "."; 96 characters at most
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_PART}/{_PART}")
# suffixes of a model file: a missing "dir/x.onnx" is a missing file, not a model id
FILE_SUFFIXES = (".onnx", ".gguf", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".json", ".tflite")
# files of other frameworks that a download leaves out (the build reads config.json, tokenizer files and
# safetensors; pickle weights only when the repository has no safetensors)
SKIP_ALWAYS = (
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.tflite",
    "*.mlmodel",
    "*.onnx",
    "*.onnx_data",
    "onnx/*",
    "openvino/*",
    "coreml/*",
    "*.gguf",
)
SKIP_PICKLE = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


@dataclass(frozen=True)
class HubModel:
    """A model id resolved to a snapshot directory of the Hugging Face cache."""

    written: str  # as the user wrote it: "org/name" or "hf://org/name"
    repo_id: str
    path: Path  # <cache>/models--org--name/snapshots/<revision>
    revision: str
    downloaded: bool = False

    @property
    def name(self) -> str:
        """The model's default name (spans, manifest, SBOM): the id's last part, not the revision hash."""
        return self.repo_id.split("/", 1)[1]

    def record(self) -> dict[str, str]:
        """What the manifest keeps of where the source came from."""
        return {"id": self.repo_id, "revision": self.revision, "source": self.written}


def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to a true value, as huggingface_hub reads it."""
    return _true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))


def cache_dir() -> Path:
    """The Hugging Face hub cache directory, from the environment as ``huggingface_hub.constants`` reads it."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(home).expanduser() / "hub"


def model_id(text: str) -> str | None:
    """The repo id ``text`` names (``org/name`` or ``hf://org/name``), or None when it is a local path.

    An ``hf://`` reference that is no valid id is a :class:`ModelError`; a bare ``org/name`` is an id only when
    no file or directory of that name exists and it does not end in a model file's suffix."""
    if text.startswith(PREFIX):
        repo = text[len(PREFIX) :].strip("/")
        if not _valid(repo):
            raise ModelError(
                f"{text}: not a Hugging Face model id",
                hint="write hf://ORG/NAME: letters, digits, '-', '_' and '.', one '/'",
            )
        return repo
    if Path(text).exists() or not _valid(text) or text.lower().endswith(FILE_SUFFIXES):
        return None
    return text


def _valid(repo: str) -> bool:
    return len(repo) <= 96 and "--" not in repo and ".." not in repo and REPO_ID.fullmatch(repo) is not None


def cached(repo_id: str, cache: Path | None = None) -> tuple[Path, str] | None:
    """The snapshot directory and revision of ``repo_id`` in the cache: the one ``refs/main`` names, else the only
    snapshot there is; None when the cache does not hold it."""
    repo_dir = (cache or cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="utf-8").strip()
        if revision and (snapshots / revision).is_dir():
            return snapshots / revision, revision
    found = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    if len(found) == 1:
        return found[0], found[0].name
    return None


def resolve(
    text: str, *, download: bool = True, progress: bool = True, say: Callable[[str], None] | None = None
) -> HubModel | None:
    """``text`` as a model id, found in the cache or downloaded into it; None when ``text`` is a local path.

    ``say`` gets one line saying where the model came from (``text`` as written); ``progress`` shows
    huggingface_hub's download bars; ``download=False`` (or ``HF_HUB_OFFLINE``) never touches the network."""
    repo_id = model_id(text)
    if repo_id is None:
        return None
    cache = cache_dir()
    hit = cached(repo_id, cache)
    if hit is not None:
        path, revision = hit
        if say:
            say(f"model {text}: revision {revision[:12]} from the Hugging Face cache ({path})")
        return HubModel(text, repo_id, path, revision)
    where = f"no local path {Path(text).resolve()}, and not in the Hugging Face cache {cache}"
    if not download or offline():
        why = "HF_HUB_OFFLINE is set" if offline() else "downloads are off"
        raise ModelError(
            f"model not found: {text}: {where} ({why})",
            hint="download it with network access, or point HF_HUB_CACHE/HF_HOME at the cache that holds it",
        )
    path = _download(text, repo_id, cache, progress, where, say)
    return HubModel(text, repo_id, path, path.name, downloaded=True)


def _download(
    text: str, repo_id: str, cache: Path, progress: bool, where: str, say: Callable[[str], None] | None
) -> Path:
    """snapshot_download of the files the build reads (no other framework's weights; pickle weights only in a
    repository without safetensors) into ``cache``; every failure is one ModelError line."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    except ImportError as exc:
        raise ModelError(
            f"model not found: {text}: {where}, and huggingface_hub is not installed to download it",
            hint="pip install 'edgesdk[build]'",
        ) from exc
    was_disabled = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        files = huggingface_hub.list_repo_files(repo_id)
        if "config.json" not in files:
            ggufs = [f for f in files if f.endswith(".gguf")]
            raise ModelError(
                f"{text}: the repository has no config.json (not a Hugging Face model directory)",
                hint=f"download one of its {len(ggufs)} .gguf files and build that file"
                if ggufs
                else "build a local model directory or file instead",
            )
        skip = list(SKIP_ALWAYS)
        if any(f.endswith(".safetensors") for f in files):
            skip += SKIP_PICKLE
        if say:
            say(f"model {text}: not in the Hugging Face cache {cache}: downloading {repo_id}")
        path = huggingface_hub.snapshot_download(repo_id, cache_dir=cache, ignore_patterns=skip)
    except ModelError:
        raise
    except Exception as exc:  # offline, unknown or gated repository, HTTP and disk errors: one line
        raise ModelError(f"model not found: {text}: {where}; downloading failed: {_reason(exc)}") from exc
    finally:
        if not progress and not was_disabled:
            enable_progress_bars()
    return Path(path)


def _reason(exc: Exception) -> str:
    """A short reason from huggingface_hub's errors (their messages run to several lines)."""
    name = type(exc).__name__
    hints = {
        "RepositoryNotFoundError": "no such repository (or it is private: log in with `hf auth login` or set HF_TOKEN)",
        "GatedRepoError": "the repository is gated: accept its terms on huggingface.co and log in "
        "(`hf auth login` or HF_TOKEN)",
        "RevisionNotFoundError": "its main revision was not found",
        "LocalEntryNotFoundError": "no network connection to the Hub",
    }
    if name in hints:
        return hints[name]
    first = " ".join(str(exc).split())[:160]
    return f"{name}: {first}" if first else name
