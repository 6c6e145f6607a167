# SPDX-License-Identifier: Apache-2.0
"""Measure a bundle on this machine through the runtime API (``edgesdk.load``).

Encoders / tensor models: warm-up, then per-call latency (perf_counter_ns around ``session.run``),
throughput at ``concurrency`` threads, and per-node time + EP placement from ONNX Runtime's own
profiler in a separate pass (so profiling never inflates the latency figures). LLMs: prefill and
decode rates, TTFT and TPOT from ``session.stream`` chunk times. Memory: host RSS before load and
the process's peak (``ru_maxrss``: zero sampling cost); device memory from NVML/torch when readable,
else ``None``. Unreadable figures are ``None`` with a reason, never 0.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgesdk.errors import BackendUnavailableError, InputError
from edgesdk.profiler.llm_bench import (
    OPENERS,
    copy_prompt,
    llm_metrics,
    llm_stream_once,
    prompt_of,
    speculative_compare,
)
from edgesdk.profiler.stats import latency_stats

if TYPE_CHECKING:
    from edgesdk.profiler.energy import EnergyMeter
    from edgesdk.runtime.session import Session


@dataclass
class BenchOptions:
    warmup: int = 10
    iterations: int = 200
    concurrency: int = 1
    batch: int = 1
    seq_len: int = 128
    prompt_tokens: int = 128
    gen_tokens: int = 128
    llm_repeats: int = 3
    ort_profile_runs: int = 10  # 0 disables the per-node pass
    threads: int | None = None
    profile: str | None = None
    progress: bool = True
    # Device metrics (GPU utilisation, power, temperature, clocks) read on a thread every this many seconds
    # during the measurement, into the report's device_metrics; 0 turns the sampler off.
    device_metrics_interval_s: float = 1.0
    energy: bool = True  # joules around the measured calls (energy.py); False: the result says it was off
    # GGUF LLMs: decode also measured with speculative decoding by this method against none (report "speculative"):
    # "lookup", "draft" (the bundle's draft model), "auto" (draft where the bundle has one, else lookup), "off": not
    speculative: str = "auto"

    def to_dict(self) -> dict:
        return asdict(self)


def _progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr, only when asked for and stderr is a terminal (never into CI logs)."""
    import sys

    if not enabled or not sys.stderr.isatty():
        return None
    import os

    from tqdm import tqdm

    try:  # a pseudo-terminal without a window size reports 0 x 0: tqdm would draw nothing (edgesdk/build.py)
        size = os.get_terminal_size(sys.stderr.fileno())
        sized = bool(size.columns and size.lines)
    except (OSError, ValueError):
        sized = True
    return tqdm(
        total=total,
        desc=desc,
        unit="it",
        leave=False,
        mininterval=0.25,
        **({"dynamic_ncols": True} if sized else {"ncols": 80, "nrows": 24}),
    )


def timed_loop(fn: Callable[[], Any], iterations: int, *, desc: str = "measure", progress: bool = False) -> list[float]:
    """Per-call latency in ms. tqdm is updated in batches (``mininterval``) so the bar costs ~nothing."""
    bar = _progress(iterations, desc, progress)
    samples = [0.0] * iterations
    clock = time.perf_counter_ns
    try:
        for i in range(iterations):
            t0 = clock()
            fn()
            samples[i] = (clock() - t0) / 1e6
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return samples


def plain_loop_ms(fn: Callable[[], Any], iterations: int) -> float:
    """Mean latency of a bare loop (one clock read at each end): the reference for profiler overhead."""
    t0 = time.perf_counter_ns()
    for _ in range(iterations):
        fn()
    return (time.perf_counter_ns() - t0) / 1e6 / iterations


