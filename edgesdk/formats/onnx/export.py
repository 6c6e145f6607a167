# SPDX-License-Identifier: Apache-2.0
"""Hugging Face -> ONNX export and the PyTorch parity reference, run in a child process.

Why a child: PyTorch, transformers and the loaded weights are only needed to export and to compute
reference outputs. Keeping them out of the build process halves its resident memory for the later
stages (optimization, INT8 calibration, parity runs), and torch's libraries never share a process with
a CUDA llama.cpp. The parent writes the sample feeds; the child writes the ONNX file and the reference
outputs, or a JSON error the parent re-raises as the same EdgeSDKError class.

Usage (internal): python -m edgesdk.formats.onnx.export SPEC.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from edgesdk import errors as E
from edgesdk.types import JSONObject

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def save_feeds(path: Path, feeds: list[dict[str, np.ndarray]]) -> None:
    arrays = {f"{i}/{k}": v for i, feed in enumerate(feeds) for k, v in feed.items()}
    np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub: a **dict might hold allow_pickle


def load_arrays(path: Path) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            i, name = key.split("/", 1)
            out.setdefault(int(i), {})[name] = data[key]
    return [out[i] for i in sorted(out)]


def run_export(spec: JSONObject, work: Path) -> list[list[np.ndarray]]:
    """Run the child; return the reference outputs per feed file, in order. Raises the child's error."""
    spec_path = work / "export_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk.formats.onnx.export", str(spec_path)], capture_output=True, text=True, env=env
    )
    err_path = work / "export_error.json"
    if err_path.is_file():
        err = json.loads(err_path.read_text())
        cls = getattr(E, err.get("class", ""), None)
        if not (isinstance(cls, type) and issubclass(cls, E.EdgeSDKError)):
            cls = E.ExternalToolError
        raise cls(err["message"])
    if proc.returncode != 0:
        tail = " | ".join([ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-2:])[:300]
        raise E.ExternalToolError(f"ONNX export process failed (exit {proc.returncode}): {tail}")
    return [[r["output"] for r in load_arrays(Path(p))] for p in spec["reference_files"]]


# ------------------------------------------------------------------------------------------- the child


def _load(spec: JSONObject) -> PreTrainedModel:
    from edgesdk.extras import EXPORT_MODULES, require

    require("build", EXPORT_MODULES, "exporting a Hugging Face model")
    import torch
    from transformers import AutoModel, AutoModelForImageClassification, AutoModelForSequenceClassification

    cls = {
        "image-classification": AutoModelForImageClassification,
        "text-classification": AutoModelForSequenceClassification,
    }.get(spec["task"], AutoModel)
    try:
        model: PreTrainedModel = cls.from_pretrained(
            spec["source"], trust_remote_code=spec["trust_remote_code"], use_safetensors=not spec["pickle_weights"]
        )
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError for broken dirs
        raise E.ModelError(
            f"{spec['source']}: cannot load the model ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        ) from exc
    torch.set_grad_enabled(False)
    model.eval()  # in place
    return model


def _export(spec: JSONObject, model: PreTrainedModel) -> None:
    from optimum.exporters.onnx import export
    from optimum.exporters.tasks import TasksManager

    task = spec["task"] if spec["task"] in ("image-classification", "text-classification") else "feature-extraction"
    try:
        ctor = TasksManager.get_exporter_config_constructor("onnx", model=model, task=task, library_name="transformers")
    except Exception as exc:  # optimum raises ValueError/KeyError for unsupported architectures
        raise E.ModelError(
            f"{spec['name']}: architecture {spec['family']!r} is not supported by the ONNX exporter "
            f"({str(exc).splitlines()[0][:160]})"
        ) from exc
    export(model, ctor(model.config), Path(spec["out"]), opset=spec["opset"])


def torch_reference(model: torch.nn.Module, feeds: list[dict[str, np.ndarray]], chunk: int = 16) -> list[np.ndarray]:
    """Source-model first output per sample, computed in batches of equally shaped feeds."""
    import torch

    outs: list[np.ndarray] = []
    positional = not hasattr(model, "config")
    with torch.inference_mode():
        for i in range(0, len(feeds), chunk):
            part = feeds[i : i + chunk]
            batch = stack(part)
            for group in [batch] if batch is not None else part:
                kwargs = {k: torch.from_numpy(v) for k, v in group.items()}
                res = first_output(model(*kwargs.values()) if positional else model(**kwargs))
                arr = res.float().numpy()
                outs.extend(arr[j : j + 1] for j in range(arr.shape[0]))
    return outs


def stack(feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """Batch per-sample feeds when their shapes agree (same padded length), else None."""
    keys = feeds[0].keys()
    if any(f.keys() != keys or any(f[k].shape != feeds[0][k].shape for k in keys) for f in feeds):
        return None
    return {k: np.concatenate([f[k] for f in feeds], axis=0) for k in keys}


def first_output(res: object) -> torch.Tensor:
    """A model call's first output: a tuple's first item, a ModelOutput's last_hidden_state or logits."""
    out: object = res
    if isinstance(res, (tuple, list)):
        out = res[0]
    elif hasattr(res, "last_hidden_state"):
        out = res.last_hidden_state
    elif hasattr(res, "logits"):
        out = res.logits
    return cast("torch.Tensor", out)


def _child(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    work = spec_path.parent
    try:
        model = _load(spec)
        _export(spec, model)
        import onnx

        names = {i.name for i in onnx.load(spec["out"], load_external_data=False).graph.input}
        for feeds_file, ref_file in zip(spec["feed_files"], spec["reference_files"]):
            feeds = [{k: v for k, v in f.items() if k in names} for f in load_arrays(Path(feeds_file))]
            refs = torch_reference(model, feeds)
            save_feeds(Path(ref_file), [{"output": r} for r in refs])
    except E.EdgeSDKError as exc:
        (work / "export_error.json").write_text(json.dumps({"class": type(exc).__name__, "message": exc.one_line()}))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        msg = f"ONNX export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        (work / "export_error.json").write_text(json.dumps({"class": "ModelError", "message": msg}))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1])))
