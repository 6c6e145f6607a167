# SPDX-License-Identifier: Apache-2.0
"""``python -m edgesdk.formats.vlm._children.encoder_export HF_DIR OUT_ONNX OPSET``: LLaVA's vision encoder +
projector (``get_image_features(pixel_values)``, the checkpoint's ``vision_feature_layer`` and
``vision_feature_select_strategy``) exported to OUT_ONNX as one FP32 graph by ``torch.onnx.export`` with the
TorchScript exporter (``dynamo=False``), eager attention and one static ``[1, 3, size, size]`` input, opset
OPSET. The last stdout line is JSON: ``image_size``, ``image_tokens``, ``n_embd``, ``torch`` (its version); a
failure is a traceback on stderr and exit 1 (:func:`edgesdk.formats.vlm.onnx_encoder.export_encoder` runs it
and reports stderr's last line).

A process of its own: torch stays out of the build process, as the PyTorch reference does
(:mod:`edgesdk.formats.vlm._children.hf_reference`)."""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> int:
    import torch
    from transformers import LlavaForConditionalGeneration

    hf_dir, out, opset = argv[0], argv[1], int(argv[2])
    model = LlavaForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cfg: Any = model.config
    size = int(cfg.vision_config.image_size)

    class Encoder(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            f = self.m.get_image_features(
                pixel_values=pixel_values,
                vision_feature_layer=cfg.vision_feature_layer,
                vision_feature_select_strategy=cfg.vision_feature_select_strategy,
            )
            f = getattr(f, "pooler_output", f)  # transformers 5: a ModelOutput holding the projected features
            t: torch.Tensor = f[0] if isinstance(f, (list, tuple)) else f
            return t.reshape(1, -1, t.shape[-1])

    enc = Encoder(model).eval()
    x = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        n = enc(x).shape
        torch.onnx.export(
            enc,
            (x,),
            out,
            input_names=["pixel_values"],
            output_names=["image_features"],
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )
    print(json.dumps({"image_size": size, "image_tokens": int(n[1]), "n_embd": int(n[2]), "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
