# SPDX-License-Identifier: Apache-2.0
"""Static shape buckets for ONNX Runtime on the CUDA EP: IO binding + one captured CUDA graph per bucket.

CUDA graphs replay fixed kernels on fixed addresses, so they need static shapes. A request is padded up to the
smallest bucket that holds it (batch and sequence upper bounds) and the padded tokens are masked out through
the model's ``attention_mask`` (the "upper bound + runtime mask" way to serve dynamic shapes); outputs are cut
back to the request's own batch and sequence. Measured on an H200 (tools/bench/results/onnx_gpu_h200.json):
MiniLM FP16 at batch 1, seq 128: plain ``run`` 0.54 ms, IO binding 0.46 ms, captured graph 0.22 ms.

``BucketPlan`` and ``pad_feeds``/``cut_outputs`` are plain numpy (tested on the CPU); ``CudaGraphBuckets``
holds one ``enable_cuda_graph`` session and selects each bucket's graph with the ``gpu_graph_id`` run option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgesdk.manifest import planned_shape_buckets

# Used for bundles built before the planner recorded a ``shape_buckets`` decision (see bucket_options).
DEFAULT_SEQ_BUCKETS = (32, 128, 256, 512)
DEFAULT_BATCH_BUCKETS = (1, 8)
_MASK_NAMES = ("attention_mask",)


@dataclass(frozen=True)
class Bucket:
    batch: int
    seq: int | None  # None: the model has no sequence axis (e.g. an image model): batch bucketing only

    @property
    def key(self) -> str:
        return f"b{self.batch}" + (f"_s{self.seq}" if self.seq is not None else "")


@dataclass
class BucketPlan:
    """Which inputs carry a batch/sequence axis, and the buckets to capture."""

    buckets: list[Bucket]
    batch_inputs: list[str]
    seq_inputs: list[str]
    mask_input: str | None
    reason: str
    skipped: list[str] = field(default_factory=list)
    source: str = "runtime defaults"  # or "plan": the bundle's shape_buckets decision

    def choose(self, batch: int, seq: int | None) -> Bucket | None:
        """Smallest bucket holding (batch, seq); None when the request is larger than every bucket."""
        fits = [
            b
            for b in self.buckets
            if b.batch >= batch
            and (seq is None or b.seq is None or b.seq >= seq)
            and (b.seq is None) == (seq is None or not self.seq_inputs)
        ]
        return min(fits, key=lambda b: (b.batch * (b.seq or 1), b.batch), default=None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "buckets": [b.key for b in self.buckets],
            "padding": "upper bound + attention mask" if self.mask_input else "batch only (no attention mask input)",
            "reason": self.reason,
            "source": self.source,
            "skipped": self.skipped,
        }


def _dynamic(dim: Any) -> bool:
    return not (isinstance(dim, int) and dim > 0)


def bucket_options(plan: Mapping[str, Any] | None, max_positions: int | None = None) -> dict[str, Any]:
    """Keyword arguments for :func:`plan_buckets` from a bundle manifest's ``plan``: the planner's
    ``shape_buckets`` decision when the bundle records one (``source="plan"``), else today's defaults
    capped at ``max_positions`` (bundles built before the decision existed, or whose profile had no CUDA EP).
    A recorded decision without sequence buckets (no token axis planned) keeps the default sequence ladder
    for a model that turns out to have one."""
    planned = planned_shape_buckets(dict(plan) if isinstance(plan, Mapping) else None)
    if planned is None:
        return {
            "seq_buckets": DEFAULT_SEQ_BUCKETS,
            "batch_buckets": DEFAULT_BATCH_BUCKETS,
            "max_seq": max_positions,
            "source": "runtime defaults (the bundle records no shape_buckets decision)",
        }
    if planned.seq is None:
        return {
            "seq_buckets": DEFAULT_SEQ_BUCKETS,
            "batch_buckets": planned.batch,
            "max_seq": max_positions,
            "source": "plan (batch); sequence: runtime defaults",
        }
    return {"seq_buckets": planned.seq, "batch_buckets": planned.batch, "max_seq": max(planned.seq), "source": "plan"}


def plan_buckets(
    inputs: Sequence[Any],
    *,
    seq_buckets: Sequence[int] = DEFAULT_SEQ_BUCKETS,
    batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    max_seq: int | None = None,
    reason: str = "",
    source: str = "runtime defaults",
) -> BucketPlan:
    """Buckets for a model whose inputs are ``inputs`` (objects with ``name`` and ``shape``).

    Axis 0 dynamic -> batch axis; axis 1 dynamic on a rank-2 input -> sequence axis. Sequence padding is only
    planned when an ``attention_mask`` input exists (without it padded tokens would change the result).
    """
    batch_inputs = [i.name for i in inputs if len(i.shape) >= 1 and _dynamic(i.shape[0])]
    seq_inputs = [i.name for i in inputs if len(i.shape) == 2 and _dynamic(i.shape[1])]
    mask = next((i.name for i in inputs if i.name in _MASK_NAMES), None)
    skipped = []
    if seq_inputs and mask is None:
        skipped.append(f"sequence padding: no attention mask among {[i.name for i in inputs]}")
        seq_inputs = []
    seqs: list[int | None] = [s for s in seq_buckets if max_seq is None or s <= max_seq] if seq_inputs else [None]
    if seq_inputs and max_seq is not None and max_seq not in seqs:
        seqs.append(max_seq)
    batches = list(batch_buckets) if batch_inputs else [1]
    return BucketPlan(
        [Bucket(b, s) for b in batches for s in seqs], batch_inputs, seq_inputs, mask, reason, skipped, source
    )


def request_shape(plan: BucketPlan, feeds: Mapping[str, np.ndarray]) -> tuple[int, int | None]:
    ref = plan.batch_inputs[0] if plan.batch_inputs else next(iter(feeds))
    batch = int(np.asarray(feeds[ref]).shape[0]) if plan.batch_inputs else 1
    seq = int(np.asarray(feeds[plan.seq_inputs[0]]).shape[1]) if plan.seq_inputs else None
    return batch, seq


def pad_feeds(plan: BucketPlan, feeds: Mapping[str, np.ndarray], bucket: Bucket) -> dict[str, np.ndarray]:
    """Zero-pad every batch/sequence input up to ``bucket``; padded tokens get mask 0. Padded batch rows keep
    one attended token (mask[:, 0] = 1) so no attention row is fully masked."""
    out = {}
    for name, value in feeds.items():
        arr = np.asarray(value)
        pad = [(0, 0)] * arr.ndim
        if name in plan.batch_inputs:
            pad[0] = (0, bucket.batch - arr.shape[0])
        if name in plan.seq_inputs and bucket.seq is not None:
            pad[1] = (0, bucket.seq - arr.shape[1])
        if any(p[1] < 0 for p in pad):
            raise ValueError(f"input {name!r} of shape {list(arr.shape)} does not fit bucket {bucket.key}")
        padded = np.pad(arr, pad) if any(p[1] for p in pad) else np.ascontiguousarray(arr)
        if name == plan.mask_input and pad[0][1]:
            padded[arr.shape[0] :, 0] = 1
        out[name] = padded
    return out


def cut_outputs(
    outputs: Mapping[str, np.ndarray], bucket: Bucket, batch: int, seq: int | None
) -> dict[str, np.ndarray]:
    """Cut padded outputs back to the request: axis 0 of bucket.batch -> batch, axis 1 of bucket.seq -> seq."""
    res: dict[str, np.ndarray] = {}
    for name, arr in outputs.items():
        idx: list[slice] = [slice(None)] * arr.ndim
        if arr.ndim >= 1 and arr.shape[0] == bucket.batch:
            idx[0] = slice(0, batch)
        if seq is not None and bucket.seq is not None and arr.ndim >= 2 and arr.shape[1] == bucket.seq:
            idx[1] = slice(0, seq)
        res[name] = arr[tuple(idx)]
    return res


class CudaGraphBuckets:
    """One ``enable_cuda_graph`` CUDA EP session; each bucket's graph is captured on its first request
    (``gpu_graph_id`` = bucket index + 1) with inputs and outputs bound at fixed device addresses."""

    def __init__(
        self,
        model_path: str,
        plan: BucketPlan,
        output_names: Sequence[str],
        probe: Any,
        session_options: Any = None,
        device_id: int = 0,
    ):
        import onnxruntime as ort

        self._ort = ort
        self.plan = plan
        self.output_names = list(output_names)
        self.probe = probe  # plain run (feeds -> {name: array}): output shapes/dtypes of a bucket, once
        self.device_id = device_id
        self.session = ort.InferenceSession(
            model_path,
            session_options,
            providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1", "device_id": str(device_id)})],
        )
        self._bound: dict[Bucket, tuple[Any, dict[str, Any], Any]] = {}
        self.captured: list[str] = []
        self.requests: dict[str, int] = {}

    def _bind(self, bucket: Bucket, padded: Mapping[str, np.ndarray]) -> tuple[Any, dict[str, Any], Any]:
        ort = self._ort
        io = self.session.io_binding()
        vals = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", self.device_id) for k, v in padded.items()}
        for k, v in vals.items():
            io.bind_ortvalue_input(k, v)
        shapes = self.probe(padded)
        outs = {
            n: ort.OrtValue.ortvalue_from_shape_and_type(list(shapes[n].shape), shapes[n].dtype, "cuda", self.device_id)
            for n in self.output_names
        }
        for n, v in outs.items():  # fixed output addresses too: the replayed graph writes there
            io.bind_ortvalue_output(n, v)
        vals.update({f"__out__{n}": v for n, v in outs.items()})
        ro = ort.RunOptions()
        ro.add_run_config_entry("gpu_graph_id", str(self.plan.buckets.index(bucket) + 1))
        self.session.run_with_iobinding(io, ro)  # first run on this graph id captures it
        self.captured.append(bucket.key)
        return io, vals, ro

    def run(self, feeds: Mapping[str, np.ndarray], bucket: Bucket) -> dict[str, np.ndarray]:
        batch, seq = request_shape(self.plan, feeds)
        padded = pad_feeds(self.plan, feeds, bucket)
        if bucket not in self._bound:
            self._bound[bucket] = self._bind(bucket, padded)
        else:
            io, vals, ro = self._bound[bucket]
            for k, v in padded.items():
                vals[k].update_inplace(v)  # same device buffers the graph was captured on
            self.session.run_with_iobinding(io, ro)
        io = self._bound[bucket][0]
        self.requests[bucket.key] = self.requests.get(bucket.key, 0) + 1
        outs = dict(zip(self.output_names, io.copy_outputs_to_cpu()))
        return cut_outputs(outs, bucket, batch, seq)
