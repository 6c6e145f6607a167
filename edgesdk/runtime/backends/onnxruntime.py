# SPDX-License-Identifier: Apache-2.0
"""ONNX Runtime backend: EP chain TensorRT EP -> CUDA EP -> CPU EP, only what actually initialises."""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from edgesdk.errors import BackendUnavailableError, ShapeError

_EP_LIBS = {"TensorrtExecutionProvider": ("nvinfer", "TensorRT"),
            "CUDAExecutionProvider": ("cudart", "CUDA runtime"),
            "DmlExecutionProvider": ("directml", "DirectML")}
_NP = {"int64": np.int64, "int32": np.int32, "float32": np.float32, "float16": np.float16, "bool": np.bool_}


def _why_unavailable(ep: str) -> str:
    lib, label = _EP_LIBS.get(ep, (None, ep))
    if lib and ctypes.util.find_library(lib) is None:
        return f"{label} libraries not found on this machine (lib{lib})"
    return "listed by onnxruntime but failed to initialise (a dependency such as cuDNN/cuBLAS or a GPU is missing)"


_PROBED: dict[str, tuple[bool, str]] = {}


def probe_provider(ep: str) -> tuple[bool, str]:
    """Really initialise ``ep`` on a one-node model: listing is not proof (onnxruntime-gpu lists EPs
    whose CUDA/TensorRT libraries are absent). Cached per process."""
    if ep in _PROBED:
        return _PROBED[ep]
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if ep not in ort.get_available_providers():
        _PROBED[ep] = (False, f"not built into this onnxruntime ({ort.__version__})")
        return _PROBED[ep]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    with _captured_fds() as log:
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=[ep, "CPUExecutionProvider"])
            ok = sess.get_providers()[0] == ep
            err = None
        except Exception as exc:  # noqa: BLE001 - any init failure means "not usable here"
            ok, err = False, str(exc).splitlines()[0][:160]
    if ok:
        _PROBED[ep] = (True, "initialised")
    else:
        found = re.search(r"with error: ([^\n]+)", log.text) or re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open",
                                                                           log.text)
        detail = found.group(1).strip() if found else err
        _PROBED[ep] = (False, f"failed to initialise: {detail}" if detail else _why_unavailable(ep))
    del onnx
    return _PROBED[ep]


class _Captured:
    text = ""


@contextlib.contextmanager
def _captured_fds():
    """Capture what native code writes to fds 1/2 (ORT logs EP load failures there, not via Python)."""
    cap = _Captured()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield cap
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            cap.text = tmp.read().decode("utf-8", "replace")


class OnnxRuntimeBackend:
    name = "onnxruntime"
    provider = "onnxruntime"

    def __init__(self, model_path: Path, chain: list[str], record_fallback, *, threads: int | None = None,
                 io_spec: dict | None = None):
        import onnxruntime as ort

        self.model_path = Path(model_path)
        chain = list(dict.fromkeys(chain))
        if "CPUExecutionProvider" not in chain:
            chain.append("CPUExecutionProvider")
        requested = []
        for i, ep in enumerate(chain):
            ok, why = (True, "") if ep == "CPUExecutionProvider" else probe_provider(ep)
            if ok:
                requested.append(ep)
            else:
                nxt = next((e for e in chain[i + 1:] if e == "CPUExecutionProvider" or probe_provider(e)[0]),
                           "CPUExecutionProvider")
                record_fallback(ep, nxt, f"{ep}: {why}")
        so = ort.SessionOptions()
        so.log_severity_level = 3  # EP init failures are reported by us, as fallbacks, not as log spam
        if threads:
            so.intra_op_num_threads = threads
        self._so = so
        try:
            self.session = ort.InferenceSession(str(self.model_path), so, providers=requested)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
            raise BackendUnavailableError(f"onnxruntime cannot load {self.model_path.name}: "
                                          f"{str(exc).splitlines()[0][:200]}") from exc
        active = self.session.get_providers()
        for ep in requested:
            if ep not in active:
                nxt = next((a for a in active if requested.index(a) > requested.index(ep)), active[0])
                record_fallback(ep, nxt, _why_unavailable(ep))
        self.providers_requested = requested
        self.providers_active = active
        self.device = active[0]
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._placement: dict | None = None

    def check_feeds(self, feeds: dict) -> dict:
        """Validate names/rank/dtype against the graph: a ShapeError names the input and the expectation."""
        missing = [n for n in self.inputs if n not in feeds]
        extra = [n for n in feeds if n not in self.inputs]
        if missing or extra:
            raise ShapeError(f"inputs do not match the model: missing {missing or '-'}, unexpected {extra or '-'} "
                             f"(expected {list(self.inputs)})")
        out = {}
        for name, value in feeds.items():
            spec = self.inputs[name]
            arr = np.asarray(value)
            want = _NP.get(spec.type[7:-1] if spec.type.startswith("tensor(") else "", None)
            if len(arr.shape) != len(spec.shape):
                raise ShapeError(f"input {name!r}: expected rank {len(spec.shape)} {spec.shape}, got shape "
                                 f"{list(arr.shape)}")
            for dim, (got, exp) in enumerate(zip(arr.shape, spec.shape)):
                if isinstance(exp, int) and exp > 0 and got != exp:
                    raise ShapeError(f"input {name!r}: dimension {dim} must be {exp}, got {got} "
                                     f"(shape {list(arr.shape)})")
            if want is not None and arr.dtype != want:
                if np.issubdtype(arr.dtype, np.number) and np.can_cast(arr.dtype, want, casting="same_kind"):
                    arr = arr.astype(want)
                else:
                    raise ShapeError(f"input {name!r}: expected dtype {np.dtype(want).name}, got {arr.dtype}")
            out[name] = arr
        return out

    def run(self, feeds: dict) -> dict:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def placement(self, feeds: dict) -> dict:
        """Per-node execution provider from ONNX Runtime's profiler (one profiled run on a twin session)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.enable_profiling = True
        with tempfile.TemporaryDirectory() as tmp:
            so.profile_file_prefix = os.path.join(tmp, "edgesdk")
            sess = ort.InferenceSession(str(self.model_path), so, providers=self.providers_active)
            sess.run(None, feeds)
            events = json.loads(Path(sess.end_profiling()).read_text())
        nodes = {}
        for ev in events:
            args = ev.get("args") or {}
            if ev.get("cat") == "Node" and "provider" in args and ev.get("name", "").endswith("_kernel_time"):
                nodes[ev["name"][: -len("_kernel_time")]] = {"op_type": args.get("op_name"),
                                                              "provider": args["provider"]}
        by_ep = Counter(n["provider"] for n in nodes.values())
        self._placement = {"source": "onnxruntime profiler (one run)", "by_provider": dict(by_ep),
                           "nodes": nodes}
        return self._placement

    def report(self) -> dict:
        return {"backend": self.name, "model": self.model_path.name,
                "providers_requested": self.providers_requested, "providers_active": self.providers_active,
                "placement": self._placement}

    def close(self) -> None:
        self.session = None


def load_onnx(bundle, ctx):
    chain = ctx.options.get("providers") or bundle.manifest.get("runtime", {}).get("backend_chain") or [
        "CPUExecutionProvider"]
    return OnnxRuntimeBackend(bundle.artifact_path("model"), list(chain), ctx.record_fallback,
                              threads=ctx.options.get("threads"))
