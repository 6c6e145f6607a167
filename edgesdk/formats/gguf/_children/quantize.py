# SPDX-License-Identifier: Apache-2.0
"""``python -m edgesdk.formats.gguf._children.quantize SRC DST FTYPE NTHREAD REQUANT``: llama.cpp's
``llama_model_quantize(SRC -> DST)`` with file type FTYPE (an int), NTHREAD threads and, when REQUANT is
``1``, requantizing allowed. Exit 0 on success, 3 when llama.cpp reports a failure
(:func:`edgesdk.formats.gguf.convert.quantize` runs it)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from edgesdk.native import import_llama_cpp

    llama_cpp = import_llama_cpp()
    src, dst, ftype, nthread, requant = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4] == "1"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.allow_requantize = requant
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    return 0 if rc == 0 else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
