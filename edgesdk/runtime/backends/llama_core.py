# SPDX-License-Identifier: Apache-2.0
"""The llama.cpp core the GGUF backend (:mod:`edgesdk.runtime.backends.llamacpp`) and the VLM pipeline
(:mod:`edgesdk.runtime.backends.vlm.pipeline`) share: llama-cpp-python imported for a loader with llama.cpp's log
routed, a decoder GGUF opened as a ``Llama`` with the same parameters, the end-of-generation check and a quiet close.
Each caller keeps its own settings (the GGUF backend's batch sizes and K/V cache types, the VLM's ``use_mmap``) and its
own error handling around these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgesdk.errors import BackendUnavailableError
from edgesdk.native import import_llama_cpp, route_llama_logs

if TYPE_CHECKING:
    from llama_cpp import Llama


def load_llama_cpp(what: str, *, verbose: bool) -> Any:
    """``llama_cpp`` for the loader of ``what`` (``"a GGUF bundle"``, ``"a VLM bundle"``): the ``gguf`` extra required,
    the module imported (:class:`BackendUnavailableError` when it is installed but its native library does not load),
    and llama.cpp's log lines routed (stderr only when ``verbose``; :func:`edgesdk.native.route_llama_logs`)."""
    from edgesdk.extras import require

    require("gguf", "llama_cpp", what)
    try:
        llama_cpp = import_llama_cpp()
    except (ImportError, OSError) as exc:  # installed, but its native library does not load
        raise BackendUnavailableError(f"llama-cpp-python is installed but does not load: {exc}") from exc
    route_llama_logs(verbose)
    return llama_cpp


def open_llama(
    llama_cpp: Any,
    path: str,
    *,
    n_ctx: int,
    n_gpu_layers: int,
    threads: int | None,
    flash_attn: bool,
    **settings: Any,
) -> Llama:
    """``llama_cpp.Llama`` on the GGUF at ``path``: ``threads`` for both generation and batch evaluation (None: the
    library's default), llama-cpp-python's own logging off, ``settings`` passed on (``use_mmap``, ``n_batch``,
    ``type_k``, ...). Raises what ``Llama`` raises."""
    llm: Llama = llama_cpp.Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
        **settings,
    )
    return llm


def eog_check(llama_cpp: Any, vocab: Any) -> Callable[[int], bool]:
    """Whether a token ends generation in ``vocab`` (``llama_model_get_vocab``): llama.cpp's ``llama_vocab_is_eog``."""
    return lambda tok: bool(llama_cpp.llama_vocab_is_eog(vocab, tok))


def close_quietly(llm: Any) -> None:
    """``llm.close()``, ignoring any error (a model half torn down, a failed load's leftovers)."""
    with contextlib.suppress(Exception):
        llm.close()
