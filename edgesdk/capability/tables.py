# SPDX-License-Identifier: Apache-2.0
"""Capability data (edgesdk/data/capability/*.yaml): loaded once, validated, queried by version.

Every entry in the data carries a ``source`` naming a key of the file's ``sources`` mapping (or a
literal citation): a support claim the report makes can always be traced to a document.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import yaml

from edgesdk.errors import InputError
from edgesdk.resources import data_file

DATA_DIR = data_file("capability")
CHECK_KINDS = ("const_input", "zero_input", "no_output", "attr_in", "attr_not_contains", "spatial_rank", "static_shape")


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'10.3' -> (10, 3); '8.6.2' -> (8, 6, 2); None or junk -> ()."""
    out: list[int] = []
    for part in str(text or "").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def _load(name: str) -> dict:
    path = DATA_DIR / name
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"capability data {path}: cannot load ({exc})") from exc
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise InputError(f"capability data {path}: expected a mapping with schema: 1")
    return data


def _validate_checks(checks: Any, where: str) -> None:
    if not isinstance(checks, list):
        raise InputError(f"capability data {where}.checks: expected a list")
    for i, c in enumerate(checks):
        if not isinstance(c, dict) or c.get("kind") not in CHECK_KINDS or not isinstance(c.get("reason"), str):
            raise InputError(
                f"capability data {where}.checks[{i}]: expected {{kind: one of {', '.join(CHECK_KINDS)}, "
                "reason: string, ...}}"
            )


def _validate_trt(data: dict) -> None:
    sources = data.get("sources") or {}
    for op, e in (data.get("ops") or {}).items():
        where = f"tensorrt_onnx_ops.yaml ops.{op}"
        if not isinstance(e, dict) or not version_tuple(e.get("since")):
            raise InputError(f"capability data {where}.since: expected a version string")
        for src in str(e.get("source", "")).split("+"):
            if src not in sources:
                raise InputError(f"capability data {where}.source: {src!r} is not a key of sources")
        if "checks" in e:
            _validate_checks(e["checks"], where)


@functools.cache
def tensorrt_table() -> dict:
    data = _load("tensorrt_onnx_ops.yaml")
    _validate_trt(data)
    return data


@functools.cache
def dla_table() -> dict:
    data = _load("dla.yaml")
    for key in ("rules", "native", "build_time", "reconstruction"):
        if key not in data:
            raise InputError(f"capability data dla.yaml: missing {key}")
    for op, checks in (data.get("checks") or {}).items():
        _validate_checks(checks, f"dla.yaml checks.{op}")
    return data


@functools.cache
def kernel_table() -> dict:
    return _load("kernels.yaml")


def eager_cost_estimate(precision: str = "fp32") -> dict[str, Any]:
    """What running eagerly costs vs compiled / compiled+CUDA graphs, scaled from the one measurement in
    the kernel table (its ``eager_cost`` entry names the device, model and source). An estimate for other
    devices/models: small models at batch 1 are launch-bound everywhere, large ones much less so."""
    table = kernel_table()
    data = table["eager_cost"]
    key = "fp16_ms" if precision in ("fp16", "bf16") else "fp32_ms"
    ms = data[key]
    return {
        "measured_on": data["device"],
        "model": data["model"],
        "source": table["sources"].get(data["source"], data["source"]),
        "precision": key[:4],
        "eager_ms": ms["eager"],
        "compile_ms": ms["compile"],
        "compile_cuda_graphs_ms": ms["compile_cuda_graphs"],
        "eager_vs_compile": round(ms["eager"] / ms["compile"], 2),
        "eager_vs_compile_cuda_graphs": round(ms["eager"] / ms["compile_cuda_graphs"], 2),
    }


@dataclass(frozen=True)
class TrtOpSupport:
    supported: bool
    reason: str
    types: tuple[str, ...] = ()
    checks: tuple[dict, ...] = ()
    limits: str = ""
    source: str = ""


