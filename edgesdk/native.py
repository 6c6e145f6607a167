# SPDX-License-Identifier: Apache-2.0
"""The native libraries edgesdk loads into one process, and the one way to import llama.cpp's bindings.

Every ``import llama_cpp`` in edgesdk goes through :func:`import_llama_cpp` (tests/test_native.py checks
this). It reads how the installed llama.cpp libraries were linked before loading them
(:func:`llama_cpp_build`): a build whose C++ libraries do not link the shared C++ runtime
(``libstdc++.so.6``) carries a private copy of parts of it, and then two copies of the C++ runtime meet
in one process. On the H200 machine that is what a CUDA build made with the image's ``CXX=/opt/gcc/bin/g++``
did: ``import onnxruntime`` after it crashed (a NULL call through ``std::call_once``), and so did torch's CUDA
libraries next to it. The same sources built with the system compiler run next to onnxruntime, numpy and
torch in any order (docs/native-libraries.md has the runs). For such a build edgesdk loads ONNX Runtime
first, the one order that was seen to work, and says so in ``edgesdk doctor`` and the load report.

Reads ELF headers only; imports nothing native itself.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import logging
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# The C++ runtimes a C++ shared library links when it uses the system's (GNU and LLVM).
SHARED_CXX_RUNTIMES = ("libstdc++.so.6", "libc++.so.1")
# llama.cpp's C++ libraries (llama-cpp-python's lib/ folder); libggml-base holds ggml's C++ parts.
CXX_LIBRARIES = ("libllama.so", "libggml-base.so")
REBUILD_HINT = (
    "rebuild llama-cpp-python with the system compiler: CC=gcc CXX=g++ CUDAHOSTCXX=g++ "
    'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_NATIVE=OFF" pip install --no-cache-dir --force-reinstall '
    "llama-cpp-python (docs/native-libraries.md)"
)

_DT_NEEDED, _DT_STRTAB, _PT_DYNAMIC, _PT_LOAD = 1, 5, 2, 1


def elf_needed(path: str | Path) -> list[str] | None:
    """The ``DT_NEEDED`` entries of a 64-bit little-endian ELF shared library, or None if unreadable.

    What ``readelf -d`` lists as "Shared library: [...]", read from the program headers (no tools needed).
    """
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELFCLASS64, little-endian
        return None
    try:
        (phoff,) = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                "<IIQQQQ", data, phoff + i * phentsize
            )
            if p_type == _PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == _PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        needed, strtab = [], None
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                needed.append(val)
            elif tag == _DT_STRTAB:
                strtab = val
        if strtab is None:
            return None
        base = next(off + (strtab - vaddr) for vaddr, off, size in loads if vaddr <= strtab < vaddr + size)
        names = []
        for n in needed:
            end = data.index(b"\0", base + n)
            names.append(data[base + n : end].decode("utf-8", "replace"))
        return names
    except (struct.error, StopIteration, ValueError):
        return None


def _libdir() -> Path | None:
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


@functools.cache
def llama_cpp_build() -> dict[str, Any]:
    """How the installed llama.cpp libraries are linked, without loading them.

    ``{"installed", "libdir", "cuda", "cxx_runtime": {lib: linked runtime or None}, "problem": str | None}``;
    ``problem`` names a C++ library that links no shared C++ runtime (a private copy of it).
    """
    libdir = _libdir()
    if libdir is None or not libdir.is_dir():
        return {
            "installed": libdir is not None,
            "libdir": str(libdir) if libdir else None,
            "cuda": False,
            "cxx_runtime": {},
            "problem": None,
        }
    runtimes: dict[str, str | None] = {}
    for name in CXX_LIBRARIES:
        path = libdir / name
        if not path.exists():
            continue
        needed = elf_needed(path)
        if needed is None:
            continue
        runtimes[name] = next((n for n in needed if n in SHARED_CXX_RUNTIMES), None)
    private = [name for name, rt in runtimes.items() if rt is None]
    problem = (
        f"llama.cpp's {', '.join(private)} link no shared C++ runtime ({' or '.join(SHARED_CXX_RUNTIMES)}): "
        "the build carries its own copy, which crashed next to onnxruntime and torch on a CUDA host"
        if private
        else None
    )
    return {
        "installed": True,
        "libdir": str(libdir),
        "cuda": any(p.name.startswith("libggml-cuda") for p in libdir.iterdir()),
        "cxx_runtime": runtimes,
        "problem": problem,
    }


def import_llama_cpp(submodule: str | None = None) -> ModuleType:
    """``import llama_cpp`` (or ``llama_cpp.<submodule>``), after ONNX Runtime when this llama.cpp build
    carries its own C++ runtime.

    For a build linked against the shared C++ runtime (the normal case) this is a plain import and
    nothing else is loaded. Raises what the import raises (ImportError, OSError from the native library).
    """
    name = f"llama_cpp.{submodule}" if submodule else "llama_cpp"
    if name in sys.modules:
        return sys.modules[name]
    if "llama_cpp" not in sys.modules and llama_cpp_build()["problem"] and "onnxruntime" not in sys.modules:
        try:
            importlib.import_module("onnxruntime")  # the order that works for such a build (module docstring)
        except Exception:  # noqa: BLE001, S110 - onnxruntime absent or broken: nothing to protect
            pass
    return importlib.import_module(name)


_log = logging.getLogger("edgesdk.llama_cpp")
_LOG_TO_STDERR = [False]  # the last load or build decides (one process-wide callback)
_LOG_CALLBACK: list[object] = []  # keeps the ctypes callback alive for as long as llama.cpp may call it


def route_llama_logs(verbose: bool) -> None:
    """llama.cpp's own log lines (``llama_kv_cache_iswa: ...``, model loading) reach stderr only when
    ``verbose`` (runtime loads; ``edgesdk build``'s parity checks never); otherwise they go to the
    ``edgesdk.llama_cpp`` logger at DEBUG. Uses the public ``llama_log_set`` callback (llama-cpp-python
    prints level-3 lines even with ``verbose=False``)."""
    llama_cpp = import_llama_cpp()

    _LOG_TO_STDERR[0] = bool(verbose)
    if _LOG_CALLBACK:
        return

    def _on_log_py(level: int, text: bytes | None, user_data: object) -> None:  # noqa: ARG001 - ggml_log_callback
        msg = text.decode("utf-8", "replace") if text else ""
        if _LOG_TO_STDERR[0]:
            sys.stderr.write(msg)
            sys.stderr.flush()
        elif msg.strip():
            _log.debug("%s", msg.rstrip("\n"))

    _on_log = llama_cpp.llama_log_callback(_on_log_py)
    _LOG_CALLBACK.append(_on_log)
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))


__all__ = ["REBUILD_HINT", "elf_needed", "import_llama_cpp", "llama_cpp_build", "route_llama_logs"]
