# SPDX-License-Identifier: Apache-2.0
"""The eager CUDA fallback a GPU bundle carries: the model's weights as safetensors + its config.json.

Why not a ``torch.export`` program: it carries the same weights *plus* a graph traced at one shape and
tied to the torch version that saved it (``.pt2`` archives are not promised to load across releases);
safetensors + config rebuild the Hugging Face module with whatever ``transformers``/``torch`` the device
has, with dynamic batch and sequence for free and no pickle. The price is the weights a second time
(MiniLM FP16: +45 MB next to a 45 MB ONNX graph), paid only for GPU profiles.

Build side: :func:`write_eager_weights` (called by the ONNX build when the plan has an
``eager_fallback`` decision). Run side: :func:`load_eager_module` (called by the runtime's eager
CUDA fallback, :mod:`edgesdk.runtime.backends.torch_eager`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

EAGER_DIR = "eager"
WEIGHTS = f"{EAGER_DIR}/model.safetensors"
CONFIG = f"{EAGER_DIR}/config.json"
ROLE_WEIGHTS = "eager-weights"
ROLE_CONFIG = "eager-config"

# transformers Auto class per bundle task: the same heads optimum exports for that task.
AUTO_CLASS = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
}
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def eager_dtype(precision: str) -> str:
    """Weights dtype of the eager copy: the bundle's half precision on a GPU, else FP32."""
    return DTYPES.get(precision, "float32")


def write_eager_weights(ctx: Any, src_dir: Path, precision: str) -> dict[str, Any]:
    """Copy the source's safetensors (cast to the bundle's precision) and config.json into ``eager/``.

    Returns what the manifest's ``extras.eager_fallback`` records (included or not, and why)."""
    files = sorted(src_dir.glob("model*.safetensors"))
    if not files or not (src_dir / "config.json").is_file():
        return {
            "included": False,
            "reason": f"{src_dir.name} has no *.safetensors + config.json (pickled "
            "weights are never copied into a bundle)",
        }
    task = ctx.facts.task
    if task not in AUTO_CLASS:
        return {"included": False, "reason": f"task {task!r} has no eager loader (supported: {', '.join(AUTO_CLASS)})"}
    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, eager_dtype(precision))
    tensors: dict[str, Any] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            tensors[name] = t.to(dtype) if t.is_floating_point() else t
    out = ctx.staging / EAGER_DIR
    out.mkdir(exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(ctx.staging / WEIGHTS),
        # one key: safetensors writes its metadata map in hash order, so two keys came out in either order and
        # the bundle's hash changed from build to build (seen on two MiniLM orin builds, 2026-12-04)
        metadata={"format": "pt"},
    )
    shutil.copyfile(src_dir / "config.json", ctx.staging / CONFIG)
    ctx.add_artifact(WEIGHTS, ROLE_WEIGHTS)
    ctx.add_artifact(CONFIG, ROLE_CONFIG)
    size = (ctx.staging / WEIGHTS).stat().st_size
    return {
        "included": True,
        "format": "safetensors+config",
        "weights": WEIGHTS,
        "dtype": eager_dtype(precision),
        "auto_class": AUTO_CLASS[task],
        "bytes": size,
        "tensors": len(tensors),
    }


def load_eager_module(bundle_dir: Path, task: str | None, device: str) -> Any:
    """The bundle's eager weights as a ``transformers`` module on ``device`` (eval mode, no grad).

    Offline: reads only the bundle's ``eager/`` files (verified with the rest of the bundle when it was
    opened). Raises ImportError without transformers/torch, ValueError/OSError on foreign files."""
    import torch
    import transformers

    cls_name = AUTO_CLASS.get(task or "")
    if cls_name is None:
        raise ValueError(f"task {task!r} has no eager loader")
    folder = Path(bundle_dir) / EAGER_DIR
    with open(folder / "model.safetensors", "rb") as fh:  # dtype from the file's own header
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    dtypes = {v.get("dtype") for k, v in header.items() if k != "__metadata__"}
    dtype = torch.float16 if "F16" in dtypes else torch.bfloat16 if "BF16" in dtypes else torch.float32
    auto = getattr(transformers, cls_name)
    model = auto.from_pretrained(str(folder), dtype=dtype, local_files_only=True, use_safetensors=True)
    return model.to(device).eval()