def concurrent_throughput(fn: Callable[[], Any], iterations: int, threads: int) -> dict:
    """Run ``iterations`` calls spread over ``threads`` threads; throughput = calls / wall time."""
    per_thread = max(1, iterations // threads)
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def worker(k: int) -> None:
        try:
            start.wait()
            lat[k] = timed_loop(fn, per_thread)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    flat = [x for xs in lat for x in xs]
    return {
        "concurrency": threads,
        "calls": len(flat),
        "wall_s": wall,
        "per_s": len(flat) / wall,
        "latency_ms": latency_stats(flat),
    }


# ---------------------------------------------------------------- memory


def host_rss_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: unavailable
        return None


def peak_rss_bytes() -> int | None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if not peak:
        return None
    return int(peak) * (1 if os.uname().sysname == "Darwin" else 1024)


def nvml_device_used_bytes() -> int | None:
    """Memory in use on all NVIDIA GPUs (NVML, device-wide), or None without NVML."""
    from edgesdk.host import nvml

    with nvml() as pynvml:
        if pynvml is None:  # no NVML: unavailable, not zero
            return None
        try:
            return sum(
                pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                for i in range(pynvml.nvmlDeviceGetCount())
            )
        except Exception:  # noqa: BLE001
            return None


def device_memory(backend_name: str, used_before_load: int | None) -> dict:
    """GPU memory of this run: torch's allocator peak for the torch backend; else NVML, this process's
    entry if NVML lists it, else the device-wide growth since before the load (other processes included)."""
    import sys

    torch = sys.modules.get("torch")
    if backend_name == "torch" and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "peak_mb": torch.cuda.max_memory_allocated() / 1e6,
            "method": "torch.cuda.max_memory_allocated (allocator peak)",
        }
    from edgesdk.host import nvml

    with nvml() as pynvml:
        if pynvml is None:  # no NVML: unavailable, not zero
            return {"peak_mb": None, "method": "unavailable: no NVML / no NVIDIA driver"}
        try:
            used = None
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                        used = (used or 0) + proc.usedGpuMemory
        except Exception:  # noqa: BLE001 - per-process accounting unsupported (containers): try device-wide
            used = None
    if used is not None:
        return {"peak_mb": used / 1e6, "method": "NVML per-process used memory at the end of the run"}
    now = nvml_device_used_bytes()
    if now is None or used_before_load is None:
        return {"peak_mb": None, "method": "unavailable: NVML lists no memory for this process"}
    return {
        "peak_mb": max(0, now - used_before_load) / 1e6,
        "method": "NVML device-wide used memory, end of run minus before load (per-process not listed)",
    }


# ---------------------------------------------------------------- feeds

_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
_MANIFEST_TYPES = {
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "bool": "tensor(bool)",
}


def synthetic_feeds(inputs: dict, batch: int, seq: int, seed: int = 0) -> dict:
    """Inputs shaped like the graph's (dynamic dims: batch first, sequence elsewhere).

    Token ids are a fixed in-vocabulary id (1000), masks are all ones: latency of a transformer does
    not depend on the id values, only on the shape.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, spec in inputs.items():
        # ONNX Runtime NodeArg (.type "tensor(int64)", .shape) or a manifest io entry {"dtype", "shape"}
        if isinstance(spec, dict):
            dims, kind = spec.get("shape") or [], _MANIFEST_TYPES.get(str(spec.get("dtype")), str(spec.get("dtype")))
        else:
            dims, kind = spec.shape, spec.type
        shape = [d if isinstance(d, int) and d > 0 else (batch if axis == 0 else seq) for axis, d in enumerate(dims)]
        if kind in _INT_TYPES:
            dtype = _INT_TYPES[kind]
            fill = 0 if "type" in name else (1 if "mask" in name else 1000)
            feeds[name] = np.full(shape, fill, dtype=dtype)
        elif kind in _FLOAT_TYPES:
            feeds[name] = rng.standard_normal(shape).astype(_FLOAT_TYPES[kind])
        elif kind == "tensor(bool)":
            feeds[name] = np.ones(shape, dtype=bool)
        else:
            raise InputError(f"cannot make a synthetic value for input {name!r} of type {kind}")
    return feeds


# ---------------------------------------------------------------- ONNX Runtime per-node profile


def ort_node_profile(
    model_path: Path, providers: list[str], feeds: dict, runs: int, threads: int | None = None
) -> dict:
    """Per-node mean time and EP placement from ONNX Runtime's profiler (a twin session, ``runs`` runs)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_profiling = True
    if threads:
        so.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "edgesdk")
        sess = ort.InferenceSession(str(model_path), so, providers=providers)
        sess.run(None, feeds)  # first run allocates: keep it out of the per-node figures
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    return summarize_ort_events(events, runs + 1, skip_first=True)


