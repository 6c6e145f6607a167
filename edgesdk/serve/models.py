# SPDX-License-Identifier: Apache-2.0
"""The models ``edgesdk serve`` answers for: bundles loaded by :func:`edgesdk.load`, each wrapped in a
:class:`~edgesdk.serve.config.ModelEntry` by what its backend can do (an
:class:`~edgesdk.runtime.backend.LLMBackend` is an LLM, a :class:`~edgesdk.runtime.backend.VisionBackend` one whose
chats take images; feature-extraction bundles are embedding models) with its limits (the manifest's ``serve``
table, capped by the LLM's context). Which bundles a serve-wide load option applies to is read from each format's
typed load options (:func:`~edgesdk.runtime.options.options_class`), not from format names."""

from __future__ import annotations

from pathlib import Path

from edgesdk.errors import InputError, shown
from edgesdk.manifest import Manifest
from edgesdk.runtime.backend import BatchingBackend, LLMBackend, VisionBackend
from edgesdk.runtime.options import options_class
from edgesdk.serve.config import DEFAULT_MAX_TOKENS, DEFAULT_MAX_TOKENS_CAP, ModelEntry

__all__ = ["load_models", "model_entry", "serve_limits"]

_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def serve_limits(manifest: Manifest) -> dict:
    """Per-bundle limits: a ``serve`` table in the manifest (or in its profile summary), else the defaults."""
    table, where = manifest.serve_table()
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise InputError(
            f"manifest {where} must be a table of limits (max_tokens, default_max_tokens), got {shown(table)}"
        )
    cap = table.get("max_tokens", DEFAULT_MAX_TOKENS_CAP)
    default = table.get("default_max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise InputError(f"manifest {where}.max_tokens must be a positive integer, got {shown(cap)}")
    if not isinstance(default, int) or isinstance(default, bool) or default < 1:
        raise InputError(f"manifest {where}.default_max_tokens must be a positive integer, got {shown(default)}")
    return {"max_tokens_cap": cap, "default_max_tokens": min(default, cap)}


def model_entry(name: str, session, *, allow_local_images: Path | None = None) -> ModelEntry:
    """Wrap a loaded session: an LLM backend's (GGUF, VLM) is an LLM (a vision backend's chats take images: its
    entry's ``images`` policy, local files only under ``allow_local_images``); feature-extraction bundles are
    embedding models."""
    bundle = session.bundle
    task = bundle.manifest.model.task
    backend = session.backend
    images = None
    if isinstance(backend, VisionBackend):
        from edgesdk.serve.images import vlm_policy

        kind, images = "llm", vlm_policy(session, allow_local_images)
    elif isinstance(backend, LLMBackend):
        kind = "llm"
    elif task == "feature-extraction":
        kind = "embedding"
    else:
        raise InputError(
            f"bundle {bundle.path} ({bundle.format}, task {task!r}) is neither an LLM (GGUF), a VLM "
            "nor a text-embedding model: edgesdk serve answers chat/completions and embeddings only"
        )
    limits = serve_limits(bundle.manifest)
    if kind == "llm":
        # the context: a sequence's (a batching backend's context_length)
        n_ctx = backend.context_length if isinstance(backend, BatchingBackend) else 0
        limits["max_tokens_cap"] = min(limits["max_tokens_cap"], n_ctx or limits["max_tokens_cap"])
        limits["default_max_tokens"] = min(limits["default_max_tokens"], limits["max_tokens_cap"])
    return ModelEntry(name=name, session=session, kind=kind, images=images, **limits)


def load_models(
    bundles: list[str | Path],
    names: list[str] | None = None,
    *,
    profile: str | None = None,
    threads: int | None = None,
    chat_template: str | None = None,
    allow_local_images: str | Path | None = None,
    llm_options: dict | None = None,
) -> list[ModelEntry]:
    """Load each bundle with :func:`edgesdk.load`; a model's name is its directory name unless ``names`` says.

    ``chat_template`` (a shipped name or a Jinja file) formats the chats of every GGUF bundle, over the one
    bundled at build time or the GGUF's own; with no GGUF bundle to apply it to it is refused.
    ``allow_local_images``: a directory whose files VLM chats may name as ``image_url`` (else data URLs only).
    ``llm_options``: load options of the LLM bundles (``n_ctx``, ``n_gpu_layers`` for GGUF and VLM bundles;
    ``speculative`` for GGUF ones); refused when no bundle takes them."""
    import edgesdk
    from edgesdk.bundle import open_bundle
    from edgesdk.runtime.session import check_load_options
    from edgesdk.serve.images import allowed_dir

    if threads is not None:
        check_load_options({"threads": threads})  # before any bundle is loaded: --threads -4 fails at once
    if chat_template is not None:
        from edgesdk.formats.gguf.chat_templates import resolve

        resolve(chat_template)  # a bad name or file fails before any bundle is loaded
    local = allowed_dir(allow_local_images)
    formats = [open_bundle(p, verify=False).format for p in bundles]  # the manifests only
    # what each bundle's loader reads: its format's typed load options (GgufLoadOptions, VlmLoadOptions, ...)
    takes = [set(options_class(f).names()) for f in formats]
    if chat_template is not None and not any("chat_template" in t for t in takes):
        raise InputError(
            f"--chat-template formats the chats of GGUF bundles; none of these is one "
            f"({', '.join(sorted(set(formats)))})"
        )
    llm_options = dict(llm_options or {})
    if llm_options and not any("n_ctx" in t for t in takes):  # an LLM's loader reads a context length
        raise InputError(f"{', '.join(sorted(llm_options))} apply to LLM bundles; none of these is one")
    if "speculative" in llm_options and not any("speculative" in t for t in takes):
        raise InputError("--speculative applies to GGUF bundles; none of these is one")
    if local is not None and not any("vision_encoder" in t for t in takes):  # the loader of image chats
        raise InputError("--allow-local-images lets VLM chats name image files; none of these bundles is a VLM")
    names = list(names or [])
    if len(names) > len(bundles):
        raise InputError(f"{len(names)} --name values for {len(bundles)} bundles")
    entries: list[ModelEntry] = []
    seen: set[str] = set()
    for i, path in enumerate(bundles):
        path = Path(path)
        name = names[i] if i < len(names) else path.resolve().name
        if not name or not set(name) <= _NAME_OK:
            raise InputError(f"model name {name!r} may hold only letters, digits and -_.: (use --name)")
        if name in seen:
            raise InputError(f"two bundles are both named {name!r}: give each a --name")
        seen.add(name)
        options: dict = {"threads": threads} if threads is not None else {}
        if chat_template is not None and "chat_template" in takes[i]:
            options["chat_template"] = chat_template
        options.update({k: v for k, v in llm_options.items() if k in takes[i]})  # n_ctx, n_gpu_layers, speculative
        session = edgesdk.load(path, profile=profile, **options)
        entries.append(model_entry(name, session, allow_local_images=local))
    return entries
