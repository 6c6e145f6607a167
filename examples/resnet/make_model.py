# SPDX-License-Identifier: Apache-2.0
"""A ResNet-18-shaped image classifier as a Hugging Face directory, with RANDOM weights.

No registry package ships vision weights that install offline, so this example builds the real
architecture (transformers ResNetConfig, basic blocks, depths 2-2-2-2, 1000 classes) with random
numbers: the export, optimization, precision and parity paths are the real ones; the predictions
are meaningless. Usage: python examples/resnet/make_model.py OUT_DIR [--tiny]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CARD = """---
license: apache-2.0
tags: [image-classification, random-weights, edgesdk-example]
---
# ResNet-18-shaped classifier (random weights)

Built by edgesdk's examples/resnet/make_model.py from a transformers ResNetConfig with seed 0.
Not trained: use it to exercise export, precision and parity, not for predictions.
"""


def make(out: Path, tiny: bool = False) -> Path:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    if tiny:
        cfg = ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", num_labels=10
        )
    else:
        cfg = ResNetConfig(
            embedding_size=64,
            hidden_sizes=[64, 128, 256, 512],
            depths=[2, 2, 2, 2],
            layer_type="basic",
            num_labels=1000,
        )
    model = ResNetForImageClassification(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "ConvNextImageProcessor",
                "do_resize": True,
                "size": {"shortest_edge": 224},
                "do_normalize": True,
                "image_mean": [0.485, 0.456, 0.406],
                "image_std": [0.229, 0.224, 0.225],
            },
            indent=2,
        )
    )
    (out / "README.md").write_text(CARD)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "out/resnet18-random")
    print(make(target, tiny="--tiny" in sys.argv))
