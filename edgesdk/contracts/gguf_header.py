# SPDX-License-Identifier: Apache-2.0
"""The one GGUF header reader: key/values and the tensor table, never tensor data.

Used by the planner (model facts), the profiler (roofline work) and the license scan, so it
depends on nothing but the standard library: no gguf-py, no llama-cpp-python (a bare install
reads GGUF headers too).

Why not gguf-py's ``GGUFReader``: it materialises every array element (21 s for Gemma-3's
262k-token vocabulary on a 2-core host); arrays are skipped here and reported by length.
Layout per the GGUF specification (ggml ``docs/gguf.md``): magic, version, tensor count, key/value
count, key/value pairs, tensor infos, then the aligned data section.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from edgesdk.errors import ModelError

# GGUF value type -> struct format (GGUF spec; 8 is a string, 9 an array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8
_MAX_COUNT = 1_000_000  # tensors or keys: beyond this the header is corrupt, not a model
# Arrays of arrays: llama.cpp's own reader refuses nesting outright; real files (tokenizer merges, vocab)
# use one level. Deeper is a corrupt or hostile file, refused before Python's recursion limit is reached.
_MAX_ARRAY_DEPTH = 8

# ggml type id -> (elements per block, bytes per block), as ggml's type traits (ggml/src/ggml.c) and
# gguf-py's GGML_QUANT_SIZES give them (checked against gguf-py 0.19.0 by tests); QK_K = 256 for the k-quants.
GGML_BLOCK_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 40),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
    40: (64, 36),
    41: (128, 18),
}


class GGUFArray(NamedTuple):
    """An array value, by element type and length (its elements are skipped, not read)."""

    element_type: int
    length: int


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section
    n_elements: int
    n_bytes: int


@dataclass
class GGUFHeader:
    version: int
    fields: dict[str, Any]  # scalars and strings; arrays as GGUFArray (string_arrays' keys: tuples of str)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0  # byte offset of the (aligned) tensor data section

    def scalar(self, key: str) -> Any:
        """A scalar or string field, None when absent or an array."""
        value = self.fields.get(key)
        return None if isinstance(value, GGUFArray) else value

    def array_length(self, key: str) -> int | None:
        value = self.fields.get(key)
        return value.length if isinstance(value, GGUFArray) else None


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def _bad(self, what: str) -> ModelError:
        return ModelError(f"{self.path}: not a valid GGUF file ({what})")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > self.size:
            raise self._bad(f"header truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if n > self.size - self.pos:
            raise self._bad("string runs past the end of the file")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def skip(self, vtype: int, depth: int = 0) -> None:
        if vtype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[vtype])
        elif vtype == _STRING:
            n = self.take("<Q")  # (not `self.pos += self.take(...)`: take() moves pos first)
            self.pos += n
        elif vtype == _ARRAY:
            self.value(vtype, depth)
        else:
            raise self._bad(f"unknown value type {vtype}")
        if self.pos > self.size:
            raise self._bad("value runs past the end of the file")

    def value(self, vtype: int, depth: int = 0) -> Any:
        """One value of type ``vtype``; ``depth`` is how many arrays it sits in (bounded: no recursion error)."""
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise self._bad(f"arrays nested more than {_MAX_ARRAY_DEPTH} deep at byte {self.pos}")
            etype, n = self.take("<I"), self.take("<Q")
            if etype in _SCALARS:
                self.pos = self.pos + n * struct.calcsize(_SCALARS[etype])
            else:
                for _ in range(n):
                    self.skip(etype, depth + 1)
                    if self.pos > self.size:
                        raise self._bad("array runs past the end of the file")
            if self.pos > self.size:
                raise self._bad("array runs past the end of the file")
            return GGUFArray(etype, n)
        raise self._bad(f"unknown value type {vtype}")

    def strings(self, vtype: int) -> Any:
        """A value of type ``vtype``, an array of at most :data:`_MAX_LISTED_STRINGS` strings as a tuple of them
        (``general.tags``); anything else as :meth:`value` reads it."""
        if vtype == _ARRAY:
            start = self.pos
            etype, n = self.take("<I"), self.take("<Q")
            if etype == _STRING and n <= _MAX_LISTED_STRINGS:
                return tuple(self.string() for _ in range(n))
            self.pos = start
        return self.value(vtype)


_MAX_LISTED_STRINGS = 256  # a string array read element by element (tags); a longer one is skipped as usual


def read_gguf_header(
    path: str | Path, *, keys: tuple[str, ...] | None = None, string_arrays: tuple[str, ...] = ()
) -> GGUFHeader:
    """Read the header of the GGUF file at ``path``.

    With ``keys``, stop as soon as those keys were read and skip the tensor table (the license
    scan reads a few keys of files it does not otherwise need). ``string_arrays``: keys whose array of
    strings (at most 256) is read as a tuple of str instead of a :class:`GGUFArray`. Any malformed, truncated
    or unreadable file is a one-line :class:`~edgesdk.errors.ModelError`.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read(_Cursor(buf, path), keys, frozenset(string_arrays))
    except OSError as exc:
        raise ModelError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # mmap of an empty file
        raise ModelError(f"{path}: not a valid GGUF file ({exc})") from exc


def _read(cur: _Cursor, keys: tuple[str, ...] | None, string_arrays: frozenset[str] = frozenset()) -> GGUFHeader:
    if cur.size < 24 or bytes(cur.buf[:4]) != b"GGUF":
        raise cur._bad("bad magic")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
    if version not in (2, 3) or n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise cur._bad(f"implausible header: version {version}, {n_tensors} tensors, {n_kv} keys")
    fields: dict[str, Any] = {}
    wanted = set(keys) if keys is not None else None
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.strings(cur.take("<I")) if key in string_arrays else cur.value(cur.take("<I"))
        if wanted is not None and wanted <= fields.keys():
            return GGUFHeader(version, fields)
    if wanted is not None:
        return GGUFHeader(version, fields)
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        if n_dims > _MAX_DIMS:
            raise cur._bad(f"tensor {name} has {n_dims} dimensions")
        shape = tuple(cur.take("<Q") for _ in range(n_dims))
        ggml_type, offset = cur.take("<I"), cur.take("<Q")
        n = 1
        for d in shape:
            n *= d
        block = GGML_BLOCK_SIZES.get(ggml_type)
        if block is None:
            raise ModelError(f"{cur.path}: tensor {name} has unknown ggml type {ggml_type}")
        tensors.append(TensorInfo(name, shape, ggml_type, offset, n, n // block[0] * block[1]))
    align = fields.get("general.alignment", 32)
    align = align if isinstance(align, int) and align > 0 else 32
    return GGUFHeader(version, fields, tensors, (cur.pos + align - 1) // align * align)
