# SPDX-License-Identifier: Apache-2.0
"""``python -m edgesdk.formats.gguf._children.hf_logits HF_DIR PROMPTS_JSON OUT_NPZ``: the HF model's fp32
logits of each prompt's first 96 token ids (no special tokens), saved to OUT_NPZ as ``logits<i>``,
``ids<i>`` (the ids fed) and ``full<i>`` (the whole tokenization)
(:func:`edgesdk.formats.gguf.convert.hf_reference_logits` runs it). A process of its own: torch's bundled
CUDA libraries and a CUDA build of llama.cpp in one process crashed with "free(): invalid pointer"."""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> int:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir, prompts_file, out = argv[0], argv[1], argv[2]
    with open(prompts_file) as f:
        prompts = json.load(f)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    arrays: dict[str, Any] = {}
    for i, p in enumerate(prompts):
        full = tok(p, add_special_tokens=False)["input_ids"]
        ids = full[:96]
        with torch.no_grad():
            arrays[f"logits{i}"] = model(torch.tensor([ids])).logits[0].double().numpy()
        arrays[f"ids{i}"] = np.asarray(ids)
        arrays[f"full{i}"] = np.asarray(full)
    np.savez(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
