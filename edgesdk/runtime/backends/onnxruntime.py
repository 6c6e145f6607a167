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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, EdgeSDKError, ShapeError
from edgesdk.host import thread_cap
from edgesdk.runtime.backend import LoadContext, TensorSpec
from edgesdk.runtime.options import OnnxLoadOptions

if TYPE_CHECKING:
    from edgesdk.bundle import Bundle
    from edgesdk.runtime.backends.ort_buckets import CudaGraphBuckets

_EP_LIBS = {
    "TensorrtExecutionProvider": ("nvinfer", "TensorRT"),
    "CUDAExecutionProvider": ("cudart", "CUDA runtime"),
    "DmlExecutionProvider": ("directml", "DirectML"),
}


def _why_unavailable(ep: str) -> str:
    lib, label = _EP_LIBS.get(ep, (None, ep))
    if lib and ctypes.util.find_library(lib) is None:
        return f"{label} libraries not found on this machine (lib{lib})"
    return "listed by onnxruntime but failed to initialise (a dependency such as cuDNN/cuBLAS or a GPU is missing)"


_PROBED: dict[str, tuple[bool, str]] = {}
# y = Relu(x), x and y float[1], opset 17, IR 8: onnx.helper.make_model(...).SerializeToString(), kept as
# bytes so probing needs only onnxruntime (the `onnx` package is a build-side extra).
_PROBE_MODEL = (
    b'\x08\x08:7\n\x0c\n\x01x\x12\x01y"\x04Relu\x12\x05probeZ\x0f\n\x01x\x12\n\n\x08\x08\x01\x12\x04'
    b"\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\x11"
)


def probe_provider(ep: str) -> tuple[bool, str]:
    """Really initialise ``ep`` on a one-node model: listing is not proof (onnxruntime-gpu lists EPs
    whose CUDA/TensorRT libraries are absent). Cached per process."""
    if ep in _PROBED:
        return _PROBED[ep]
    import onnxruntime as ort

    if ep not in ort.get_available_providers():
        _PROBED[ep] = (False, f"not built into this onnxruntime ({ort.__version__})")
        return _PROBED[ep]
    so = ort.SessionOptions()
    so.log_severity_level = 4
    with _captured_fds() as log:
        try:
            sess = ort.InferenceSession(_PROBE_MODEL, so, providers=[ep, "CPUExecutionProvider"])
            ok = sess.get_providers()[0] == ep
            err = None
        except Exception as exc:  # noqa: BLE001 - any init failure means "not usable here"
            ok, err = False, str(exc).splitlines()[0][:160]
    if ok:
        _PROBED[ep] = (True, "initialised")
    else:
        found = re.search(r"with error: ([^\n]+)", log.text) or re.search(
            r"(lib[\w.+-]+\.so[\w.]*): cannot open", log.text
        )
        detail = found.group(1).strip() if found else err
        _PROBED[ep] = (False, f"failed to initialise: {detail}" if detail else _why_unavailable(ep))
    return _PROBED[ep]


class _Captured:
    text = ""