def summarize_ort_events(events: list[dict], total_runs: int, skip_first: bool = True) -> dict:
    node_us: dict[str, list[float]] = defaultdict(list)
    meta: dict[str, dict] = {}
    for ev in events:
        args = ev.get("args") or {}
        name = ev.get("name", "")
        if ev.get("cat") != "Node" or not name.endswith("_kernel_time") or "provider" not in args:
            continue
        node = name[: -len("_kernel_time")]
        node_us[node].append(float(ev.get("dur", 0)))
        meta[node] = {"op_type": args.get("op_name"), "provider": args["provider"]}
    nodes = []
    for node, durs in node_us.items():
        kept = durs[1:] if skip_first and len(durs) > 1 else durs
        nodes.append({"node": node, **meta[node], "mean_us": sum(kept) / len(kept), "runs": len(kept)})
    nodes.sort(key=lambda n: -n["mean_us"])
    by_op: dict[str, float] = defaultdict(float)
    by_ep: dict[str, int] = defaultdict(int)
    for n in nodes:
        by_op[n["op_type"]] += n["mean_us"]
        by_ep[n["provider"]] += 1
    total = sum(by_op.values()) or 1.0
    return {
        "source": "onnxruntime SessionOptions.enable_profiling (twin session, first run dropped)",
        "runs": total_runs - (1 if skip_first else 0),
        "placement": dict(by_ep),
        "by_op_type": sorted(
            ({"op_type": k, "total_us": v, "share_pct": 100 * v / total} for k, v in by_op.items()),
            key=lambda r: -r["total_us"],
        ),
        "top_nodes": nodes[:25],
        "node_count": len(nodes),
    }


# ---------------------------------------------------------------- the whole measurement


def _versions() -> dict:
    import platform

    from edgesdk.host import tool_versions

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        **tool_versions(
            (
                "edgesdk",
                "numpy",
                "onnx",
                "onnxruntime",
                "onnxruntime-gpu",
                "llama_cpp_python",
                "torch",
                "transformers",
                "tensorrt",
                "nvidia-ml-py",
                "psutil",
            )
        ),
    }


def _bundle_can_run_here(bundle) -> None:
    """Name the missing runtime before loading, so the error says what to install."""
    import importlib.util

    from edgesdk.formats import find_format

    fmt = find_format(bundle.format)
    need = fmt.runtime_requires if fmt is not None else None
    if need and importlib.util.find_spec(need[0]) is None:
        raise BackendUnavailableError(
            f"cannot profile a {bundle.format} bundle on this machine: {need[1]} is not installed"
        )


SPECULATIVE_CHOICES = ("auto", "lookup", "draft", "off")


def speculative_method(bundle, asked: str) -> str | None:
    """The method ``profiler run`` compares with no speculation (None: no comparison): GGUF LLMs only; ``auto`` is
    the bundle's draft model where it has one, else prompt lookup. Refused in one line: an unknown name, a method
    named for a bundle that is no GGUF LLM, ``draft`` for a bundle built without ``--draft``."""
    if asked not in SPECULATIVE_CHOICES:
        raise InputError(f"speculative must be one of {', '.join(SPECULATIVE_CHOICES)}, got {asked!r}")
    llm = bundle.manifest.llm if bundle.format == "gguf" else None
    if asked == "off" or (llm is None and asked == "auto"):
        return None
    if llm is None:
        raise InputError(f"--speculative {asked} measures GGUF LLM bundles; {bundle.path} is a {bundle.format} bundle")
    draft = llm.draft
    if asked == "draft" and draft is None:
        raise InputError(
            f"--speculative draft needs a draft model in the bundle (edgesdk build --draft SMALL_MODEL); {bundle.path} "
            "has none: use --speculative lookup"
        )
    return asked if asked != "auto" else ("draft" if draft is not None else "lookup")


