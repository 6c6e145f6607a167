# SPDX-License-Identifier: Apache-2.0
"""This machine, probed once: GPUs (NVML), Jetson/L4T, TensorRT, ``trtexec``, CPU, OS, tool versions.

Every other module asks here instead of probing on its own: ``doctor`` prints it, the planner takes
it as an argument, the runtime checks engines against it, the profiler records it. The rules live in
one place each:

* NVML is initialised only in :func:`nvml` (a context manager that yields ``pynvml`` or ``None``);
  dynamic readings (free memory, clocks, per-process memory) go through it too.
* ``/etc/nv_tegra_release`` and the device tree are read only by :func:`read_jetson_identity`.
* ``trtexec`` is found only by :func:`find_trtexec`: ``PATH`` first, then the JetPack/NGC location.
* Tool versions come only from :func:`tool_versions` (distribution metadata: nothing heavy is
  imported to learn a version).

Files are read below a ``root`` directory, so a test can hand :func:`probe` a tree holding a
Jetson's files; NVML and ``PATH`` are consulted only for the real root. Tests that need other
facts construct :class:`HostFacts` directly (every field has a default meaning "absent").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import importlib.metadata as md
import os
import platform
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRTEXEC_FALLBACK_PATH = Path("/usr/src/tensorrt/bin/trtexec")  # where JetPack and NVIDIA's containers put it

# Jetson iGPU compute capability by SoC (device-tree "nvidia,tegraNNN").
TEGRA_SM = {"tegra234": "8.7", "tegra194": "7.2", "tegra186": "6.2", "tegra210": "5.3"}
TEGRA_SM_SOURCE = (
    "NVIDIA CUDA GPUs compute capability table (developer.nvidia.com/cuda-gpus): "
    "Jetson Orin 8.7, Xavier 7.2, TX2 6.2, Nano 5.3"
)

# ISA features worth naming (x86 and Arm spellings from /proc/cpuinfo).
INTERESTING_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "asimdhp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
)

# The distributions whose versions a host report carries (each looked up, never imported).
VERSION_DISTS = (
    "edgesdk",
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime-gpu",
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "llama-cpp-python",
    "gguf",
    "tensorrt",
    "tensorrt-cu12",
    "tensorrt-cu13",
    "nvidia-ml-py",
    "psutil",
    "opentelemetry-api",
    "opentelemetry-sdk",
)

# Module part numbers: the middle field of a TNSPEC ("3701-500-0005") is optional.
_PART_RE = re.compile(r"\b[pP]?(3701|3767)-(?:\d{3}-)?(\d{4})\b")
_L4T_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


# ---------------------------------------------------------------- the facts


@dataclass(frozen=True)
class GpuInfo:
    """One discrete GPU as NVML reports it."""

    index: int
    name: str
    sm: str | None = None  # compute capability "9.0"; None on drivers that do not say
    memory_bytes: int | None = None
    driver: str | None = None
    source: str = "nvml"


@dataclass(frozen=True)
class JetsonFacts:
    """A Jetson's identity from its device tree and L4T release file."""

    model: str | None = None
    platform: str | None = None  # "tegra234"
    l4t: str | None = None  # "36.4.3"
    sm: str | None = None
    sm_source: str | None = None
    compatible: tuple[str, ...] = ()
    module_part_number: str | None = None
    part_number_source: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What this host has. Construct directly in tests; :func:`probe` fills it on a real machine."""

    os: str = ""
    arch: str = ""
    python: str = ""
    cpu_model: str | None = None
    cpu_flags: tuple[str, ...] = ()  # the INTERESTING_FLAGS this CPU has
    cpu_source: str = "unavailable"
    logical_cores: int | None = None
    tensorrt: str | None = None
    tensorrt_reason: str = "not probed"
    trtexec: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    jetson: JetsonFacts | None = None
    onnxruntime_providers: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()

    @property
    def sm(self) -> str | None:
        """Compute capability of the GPU engines would run on (the Jetson iGPU, else GPU 0)."""
        if self.jetson is not None:
            return self.jetson.sm
        return self.gpus[0].sm if self.gpus else None

    @property
    def gpu_name(self) -> str | None:
        if self.jetson is not None:
            return self.jetson.model
        return self.gpus[0].name if self.gpus else None

    @property
    def is_jetson(self) -> bool:
        return self.jetson is not None

    def tensorrt_env(self) -> dict[str, Any]:
        """The view engine pre-flight and engine builds take: TensorRT, SM, L4T, platform, GPU, trtexec."""
        j = self.jetson
        return {
            "tensorrt": self.tensorrt,
            "sm": self.sm,
            "l4t": j.l4t if j else None,
            "platform": j.platform if j else None,
            "gpu": self.gpu_name,
            "trtexec": self.trtexec,
            "evidence": list(self.evidence),
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["versions"] = dict(self.versions)
        out["sm"] = self.sm
        return out


# ---------------------------------------------------------------- one rule each


def read_under(root: Path, rel: str) -> str | None:
    """A text file below ``root``; None when unreadable."""
    try:
        return (Path(root) / rel.lstrip("/")).read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _is_real_root(root: Path) -> bool:
    return Path(root).resolve() == Path("/")


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _CtypesNvml:
    """The few NVML calls edgesdk makes, through the driver's ``libnvidia-ml.so.1`` (NVML's C API, the
    same entry points nvidia-ml-py wraps), for a runtime-only install without the ``profiler`` extra.
    Method names and results follow ``pynvml``'s, so :func:`nvml` can yield either."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(f"{what} failed (NVML return code {rc})")

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.lib.nvmlShutdown()

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        buf = ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)), "nvmlSystemGetDriverVersion")
        return buf.value.decode()

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        n = ctypes.c_uint(0)
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount_v2")
        return int(n.value)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:  # noqa: N802
        handle = ctypes.c_void_p()
        self._check(
            self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)),
            "nvmlDeviceGetHandleByIndex_v2",
        )
        return handle

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:  # noqa: N802
        buf = ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlDeviceGetName(handle, buf, ctypes.c_uint(96)), "nvmlDeviceGetName")
        return buf.value.decode()

    def nvmlDeviceGetCudaComputeCapability(self, handle: ctypes.c_void_p) -> tuple[int, int]:  # noqa: N802
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._check(
            self.lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)),
            "nvmlDeviceGetCudaComputeCapability",
        )
        return int(major.value), int(minor.value)

    def nvmlDeviceGetMemoryInfo(self, handle: ctypes.c_void_p) -> _NvmlMemory:  # noqa: N802
        mem = _NvmlMemory()
        self._check(self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
        return mem


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """``pynvml`` (the ``profiler`` extra) initialised for the block, else the driver's NVML library through
    ctypes (:class:`_CtypesNvml`), or None where NVML or the driver is absent (no GPU here).

    The only ``nvmlInit`` in edgesdk. NVML counts init/shutdown pairs, so nesting is safe. Reading GPU
    memory this way loads no CUDA runtime and no ONNX Runtime: a GGUF load sizes its offload with it.
    """
    lib: Any = None
    try:
        import pynvml

        lib = pynvml
    except ImportError:
        with contextlib.suppress(OSError):
            lib = _CtypesNvml()
    if lib is None:
        yield None
        return
    try:
        lib.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded, or the ctypes OSError
        yield None
        return
    try:
        yield lib
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpus() -> tuple[GpuInfo, ...]:
    """Discrete GPUs via NVML (nvidia-ml-py); empty when NVML or a driver is absent."""
    gpus = []
    with nvml() as nv:
        if nv is None:
            return ()
        with contextlib.suppress(Exception):  # an NVML error mid-way: report what was read
            driver = _text(nv.nvmlSystemGetDriverVersion())
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                try:
                    major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
                    sm: str | None = f"{major}.{minor}"
                except Exception:  # noqa: BLE001 - older drivers
                    sm = None
                gpus.append(
                    GpuInfo(
                        index=i,
                        name=_text(nv.nvmlDeviceGetName(h)),
                        sm=sm,
                        memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                        driver=driver,
                    )
                )
    return tuple(gpus)


def gpu_free_bytes(index: int = 0) -> int | None:
    """Free memory of GPU ``index`` now (NVML), or None without NVML."""
    with nvml() as nv:
        if nv is None:
            return None
        try:
            return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).free)
        except Exception:  # noqa: BLE001 - no such GPU
            return None