def tensorrt_op(op_type: str, trt_version: str | None, domain: str = "") -> TrtOpSupport:
    """What the TensorRT ONNX parser of ``trt_version`` documents for ``op_type`` (default domain only)."""
    table = tensorrt_table()
    if domain not in ("", "ai.onnx"):
        return TrtOpSupport(
            False,
            f"custom-domain op {domain}::{op_type}: TensorRT parses it only through a registered plugin of that name",
        )
    entry = table["ops"].get(op_type)
    want = version_tuple(trt_version)
    if entry is None:
        if op_type in table.get("unsupported", {}):
            return TrtOpSupport(
                False,
                f"op not supported by the TensorRT {trt_version} ONNX parser",
                source=table["unsupported"][op_type],
            )
        return TrtOpSupport(False, f"op not in the TensorRT {trt_version} operator table")
    since = entry["since"]
    if want and want < version_tuple(since):
        return TrtOpSupport(
            False,
            f"op not in the TensorRT {trt_version} operator table (first documented in {since})",
            source=entry["source"],
        )
    types = entry.get("types_8") if want and want[0] < 9 else entry.get("types_10")
    limits = entry.get("limits_8") if want and want[0] < 9 else entry.get("limits_10")
    active = tuple(
        c for c in entry.get("checks", []) if not (c.get("until") and want and want >= version_tuple(c["until"]))
    )
    return TrtOpSupport(
        True,
        "in the operator table",
        tuple(types or entry.get("types_10") or ()),
        active,
        limits or "",
        entry["source"],
    )


def tensorrt_opset_max(trt_version: str) -> tuple[int | None, str]:
    """Highest ONNX opset the parser documents for this version (same major only), with its source."""
    want = version_tuple(trt_version)
    best: tuple[tuple[int, ...], dict] | None = None
    for ver, fig in (tensorrt_table().get("opset_max") or {}).items():
        v = version_tuple(ver)
        if want and v[0] == want[0] and v <= want and (best is None or v > best[0]):
            best = (v, fig)
    if best is None:
        return None, "no documented opset limit for this TensorRT version"
    return int(best[1]["value"]), str(best[1]["source"])


def dla_available(trt_version: str) -> tuple[bool, str]:
    """TensorRT 10.8 .. 11.4.0 dropped DLA; JetPack 6 (TensorRT 8.6/10.3) has it."""
    rule = dla_table()["rules"]["tensorrt_last_with_dla"]
    v = version_tuple(trt_version)
    if v and version_tuple(rule["value"]) < v[:2] < (11, 4):
        return False, f"TensorRT {trt_version} has no DLA support (last release with DLA: {rule['value']})"
    return True, ""


def zero_checked_inputs() -> set[tuple[str, int]]:
    """(op type, input index) of every ``zero_input`` check in the TensorRT and DLA tables, any version: the
    constants whose values the checks read (inspect records which of them are all zeros)."""
    out: set[tuple[str, int]] = set()
    entries = [(op, e.get("checks") or []) for op, e in tensorrt_table()["ops"].items()]
    entries += list((dla_table().get("checks") or {}).items())
    for op, checks in entries:
        out.update((op, int(c["index"])) for c in checks if c.get("kind") == "zero_input")
    return out


def dla_native_ops(trt_version: str) -> tuple[frozenset[str], str]:
    """DLA-native op list for the newest table at or below ``trt_version`` (with which table was used)."""
    native = dla_table()["native"]
    want = version_tuple(trt_version) or (99,)
    candidates = sorted((version_tuple(v), v) for v in native)
    chosen = candidates[0][1]
    for vt, v in candidates:
        if vt <= want:
            chosen = v
    entry = native[chosen]
    return frozenset(entry["ops"]), f"DLA table for TensorRT {chosen} ({entry['source']})"


def kernel_feature(
    feature: str, sm: str | None, arch: str | None = None, platform: str | None = None
) -> tuple[bool, bool, str]:
    """(supported, recommended, source) of a fast-path kernel feature for a bare SM/arch/platform."""
    spec = kernel_table()["features"].get(feature)
    if spec is None:
        raise InputError(f"unknown kernel feature {feature!r}")
    if not sm:
        return False, False, "no CUDA device"
    smv = version_tuple(sm)
    ok = smv >= version_tuple(spec.get("min_sm", "0"))
    ok = ok and sm not in spec.get("excluded_sm", []) and (arch or "") not in spec.get("excluded_arch", [])
    recommended = ok and (platform or "") not in spec.get("not_recommended_platforms", [])
    return ok, recommended, spec["source"]