def measure_bundle(
    path: str | os.PathLike,
    opts: BenchOptions | None = None,
    log: Callable[[str], None] = lambda _m: None,
    bundle: Any = None,
) -> dict:
    """Load a bundle with ``edgesdk.load`` (the runtime's, which the facade forwards to) and measure it; returns
    the report body (see report.py). ``bundle``: the bundle at ``path`` already opened and verified (not hashed
    again here)."""
    from edgesdk.bundle import open_bundle
    from edgesdk.profiler import device_state as dstate
    from edgesdk.profiler.device_metrics import DeviceReader, DeviceSampler
    from edgesdk.profiler.energy import EnergyMeter
    from edgesdk.profiler.sensors import read_device_state
    from edgesdk.runtime.backend import LLMBackend
    from edgesdk.runtime.session import load as load_session

    opts = opts or BenchOptions()
    if opts.iterations < 1 or opts.warmup < 0 or opts.concurrency < 1:
        raise InputError("iterations and concurrency must be >= 1 and warmup >= 0")
    if bundle is None:
        bundle = open_bundle(path)
    _bundle_can_run_here(bundle)
    spec_method = speculative_method(bundle, opts.speculative)
    state_before = read_device_state()
    snap_before = dstate.snapshot()
    rss_before = host_rss_bytes()
    gpu_before = nvml_device_used_bytes()
    load_kw: dict[str, Any] = {}
    if opts.threads:
        load_kw["threads"] = opts.threads
    t0 = time.perf_counter()
    session = load_session(Path(path), profile=opts.profile, **load_kw)
    load_s = time.perf_counter() - t0
    log(
        f"loaded {bundle.model_name} ({bundle.format}) on {session.backend.name}/{session.backend.device} "
        f"in {load_s * 1e3:.0f} ms"
    )
    body: dict[str, Any] = {
        "settings": opts.to_dict(),
        "load": {"time_ms": load_s * 1e3, "method": "wall time of edgesdk.load()"},
    }
    is_llm = isinstance(session.backend, LLMBackend)
    sampler = None
    if opts.device_metrics_interval_s > 0:
        sampler = DeviceSampler(DeviceReader(), opts.device_metrics_interval_s)
        sampler.__enter__()
    meter = EnergyMeter() if opts.energy else None
    try:
        if is_llm:
            body.update(_measure_llm(session, opts, meter, spec_method, log))
        else:
            body.update(_measure_tensors(session, bundle, opts, meter, log))
        body["memory"] = _memory_section(rss_before, gpu_before, session.backend.name)
        body["runtime"] = session.report()
        body["fallbacks"] = session.fallbacks
    finally:
        if meter is not None and meter.running:
            meter.stop()  # a failed measurement still stops the sampling thread
        if sampler is not None:
            sampler.__exit__(None, None, None)
            sampler.reader.close()
        session.close()
    if not opts.energy:
        body["energy"] = {"joules": None, "watts": None, "source": None, "reason": "energy measurement turned off"}
    if sampler is not None:
        body["device_metrics"] = sampler.summary()
    state = dstate.during(snap_before, dstate.snapshot())
    # the earlier raw readings (governor, thermal zones, NVML, tegrastats) stay beside the snapshots
    state["readings"] = {"before": state_before, "after": read_device_state()}
    body["device_state"] = state
    body["versions"] = _versions()
    body["bundle"] = _bundle_section(bundle)
    return body


def _memory_section(rss_before: int | None, gpu_before: int | None, backend_name: str) -> dict[str, Any]:
    """The report's ``memory``: the host's resident set before the load, at its peak and now, and the device's."""
    peak = peak_rss_bytes()
    return {
        "host_rss_before_load_mb": rss_before / 1e6 if rss_before is not None else None,
        "host_peak_rss_mb": peak / 1e6 if peak is not None else None,
        "host_rss_end_mb": (host_rss_bytes() or 0) / 1e6 or None,
        "host_method": "peak = getrusage ru_maxrss (process high-water mark, includes the interpreter)",
        "device": device_memory(backend_name, gpu_before),
    }


def _bundle_section(bundle: Any) -> dict[str, Any]:
    """The report's ``bundle``: which bundle was measured, of what model, built for which profile."""
    return {
        "path": str(bundle.path),
        "bundle_id": bundle.bundle_id,
        "format": bundle.format,
        "precision": bundle.precision,
        "model": bundle.model_name,
        "built_for": bundle.manifest.profile.name,
        "task": bundle.manifest.model.task,
    }