@contextlib.contextmanager
def _captured_fds() -> Iterator[_Captured]:
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
    """An ONNX Runtime session on the first execution provider of ``chain`` that really initialises."""

    name = "onnxruntime"
    provider = "onnxruntime"

    def __init__(
        self,
        model_path: Path,
        chain: list[str],
        record_fallback: Callable[[str, str, str], None],
        *,
        threads: int | None = None,
        io_spec: dict[str, Any] | None = None,
    ):
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
                nxt = next(
                    (e for e in chain[i + 1 :] if e == "CPUExecutionProvider" or probe_provider(e)[0]),
                    "CPUExecutionProvider",
                )
                record_fallback(ep, nxt, f"{ep}: {why}")
        so = ort.SessionOptions()
        so.log_severity_level = 3  # EP init failures are reported by us, as fallbacks, not as log spam
        threads = threads or thread_cap()  # OMP_NUM_THREADS caps ONNX Runtime as it caps llama.cpp (host.py)
        if threads:
            so.intra_op_num_threads = threads
        self._so = so
        try:
            self.session = ort.InferenceSession(str(self.model_path), so, providers=requested)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/NotImplemented types
            raise BackendUnavailableError(
                f"onnxruntime cannot load {self.model_path.name}: {str(exc).splitlines()[0][:200]}"
            ) from exc
        active = self.session.get_providers()
        for ep in requested:
            if ep not in active:
                nxt = next((a for a in active if requested.index(a) > requested.index(ep)), active[0])
                record_fallback(ep, nxt, _why_unavailable(ep))
        self.providers_requested = requested
        self.providers_active = active
        self.device = active[0]
        # ONNX Runtime says "tensor(float)"; TensorSpec normalises that to "float32".
        self.inputs = tuple(TensorSpec(i.name, i.type, i.shape) for i in self.session.get_inputs())
        self.outputs = tuple(TensorSpec(o.name, o.type, o.shape) for o in self.session.get_outputs())
        self.output_names = [o.name for o in self.outputs]
        self._placement: dict[str, Any] | None = None
        self._graphs: CudaGraphBuckets | None = None
        self._graph_report: dict[str, Any] = {"enabled": False, "reason": "not requested"}
        self.eager_fallback: dict[str, Any] | None = None  # set by torch_eager.choose_eager_fallback
        # Table sizes of a text model (config.json): token ids and sequence lengths are checked against them
        # before a run, so a bad id is a sentence naming it, not an onnxruntime kernel error (load_onnx sets them).
        self.vocab_size: int | None = None
        self.max_positions: int | None = None
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4  # a failed run raises (below); no ORT error line on stderr

    def enable_cuda_graphs(
        self,
        reason: str,
        *,
        seq_buckets: tuple[int, ...] | None = None,
        batch_buckets: tuple[int, ...] | None = None,
        max_seq: int | None = None,
        source: str = "runtime defaults",
    ) -> bool:
        """IO binding + one captured CUDA graph per static shape bucket (requests padded to the bucket and
        masked; see ort_buckets.py). Only on the CUDA EP; the outcome and its reason land in report()."""
        from edgesdk.runtime.backends import ort_buckets as ob

        if self.device != "CUDAExecutionProvider":
            self._graph_report = {
                "enabled": False,
                "reason": f"{reason}; not applied: the session runs on {self.device}, CUDA graphs need the CUDA EP",
            }
            return False
        plan = ob.plan_buckets(
            self.inputs,
            seq_buckets=seq_buckets or ob.DEFAULT_SEQ_BUCKETS,
            batch_buckets=batch_buckets or ob.DEFAULT_BATCH_BUCKETS,
            max_seq=max_seq,
            reason=reason,
            source=source,
        )
        try:
            self._graphs = ob.CudaGraphBuckets(
                str(self.model_path),
                plan,
                self.output_names,
                probe=lambda f: dict(zip(self.output_names, self.session.run(self.output_names, f))),
                session_options=self._so,
            )
        except Exception as exc:  # noqa: BLE001 - graphs are an optimisation: keep the plain session
            self._graph_report = {
                "enabled": False,
                "reason": f"{reason}; capture session failed: {str(exc).splitlines()[0][:160]}",
            }
            return False
        self._graph_report = {"enabled": True, **plan.as_dict()}
        return True

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check_values(feeds)
        try:
            return self._run(feeds)
        except Exception as exc:  # onnxruntime raises its own pybind types; told apart by their status text
            found = _ORT_ERROR.match(str(exc))
            if found is None:
                raise
            status, detail = found.group(1), " ".join(found.group(2).split())
            detail = re.sub(r"^Non-zero status code returned while running ", "", detail)[:300]
            if status == "INVALID_ARGUMENT":
                raise ShapeError(f"{self.model_path.name}: the inputs are not valid for this model: {detail}") from None
            raise OnnxRuntimeRunError(
                f"onnxruntime failed running {self.model_path.name}: {status}: {detail}"
            ) from None

    def _check_values(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Refuse, as one :class:`ShapeError`, what onnxruntime would fail on deep inside a kernel (or, for a
        negative token id, silently index from the end of the table): an empty input and ids out of range."""
        for name, value in feeds.items():
            shape = tuple(np.shape(value))
            ids = name.endswith("ids") and np.issubdtype(np.asarray(value).dtype, np.integer)
            # batch 0 anywhere, or no tokens in an id/mask input (an empty past KV cache stays allowed)
            if (shape and shape[0] == 0) or ((ids or name == "attention_mask") and 0 in shape):
                raise ShapeError(
                    f"input {name!r} is empty (shape {shape}): give at least one row and one element per row"
                )
            if not ids:
                continue
            low, high = int(np.min(value)), int(np.max(value))
            table = self.vocab_size if name == "input_ids" else None
            if low < 0 or (table is not None and high >= table):
                bad = low if low < 0 else high
                limit = f"0..{table - 1} (the model's vocabulary has {table} tokens)" if table else ">= 0"
                raise ShapeError(f"input {name!r} holds id {bad}, outside {limit}")
            if len(shape) == 2 and self.max_positions and shape[1] > self.max_positions:
                raise ShapeError(
                    f"input {name!r} is {shape[1]} tokens long; this model takes at most {self.max_positions}"
                )

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._graphs is not None:
            from edgesdk.runtime.backends.ort_buckets import request_shape

            bucket = self._graphs.plan.choose(*request_shape(self._graphs.plan, feeds))
            if bucket is not None:
                return self._graphs.run(feeds, bucket)
            self._graph_report["plain_runs_outside_buckets"] = (
                self._graph_report.get("plain_runs_outside_buckets", 0) + 1
            )
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds, self._run_options)))

    def placement(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
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
                nodes[ev["name"][: -len("_kernel_time")]] = {
                    "op_type": args.get("op_name"),
                    "provider": args["provider"],
                }
        by_ep = Counter(n["provider"] for n in nodes.values())
        self._placement = {"source": "onnxruntime profiler (one run)", "by_provider": dict(by_ep), "nodes": nodes}
        return self._placement

    def report(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model_path.name,
            "providers_requested": self.providers_requested,
            "providers_active": self.providers_active,
            "placement": self._placement,
            "cuda_graphs": self._cuda_graph_report(),
            "eager_fallback": self.eager_fallback,
        }

    def _cuda_graph_report(self) -> dict[str, Any]:
        if self._graphs is None:
            return self._graph_report
        return {
            **self._graph_report,
            "captured": list(self._graphs.captured),
            "requests_per_bucket": dict(self._graphs.requests),
        }

    def close(self) -> None:
        self.session = None


def load_onnx(bundle: Bundle, ctx: LoadContext) -> Any:
    from edgesdk.extras import check_onnxruntime

    check_onnxruntime()
    opts = OnnxLoadOptions.narrow(ctx.options)
    chain = opts.providers or bundle.manifest.runtime.backend_chain or ["CPUExecutionProvider"]
    backend = OnnxRuntimeBackend(bundle.artifact_path("model"), list(chain), ctx.record_fallback, threads=opts.threads)
    backend.vocab_size, backend.max_positions = _config_int(bundle, "vocab_size"), _max_positions(bundle)
    want, reason = _cuda_graph_choice(bundle, opts.cuda_graphs, ctx.profile)
    if want:
        from edgesdk.runtime.backends.ort_buckets import bucket_options

        # The planner's shape_buckets decision; bundles without one: the defaults up to the model's positions
        backend.enable_cuda_graphs(reason, **bucket_options(bundle.manifest.plan, _max_positions(bundle)))
    else:
        backend._graph_report = {"enabled": False, "reason": reason}
    # No GPU EP initialised on a GPU bundle: eager CUDA where torch sees a GPU, if it measures faster
    from edgesdk.runtime.backends.torch_eager import choose_eager_fallback

    return choose_eager_fallback(bundle, ctx, backend, list(chain))


def _cuda_graph_choice(bundle: Bundle, option: bool | None, profile: Any = None) -> tuple[bool, str]:
    """Option first (``cuda_graphs``: True/False), else the load-time profile, else the one the bundle was
    built for: its ``kernels.cuda_graphs.recommended``."""
    if option is not None:
        return bool(option), f"cuda_graphs={'on' if option else 'off'} (option)"
    name = profile.name if profile is not None else bundle.manifest.profile.name
    try:
        if profile is None and name:
            from edgesdk.profiles import resolve_profile

            profile = resolve_profile(name)
        rec = profile.kernel("cuda_graphs").recommended if profile is not None else None
    except Exception:  # noqa: BLE001 - an unknown profile here only means: no recommendation
        rec = None
    if rec:
        return True, (
            f"profile {name} recommends CUDA graphs; measured on an H200 (MiniLM FP16, batch 1, seq "
            "128): plain run 0.54 ms, IO binding 0.46 ms, captured graph 0.22 ms"
        )
    return False, f"profile {name or '?'} does not recommend CUDA graphs" + (
        " (not resolvable here)" if rec is None else ""
    )


def _max_positions(bundle: Bundle) -> int | None:
    return _config_int(bundle, "max_position_embeddings")


def _config_int(bundle: Bundle, key: str) -> int | None:
    """A positive integer of the bundle's config.json (a text model's table sizes), else None."""
    cfg = Path(bundle.path) / "config.json"
    try:
        value = json.loads(cfg.read_text()).get(key) if cfg.is_file() else None
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    except (ValueError, TypeError, OSError, AttributeError, RecursionError):
        return None


# "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : <detail>": how every onnxruntime status exception reads.
_ORT_ERROR = re.compile(r"^\[ONNXRuntimeError\] : \d+ : ([A-Z_]+) : (.*)$", re.S)


class OnnxRuntimeRunError(EdgeSDKError):
    """onnxruntime failed a run whose inputs matched the model's spec (exit 1: not the caller's input)."""

    exit_code = 1
