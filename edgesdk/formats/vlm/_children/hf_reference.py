# SPDX-License-Identifier: Apache-2.0
"""``python -m edgesdk.formats.vlm._children.hf_reference HF_DIR SPEC_JSON OUT_NPZ``: the PyTorch reference of
the VLM parity (:func:`edgesdk.formats.vlm.build.hf_vlm_reference` runs it). SPEC_JSON holds ``images`` (paths),
``prompt`` (the family's reference prompt with one image), ``n`` (greedy tokens) and ``architecture`` (the
transformers class; LLaVA when missing). Per image ``i`` OUT_NPZ gets ``features<i>`` (``get_image_features``,
float64 ``[tokens, n_embd]``), ``tokens<i>`` (the greedy tokens of ``generate``, cut at the first end token),
``scores<i>`` (the scores of each generated step, float32 ``[steps, vocab]``) and ``input_ids<i>`` (the
processor's prompt); on transformers 4.55-4.57 with an Idefics3/SmolVLM tower also ``positions_fixed``,
``features_unfixed<i>`` and ``tokens_unfixed<i>`` (below). A failure is a traceback on stderr and exit 1
(the parent reports stderr's last line).

A process of its own, as in the GGUF path (:mod:`edgesdk.formats.gguf._children.hf_logits`): torch stays out
of the build process, which runs llama.cpp (torch's bundled CUDA libraries and a CUDA build of llama.cpp in one
process crashed with "free(): invalid pointer")."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from typing import Any


def processor(hf_dir: str) -> Callable[..., Any]:
    """The checkpoint's processor: ``proc(images=..., text=..., return_tensors=...)``."""
    from transformers import AutoProcessor

    try:
        proc: Callable[..., Any] = AutoProcessor.from_pretrained(hf_dir)
    except ImportError:
        # transformers 4.57's Qwen2.5-VL processor also loads a video processor, which needs torchvision (not a
        # dependency here); for still images the processor is the image processor + the tokenizer with each image
        # token repeated once per merged patch (Qwen2_5_VLProcessor.__call__), which this does
        from transformers import AutoImageProcessor, AutoTokenizer

        image_proc, tok = AutoImageProcessor.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
        if not hasattr(image_proc, "merge_size"):
            raise
        pad = "<|image_pad|>"

        def qwen_proc(images: Any, text: str, return_tensors: str) -> dict[str, Any]:
            out = image_proc(images=[images], return_tensors=return_tensors)
            n = int(out["image_grid_thw"][0].prod()) // image_proc.merge_size**2
            return {**tok(text.replace(pad, pad * n), return_tensors=return_tensors), **out}

        proc = qwen_proc
    return proc


def main(argv: list[str]) -> int:
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    hf_dir, spec_file, out = argv[0], argv[1], argv[2]
    with open(spec_file) as f:
        spec = json.load(f)
    proc = processor(hf_dir)
    arch = spec.get("architecture") or "LlavaForConditionalGeneration"
    model = getattr(transformers, arch).from_pretrained(hf_dir, dtype=torch.float32).eval()
    cfg = model.config
    arrays: dict[str, Any] = {}
    fixed: Callable[..., Any] | None = None
    if getattr(model.model, "vision_model", None) is not None:  # Idefics3 / SmolVLM's tower
        # transformers 4.55-4.57 bucketize h/n * (1 - 1e-6) against the boundaries k/n, which maps patch rows and
        # columns 1..n-1 to positions 0..n-2 (transformers issue #41190, fixed by PR #41374); the models were
        # trained, and llama.cpp computes, with positions 0..n-1. Measure it and, if present, also run PyTorch
        # with the trained positions (the reference for parity), keeping the unmodified figures in the report.
        emb = model.model.vision_model.embeddings
        side = cfg.vision_config.image_size // cfg.vision_config.patch_size
        probe = torch.zeros(1, 3, cfg.vision_config.image_size, cfg.vision_config.image_size)
        with torch.no_grad():
            got = emb(pixel_values=probe, patch_attention_mask=torch.ones(1, side, side, dtype=torch.bool))
            want = emb.patch_embedding(probe).flatten(2).transpose(1, 2) + emb.position_embedding.weight[None]
        if not torch.allclose(got, want):

            def trained_positions(pixel_values: torch.Tensor, patch_attention_mask: Any = None) -> Any:
                e = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
                return e + emb.position_embedding.weight[None, : e.shape[1]]

            fixed = trained_positions
            arrays["positions_fixed"] = np.asarray(1)
    # get_image_features gets what its signature names of the processor's outputs (pixel_values; Idefics3's
    # pixel_attention_mask) and of the config (LLaVA's vision_feature_layer / vision_feature_select_strategy)
    feature_args = inspect.signature(model.get_image_features).parameters

    def image_features(inputs: Any) -> Any:
        kw = {k: inputs[k] for k in feature_args if k in inputs}
        kw.update(
            {
                k: getattr(cfg, k)
                for k in ("vision_feature_layer", "vision_feature_select_strategy")
                if k in feature_args
            }
        )
        f = model.get_image_features(**kw)
        # transformers 5 returns a ModelOutput whose pooler_output holds the projected features (4.x: the tensor)
        f = getattr(f, "pooler_output", f)
        return f[0] if isinstance(f, (list, tuple)) else f

    def until_eos(toks: list[int]) -> Any:
        """The greedy tokens up to the first end token (where ``generate`` stops), as int64."""
        eos_id = model.generation_config.eos_token_id or cfg.text_config.eos_token_id
        eos = set(eos_id if isinstance(eos_id, list) else [eos_id])
        return np.asarray(toks[: next((j for j, t in enumerate(toks) if t in eos), len(toks))], dtype=np.int64)

    for i, path in enumerate(spec["images"]):
        img = Image.open(path).convert("RGB")
        inputs = proc(images=img, text=spec["prompt"], return_tensors="pt")
        if "token_type_ids" not in inspect.signature(model.forward).parameters:  # Gemma-3 marks its image tokens
            inputs.pop("token_type_ids", None)
        with torch.no_grad():
            if fixed is not None:  # the unmodified transformers figures, for the report
                f = image_features(inputs)
                arrays[f"features_unfixed{i}"] = f.reshape(-1, f.shape[-1]).double().numpy()
                g = model.generate(**inputs, max_new_tokens=spec["n"], do_sample=False)
                arrays[f"tokens_unfixed{i}"] = until_eos(g[0, inputs["input_ids"].shape[1] :].tolist())
                emb.forward = fixed
            f = image_features(inputs)
            arrays[f"features{i}"] = f.reshape(-1, f.shape[-1]).double().numpy()
            out_g = model.generate(
                **inputs, max_new_tokens=spec["n"], do_sample=False, output_scores=True, return_dict_in_generate=True
            )
            g = out_g.sequences
            # the scores that chose each greedy token (float32 [steps, vocab]): greedy.greedy_agreement reads them
            arrays[f"scores{i}"] = torch.stack([s[0] for s in out_g.scores]).float().numpy()
        arrays[f"tokens{i}"] = until_eos(g[0, inputs["input_ids"].shape[1] :].tolist())
        arrays[f"input_ids{i}"] = inputs["input_ids"][0].numpy()
        if fixed is not None:
            del emb.forward  # back to the class's forward for the next image's unmodified run
    np.savez(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