def _measure_llm(
    session: Session, opts: BenchOptions, meter: EnergyMeter | None, spec_method: str | None, log: Callable[[str], None]
) -> dict[str, Any]:
    """An LLM's part of the report: generations (the first one warms caches and is not reported), their energy,
    and with ``spec_method`` the same decode with and without speculative decoding."""
    out: dict[str, Any] = {}
    prompt, n_prompt = prompt_of(session, opts.prompt_tokens)
    runs = []
    bar = _progress(opts.llm_repeats + 1, "generate", opts.progress)
    for i in range(opts.llm_repeats + 1):  # the first generation warms caches: not reported
        if i == 1 and meter is not None:
            meter.start()  # energy of the measured generations only, prefill included
        # A different first word each time: llama-cpp-python reuses the KV cache of a repeated
        # prompt prefix, which would turn TTFT into the time for one token.
        r = llm_stream_once(session, f"{OPENERS[i % len(OPENERS)]} {prompt}", opts.gen_tokens)
        if i:
            runs.append(r)
        if bar is not None:
            bar.update(1)
    if meter is not None:
        meter.stop()
    if bar is not None:
        bar.close()
    n_prompt = len(session.tokenize(f"{OPENERS[1]} {prompt}"))
    out["llm"] = llm_metrics(n_prompt, runs)
    if meter is not None:
        out["energy"] = meter.result(tokens=sum(out["llm"]["generated_tokens"]))
    if spec_method is not None:
        engine = (session.report().get("backend_report") or {}).get("engine") or {}
        k = engine.get("draft_k") if spec_method == "draft" else engine.get("draft_max")
        log(f"decode with and without speculative decoding ({spec_method}, k {k})")
        out["speculative"] = speculative_compare(
            session, copy_prompt(prompt), opts.gen_tokens, opts.llm_repeats, spec_method, k
        )
    return out


def _measure_tensors(
    session: Session, bundle: Any, opts: BenchOptions, meter: EnergyMeter | None, log: Callable[[str], None]
) -> dict[str, Any]:
    """A tensor model's part of the report: latency of synthetic feeds after the warm-up, their energy,
    throughput (also at ``opts.concurrency``) and ONNX Runtime's per-node profile where asked."""
    from edgesdk.runtime.backend import check_feeds
    from edgesdk.runtime.backends.onnxruntime import OnnxRuntimeBackend

    out: dict[str, Any] = {}
    feeds = synthetic_feeds(
        {s.name: {"dtype": s.dtype, "shape": list(s.shape or [])} for s in session.backend.inputs},
        opts.batch,
        opts.seq_len,
    )
    call = lambda: session.run(feeds)  # noqa: E731
    for _ in range(opts.warmup):
        call()
    if meter is not None:
        meter.start()
    samples = timed_loop(call, opts.iterations, progress=opts.progress)
    if meter is not None:
        meter.stop()
        out["energy"] = meter.result(items=len(samples) * opts.batch)
    out["latency_ms"] = latency_stats(samples)
    out["latency_ms"]["samples"] = samples
    total_s = sum(samples) / 1e3
    out["throughput"] = [
        {
            "concurrency": 1,
            "calls": len(samples),
            "per_s": len(samples) / total_s,
            "items_per_s": len(samples) * opts.batch / total_s,
        }
    ]
    if opts.concurrency > 1:
        conc = concurrent_throughput(call, opts.iterations, opts.concurrency)
        conc["items_per_s"] = conc["per_s"] * opts.batch
        out["throughput"].append(conc)
    if opts.ort_profile_runs and bundle.format == "onnx" and isinstance(session.backend, OnnxRuntimeBackend):
        model_path = session.backend.model_path
        log("per-node profile (onnxruntime profiler, separate session)")
        out["ort_profile"] = ort_node_profile(
            model_path,
            list(session.backend.providers_active),
            check_feeds(session.backend.inputs, feeds),
            opts.ort_profile_runs,
            opts.threads,
        )
    return out
