# SPDX-License-Identifier: Apache-2.0
"""A random-weight llama target and draft models made from it, for speculative decoding with a draft model
(issue 37 item 2) where no real large/small pair of one tokenizer can be installed.

The target: a llama built from a transformers ``LlamaConfig`` with random weights (``torch.manual_seed``) and a
byte-level BPE tokenizer trained on edgesdk's built-in text (as tests/test_gguf_build.py makes its tiny models),
converted to an F16 GGUF by edgesdk's converter. Drafts, all with the target's tokenizer:

- ``first<N>``: the target's first N layers (its embeddings, those layers, its final norm and LM head);
- ``q4_0`` / ``q2_k``: the target file itself quantized by llama.cpp.

    python tools/bench/draft_pair.py OUT_DIR --layers 12 --hidden 768 --draft-layers 1

writes OUT_DIR/target-f16.gguf, OUT_DIR/draft-first1-f16.gguf, OUT_DIR/draft-q4_0.gguf, OUT_DIR/draft-q2_k.gguf and
prints their sizes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_llama(
    directory: Path,
    *,
    layers: int,
    hidden: int,
    ffn: int | None = None,
    heads: int = 8,
    kv_heads: int = 4,
    vocab: int = 512,
    seed: int = 0,
    license_id: str = "apache-2.0",
    init_range: float = 0.02,
    deep_scale: float = 1.0,
    deep_from: int = 1,
) -> Path:
    """A HF llama directory with random weights, a BPE tokenizer trained on edgesdk's built-in text and a card
    declaring ``license_id``. ``deep_scale``: the output projections (attention ``o_proj``, MLP ``down_proj``) of the
    layers from ``deep_from`` on are scaled by it, so those layers refine the residual stream instead of overwriting
    it, as a trained network's later layers do; at 1.0 (transformers' random init) every layer rewrites the stream and
    a model cut to its first layers, or quantized, agrees with the whole on few tokens."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from edgesdk.resources import data_file

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        data_file("ppl_text.txt").read_text().split("\n"),
        trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<|bos|>", "<|end|>", "<|user|>", "<|assistant|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(tok.get_vocab()),
        hidden_size=hidden,
        intermediate_size=ffn or hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        initializer_range=init_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            if i >= deep_from:
                layer.self_attn.o_proj.weight.mul_(deep_scale)
                layer.mlp.down_proj.weight.mul_(deep_scale)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(f"---\nlicense: {license_id}\n---\nRandom weights for benchmarks and tests.\n")
    return directory


def first_layers(src: Path, dst: Path, n: int) -> Path:
    """The HF llama at ``src`` cut to its first ``n`` layers (same embeddings, final norm, LM head, tokenizer)."""
    from safetensors.numpy import load_file, save_file

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((src / "config.json").read_text())
    if not 1 <= n <= int(config["num_hidden_layers"]):
        raise ValueError(f"{n} layers of {config['num_hidden_layers']}")
    config["num_hidden_layers"] = n
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, arr in load_file(str(f)).items():
            parts = name.split(".")
            if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= n:
                continue
            tensors[name] = arr
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def make_pair(
    out: Path, *, layers: int, hidden: int, draft_layers: int, quants: tuple[str, ...] = ("Q4_0", "Q2_K"), **kw: object
) -> dict[str, Path]:
    """The target GGUF and its drafts in ``out`` (see the module docstring): name -> path."""
    from edgesdk.formats.gguf.convert import convert_hf_to_gguf, quantize

    out.mkdir(parents=True, exist_ok=True)
    hf = make_llama(out / "hf-target", layers=layers, hidden=hidden, deep_from=draft_layers, **kw)  # type: ignore[arg-type]
    files = {"target": out / "target-f16.gguf"}
    convert_hf_to_gguf(hf, files["target"], name="random-llama")
    cut = first_layers(hf, out / f"hf-first{draft_layers}", draft_layers)
    files[f"first{draft_layers}"] = out / f"draft-first{draft_layers}-f16.gguf"
    convert_hf_to_gguf(cut, files[f"first{draft_layers}"], name=f"random-llama-first{draft_layers}")
    for q in quants:
        files[q.lower()] = out / f"draft-{q.lower()}.gguf"
        quantize(files["target"], files[q.lower()], q)
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--init-range", type=float, default=0.02)
    ap.add_argument("--deep-scale", type=float, default=1.0, help="output projections' scale past the draft's layers")
    a = ap.parse_args()
    files = make_pair(
        a.out,
        layers=a.layers,
        hidden=a.hidden,
        draft_layers=a.draft_layers,
        vocab=a.vocab,
        init_range=a.init_range,
        deep_scale=a.deep_scale,
    )
    for name, path in files.items():
        print(f"{name:10s} {path}  {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
