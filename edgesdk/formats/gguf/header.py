# SPDX-License-Identifier: Apache-2.0
"""Read a GGUF file's header (metadata + tensor table) without touching tensor data.

Why not gguf-py's GGUFReader: it builds numpy views of every field, which takes ~30 s on a
262k-token vocabulary on a 2-core host; prediction only needs scalars and tensor sizes. Layout per
the GGUF spec (ggml docs/gguf.md): magic, version, tensor count, kv count, kv pairs, tensor infos.
Block sizes of quantized types come from gguf-py's constants.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from edgesdk.errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_elements: int
    n_bytes: int


@dataclass
class GGUFHeader:
    version: int
    fields: dict          # scalars and strings; arrays as ("array", element_type, length)
    tensors: list[TensorInfo]


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelError(f"{self.path}: GGUF header truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if n > len(self.buf) - self.pos:
            raise ModelError(f"{self.path}: GGUF string length {n} runs past the end of the file")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_value(self, vtype: int):
        if vtype == _STRING:
            self.string()
        elif vtype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[vtype])
        else:
            raise ModelError(f"{self.path}: unknown GGUF value type {vtype}")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if etype in _SCALARS:
                self.pos += n * struct.calcsize(_SCALARS[etype])
            else:
                for _ in range(n):
                    self.skip_value(etype)
            return ("array", etype, n)
        raise ModelError(f"{self.path}: unknown GGUF value type {vtype}")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf, path)
            if bytes(buf[:4]) != b"GGUF":
                raise ModelError(f"{path}: not a GGUF file (bad magic)")
            cur.pos = 4
            version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
            if n_tensors > 1_000_000 or n_kv > 1_000_000:
                raise ModelError(f"{path}: implausible GGUF header ({n_tensors} tensors, {n_kv} keys)")
            fields = {}
            for _ in range(n_kv):
                key = cur.string()
                fields[key] = cur.value(cur.take("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.take("<I")
                if n_dims > _MAX_DIMS:
                    raise ModelError(f"{path}: tensor {name} has {n_dims} dimensions")
                shape = tuple(cur.take("<Q") for _ in range(n_dims))
                ggml_type = cur.take("<I")
                cur.take("<Q")   # data offset
                n = 1
                for d in shape:
                    n *= d
                try:
                    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
                except (ValueError, KeyError) as exc:
                    raise ModelError(f"{path}: tensor {name} has unknown ggml type {ggml_type}") from exc
                tensors.append(TensorInfo(name, shape, ggml_type, n, n // block * type_size))
    except OSError as exc:
        raise ModelError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:   # mmap of an empty file
        raise ModelError(f"{path}: not a GGUF file ({exc})") from exc
    return GGUFHeader(version, fields, tensors)