def parse_part_number(text: str) -> str | None:
    m = _PART_RE.search(text or "")
    return f"p{m.group(1)}-{m.group(2)}" if m else None


def parse_l4t_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 4.3, ...`` -> ``36.4.3``."""
    m = _L4T_RE.search(text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def read_jetson_identity(root: Path | str = "/") -> JetsonFacts | None:
    """Jetson identity from the device tree and ``/etc/nv_tegra_release``; None when this is not a Jetson."""
    root = Path(root)
    compatible_raw = read_under(root, "proc/device-tree/compatible")
    model = read_under(root, "proc/device-tree/model")
    release = read_under(root, "etc/nv_tegra_release")
    if not (compatible_raw or release) or (compatible_raw and "nvidia," not in compatible_raw):
        return None
    compatible = tuple(c for c in (compatible_raw or "").split("\0") if c.strip())
    part = part_source = None
    # The devkit compatible string carries the module ("nvidia,p3768-0000+p3767-0003"); older L4T put
    # it in the plugin-manager ids; flashed systems also have it in the boot-control TNSPEC.
    for rel in (
        "proc/device-tree/compatible",
        "proc/device-tree/chosen/ids",
        "proc/device-tree/chosen/plugin-manager/ids",
        "etc/nv_boot_control.conf",
    ):
        part = parse_part_number((read_under(root, rel) or "").replace("\0", " "))
        if part:
            part_source = rel
            break
    plat = next((c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")), None)
    sm = TEGRA_SM.get(plat or "")
    return JetsonFacts(
        model=model.strip("\0\n ") if model else None,
        platform=plat,
        l4t=parse_l4t_release(release or ""),
        sm=sm,
        sm_source=TEGRA_SM_SOURCE if sm else None,
        compatible=compatible,
        module_part_number=part,
        part_number_source=part_source,
    )


def read_cpu(root: Path | str = "/") -> dict[str, Any]:
    """CPU model, logical cores and the interesting ISA flags from ``/proc/cpuinfo``."""
    text = read_under(Path(root), "proc/cpuinfo") or ""
    model = None
    flags: set[str] = set()
    logical = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "processor":
            logical += 1
        elif key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip() or None
        elif key in ("flags", "features"):
            flags.update(value.split())
    return {
        "model": model,
        "logical_cores": logical or os.cpu_count(),
        "flags": sorted(f for f in flags if f in INTERESTING_FLAGS),
        "source": "proc/cpuinfo" if text else "unavailable",
    }


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset), else
    ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def thread_cap() -> int | None:
    """``OMP_NUM_THREADS`` when it is a positive integer (the first of a comma list, as OpenMP reads it), else
    None: the cap a shared host, a container or a CI job sets for torch and every OpenMP program."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def default_threads(*, batch: bool = False, planned: int | None = None) -> int:
    """CPU threads for llama.cpp when the caller names none (``--threads``, ``load(threads=...)``).

    ``planned``: the bundle's plan (the target profile's core count), capped here by what this host gives: a bundle
    built for a 6-core Orin and run on a 2-core host gets 2 threads, not 6 spinning on 2 cores. The cap is
    ``OMP_NUM_THREADS`` when it is set (llama.cpp does not read it; torch and ONNX Runtime's OpenMP builds do, so one
    setting caps them all), else the usable CPUs. Without a plan: that cap, else half the usable CPUs for generation
    (one per physical core on 2-way SMT: decoding is memory-bound, and a second thread per core only adds barrier
    waits) and all of them for batch work (quantizing, the build's perplexity checks)."""
    cap = thread_cap()
    cpus = usable_cpus()
    if planned:
        return max(1, min(planned, cap or cpus))
    if cap:
        return cap
    return cpus if batch else max(1, cpus // 2)


def find_trtexec() -> str | None:
    """``trtexec``: on ``PATH``, else where JetPack and NVIDIA's containers install it."""
    return shutil.which("trtexec") or (str(TRTEXEC_FALLBACK_PATH) if TRTEXEC_FALLBACK_PATH.is_file() else None)


@functools.cache
def tensorrt_python() -> tuple[str | None, str]:
    """TensorRT Python API version, or None with the reason it does not import."""
    try:
        trt = importlib.import_module("tensorrt")
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError when libnvinfer is missing
        return None, f"TensorRT Python API not importable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    version = getattr(trt, "__version__", None)
    if not version:
        return None, "the tensorrt module has no __version__ (bindings without libnvinfer?)"
    return str(version), "tensorrt Python API"


@functools.cache
def onnxruntime_providers() -> tuple[str, ...]:
    """Execution providers built into the installed onnxruntime (listed is not usable: see doctor)."""
    try:
        import onnxruntime as ort
    except Exception:  # noqa: BLE001 - not installed or its native library does not load
        return ()
    return tuple(ort.get_available_providers())


def dist_of(module: str) -> str:
    """The installed distribution that provides ``module`` (onnxruntime-gpu and onnxruntime share one)."""
    dists = md.packages_distributions().get(module) or [module]
    return sorted(dists)[0]


def tool_versions(dists: Iterable[str] = VERSION_DISTS) -> dict[str, str]:
    """Installed versions of ``dists`` from distribution metadata (absent ones left out)."""
    out = {}
    for dist in dists:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


# ---------------------------------------------------------------- the probe


@functools.lru_cache(maxsize=8)
def probe(root: str = "/") -> HostFacts:
    """This host (or the tree under ``root``), probed once per root. NVML and PATH only for the real root."""
    base = Path(root)
    real = _is_real_root(base)
    cpu = read_cpu(base)
    jetson = read_jetson_identity(base)
    trt_version, trt_why = tensorrt_python()
    gpus = read_gpus() if real and jetson is None else ()
    arch = platform.machine() if real else ("aarch64" if jetson or "asimd" in cpu["flags"] else "x86_64")
    arch = {"arm64": "aarch64", "AMD64": "x86_64"}.get(arch, arch)
    evidence = [
        f"tensorrt: {trt_version} ({trt_why})" if trt_version else trt_why,
        f"cpu: {cpu['model'] or 'model unknown'}, {cpu['logical_cores']} logical cores ({cpu['source']})",
    ]
    if jetson is not None:
        evidence.append(
            f"jetson {jetson.model!r} platform {jetson.platform}, L4T {jetson.l4t}"
            + (f", sm_{jetson.sm} ({jetson.sm_source})" if jetson.sm else "")
        )
    for g in gpus:
        evidence.append(f"gpu {g.index}: {g.name} sm_{g.sm} (NVML)")
    if jetson is None and not gpus:
        evidence.append(
            "no NVIDIA GPU found (NVML unavailable or reports none; not a Jetson)"
            if real
            else f"no NVIDIA GPU probed: {root} is not this machine's root"
        )
    return HostFacts(
        os=platform.system(),
        arch=arch,
        python=platform.python_version(),
        cpu_model=cpu["model"],
        cpu_flags=tuple(cpu["flags"]),
        cpu_source=cpu["source"],
        logical_cores=cpu["logical_cores"],
        tensorrt=trt_version,
        tensorrt_reason=trt_why,
        trtexec=find_trtexec() if real else None,
        gpus=gpus,
        jetson=jetson,
        onnxruntime_providers=onnxruntime_providers(),
        versions={**tool_versions(), "python": platform.python_version(), "platform": platform.platform()},
        evidence=tuple(evidence),
    )


def host_env(root: str = "/") -> dict[str, Any]:
    """``probe(root).tensorrt_env()``: the dict engine pre-flight and builds take."""
    return probe(root).tensorrt_env()


__all__ = [
    "GpuInfo",
    "HostFacts",
    "JetsonFacts",
    "dist_of",
    "find_trtexec",
    "gpu_free_bytes",
    "host_env",
    "nvml",
    "onnxruntime_providers",
    "probe",
    "read_cpu",
    "read_gpus",
    "read_jetson_identity",
    "read_under",
    "tensorrt_python",
    "tool_versions",
]
