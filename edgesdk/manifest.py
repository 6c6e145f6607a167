# SPDX-License-Identifier: Apache-2.0
"""The bundle manifest as dataclasses: what ``manifest.json`` holds, typed and checked.

``Manifest.from_dict`` is the only way a manifest is read: it checks every field's type (a malformed
manifest is :class:`~edgesdk.errors.BundleIntegrityError`, exit 7, naming the file and the field), the
``schema_version`` (a newer major version is refused with one line; older minors of the same major are
read), and the self-hash ``manifest_sha256`` over every other field, so a manifest edited after the
build (the pooling mode, the backend chain, the chat settings) is refused like a changed artifact.

Format builders fill a :class:`Manifest` (``ctx.manifest``); ``edgesdk/build.py`` completes it and
:func:`edgesdk.bundle.write_manifest` writes it. The JSON Schema ``edgesdk/data/manifest.schema.json``
documents the same layout (a test checks that the two agree); the runtime wheel does not need
``jsonschema``: these dataclasses are the validator.

Steering fields (what changes the runtime's behaviour) are typed: ``format``, ``precision``,
``runtime.backend_chain``, ``io``, ``embedding`` (pooling, normalize) and ``llm`` (context, offload,
threads, flash attention). Format-specific records that only describe the build stay JSON under
``extras``; all of it is covered by ``manifest_sha256``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any

from edgesdk.errors import BundleIntegrityError

SCHEMA = "edgesdk.bundle/1"
SCHEMA_VERSION = "1.0"
MANIFEST_MAJOR = 1
HASH_FIELD = "manifest_sha256"
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KiB; anything this big is not one of ours
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^(\d+)\.(\d+)$")
POOLING_MODES = ("mean", "cls")


class ManifestFieldError(Exception):
    """A field of the wrong type or value (``where`` is the dotted field name)."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


def _type_name(value: object) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _obj(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ManifestFieldError(where, f"expected an object, got {_type_name(data)}")
    return data


def _str(data: Any, where: str, *, optional: bool = False) -> Any:
    if data is None and optional:
        return None
    if not isinstance(data, str):
        raise ManifestFieldError(where, f"expected a string, got {_type_name(data)}")
    return data


def _int(data: Any, where: str, *, minimum: int | None = None, optional: bool = False) -> Any:
    if data is None and optional:
        return None
    if not isinstance(data, int) or isinstance(data, bool):
        raise ManifestFieldError(where, f"expected an integer, got {_type_name(data)}")
    if minimum is not None and data < minimum:
        raise ManifestFieldError(where, f"expected an integer >= {minimum}, got {data}")
    return data


def _bool(data: Any, where: str) -> bool:
    if not isinstance(data, bool):
        raise ManifestFieldError(where, f"expected a boolean, got {_type_name(data)}")
    return data


def _str_list(data: Any, where: str) -> list[str]:
    if not isinstance(data, list):
        raise ManifestFieldError(where, f"expected an array of strings, got {_type_name(data)}")
    return [_str(v, f"{where}[{i}]") for i, v in enumerate(data)]


def _obj_list(data: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(data, list):
        raise ManifestFieldError(where, f"expected an array of objects, got {_type_name(data)}")
    return [_obj(v, f"{where}[{i}]") for i, v in enumerate(data)]


def safe_relpath(rel: Any, where: str) -> str:
    """A bundle-relative POSIX path that stays inside the bundle (no absolute, ``..``, ``\\``, or empty)."""
    rel = _str(rel, where)
    p = PurePosixPath(rel)
    if not rel or rel.startswith("/") or "\\" in rel or ".." in p.parts or "\x00" in rel or str(p) in ("", "."):
        raise ManifestFieldError(where, f"artifact path escapes the bundle: {rel}")
    return str(p)


# --------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class Artifact:
    """One file of the bundle: bundle-relative path, role, sha256, size."""

    path: str
    role: str
    sha256: str
    bytes: int | None  # None: not recorded (the sha256 still decides)

    @classmethod
    def from_dict(cls, data: Any, where: str = "artifacts[]") -> Artifact:
        d = _obj(data, where)
        for key in ("path", "sha256"):
            if key not in d:
                raise ManifestFieldError(where, f"missing {key!r}")
        sha = _str(d["sha256"], f"{where}.sha256")
        if not _HEX64.match(sha):
            raise ManifestFieldError(f"{where}.sha256", "expected 64 lowercase hex digits")
        return cls(
            path=safe_relpath(d["path"], f"{where}.path"),
            role=_str(d.get("role", ""), f"{where}.role"),
            sha256=sha,
            bytes=_int(d.get("bytes"), f"{where}.bytes", minimum=0, optional=True),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "role": self.role, "sha256": self.sha256, "bytes": self.bytes}


@dataclass
class ModelInfo:
    """What was built: name and task (typed), the source's hash, and the inspected facts (``details``)."""

    name: str = ""
    task: str | None = None
    source_sha256: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str = "model") -> ModelInfo:
        d = dict(_obj(data, where))
        return cls(
            name=_str(d.pop("name", ""), f"{where}.name", optional=True) or "",
            task=_str(d.pop("task", None), f"{where}.task", optional=True),
            source_sha256=_str(d.pop("source_sha256", None), f"{where}.source_sha256", optional=True),
            details=d,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.details, "name": self.name, "task": self.task, "source_sha256": self.source_sha256}


@dataclass
class ProfileRef:
    """The device profile the bundle was built for."""

    name: str | None = None
    sha256: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> ProfileRef:
        d = _obj(data, where)
        return cls(
            name=_str(d.get("name"), f"{where}.name", optional=True),
            sha256=_str(d.get("sha256"), f"{where}.sha256", optional=True),
            summary=_obj(d.get("summary") or {}, f"{where}.summary"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "summary": self.summary}


@dataclass
class RuntimeInfo:
    """The backend chain the runtime walks, and the distributions it needs."""

    backend_chain: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any, where: str = "runtime") -> RuntimeInfo:
        d = _obj(data, where)
        return cls(
            backend_chain=_str_list(d.get("backend_chain") or [], f"{where}.backend_chain"),
            requires=_str_list(d.get("requires") or [], f"{where}.requires"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"backend_chain": list(self.backend_chain), "requires": list(self.requires)}


@dataclass
class EmbeddingConfig:
    """How a text encoder's token states become one vector (steers ``Session.embed``)."""

    pooling: str = "mean"
    normalize: bool = True

    @classmethod
    def from_dict(cls, data: Any, where: str = "extras.embedding") -> EmbeddingConfig:
        d = _obj(data, where)
        pooling = _str(d.get("pooling", "mean"), f"{where}.pooling")
        if pooling not in POOLING_MODES:
            raise ManifestFieldError(f"{where}.pooling", f"expected one of {', '.join(POOLING_MODES)}, got {pooling!r}")
        return cls(pooling=pooling, normalize=_bool(d.get("normalize", True), f"{where}.normalize"))

    def to_dict(self) -> dict[str, Any]:
        return {"pooling": self.pooling, "normalize": self.normalize}


@dataclass(frozen=True)
class DraftRecord:
    """``extras.llm.draft`` as the runtime reads it: the draft's file, its type, the plan's method for ``auto``
    (``draft`` or ``lookup``) and ``k``, the predicted gain and the greedy agreement measured at build (None where
    not recorded)."""

    file: str
    quant_type: str
    method: str
    k: int
    predicted_gain: float | None
    agreement: float | None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> DraftRecord:
        k = data.get("k")
        gain = data.get("predicted_gain")
        agree = data.get("agreement")
        share = agree.get("agreement") if isinstance(agree, Mapping) else None
        return cls(
            file=str(data.get("file") or "draft.gguf"),
            quant_type=str(data.get("quant_type") or ""),
            method=str(data.get("method") or "lookup"),
            k=k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 4,
            predicted_gain=float(gain) if isinstance(gain, int | float) and not isinstance(gain, bool) else None,
            agreement=float(share) if isinstance(share, int | float) and not isinstance(share, bool) else None,
        )


@dataclass
class LLMConfig:
    """llama.cpp settings the plan chose (steer the GGUF runtime); ``details`` describes the file."""

    n_ctx: int = 2048
    n_gpu_layers: int | str = 0  # an integer or "all"
    flash_attn: bool = False
    threads: int | str = "auto"  # an integer or "auto"
    quant_type: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, where: str = "extras.llm") -> LLMConfig:
        d = dict(_obj(data, where))
        ngl = d.pop("n_gpu_layers", 0)
        if ngl != "all":
            _int(ngl, f"{where}.n_gpu_layers", minimum=0)
        threads = d.pop("threads", "auto")
        if threads != "auto":
            _int(threads, f"{where}.threads", minimum=1)
        return cls(
            n_ctx=_int(d.pop("n_ctx", 2048), f"{where}.n_ctx", minimum=1),
            n_gpu_layers=ngl,
            flash_attn=_bool(d.pop("flash_attn", False), f"{where}.flash_attn"),
            threads=threads,
            quant_type=_str(d.pop("quant_type", ""), f"{where}.quant_type"),
            details=d,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
            "threads": self.threads,
            "quant_type": self.quant_type,
            **self.details,
        }

    # The planned settings and the model shape the llama.cpp runtime steers by (kept in ``details`` in the JSON).
    @property
    def layers(self) -> int:
        """Transformer layers of the GGUF (0: not recorded)."""
        value = self.details.get("layers")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    @property
    def thread_count(self) -> int | None:
        """The planned CPU threads, None for "auto"."""
        return self.threads if isinstance(self.threads, int) else None

    def planned(self, key: str) -> Any:
        """A planned llama.cpp setting recorded beside the typed ones: ``n_batch``, ``n_ubatch``, ``slots`` (the
        plan's ``serving.slots``), ``prefill_chunk`` (``serving.prefill_chunk``) (a positive integer) or ``type_k``,
        ``type_v`` (a ggml type name); None where the plan did not decide it (a bundle built before those
        decisions). The runtime checks the value and names the field when it is wrong."""
        if key not in ("n_batch", "n_ubatch", "type_k", "type_v", "slots", "prefill_chunk"):
            raise KeyError(key)
        return self.details.get(key)

    @property
    def draft(self) -> DraftRecord | None:
        """The draft model the bundle carries for speculative decoding (``edgesdk build --draft``); None where it has
        none."""
        value = self.details.get("draft")
        return DraftRecord.of(value) if isinstance(value, Mapping) else None

    def model_shape(self) -> dict[str, Any]:
        """The section as the llama.cpp backend's K/V cache and GPU-layer arithmetic reads it (layers, kv_heads,
        head_dim, file_bytes, the K/V cache types, ...): the JSON form, indexed, not steered by."""
        return self.to_dict()


@dataclass(frozen=True)
class PlannedShapeBuckets:
    """The planner's ``shape_buckets`` decision as the ONNX Runtime backend reads it back from a bundle:
    batch buckets (positive, sorted) and sequence buckets (None: no token axis was planned)."""

    batch: tuple[int, ...]
    seq: tuple[int, ...] | None


def _positive_ints(value: Any) -> tuple[int, ...] | None:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return tuple(sorted(set(value)))
    return None


def planned_shape_buckets(plan: Any) -> PlannedShapeBuckets | None:
    """The ``shape_buckets`` decision of a manifest's ``plan`` (None: no such decision, or no usable batch
    buckets: a bundle built before the decision existed, or whose profile had no CUDA EP)."""
    decisions = plan.get("decisions") if isinstance(plan, dict) else None
    value = next(
        (d.get("value") for d in decisions or [] if isinstance(d, dict) and d.get("key") == "shape_buckets"), None
    )
    batch = _positive_ints(value.get("batch")) if isinstance(value, dict) else None
    if batch is None:
        return None
    assert isinstance(value, dict)
    return PlannedShapeBuckets(batch=batch, seq=_positive_ints(value.get("seq")))


@dataclass(frozen=True)
class TorchFallbackInfo:
    """Why the ONNX export fell back to a torch program (``extras.torch_fallback``), for the backend's report."""

    reason: str | None = None
    forcing_ops: list[Any] = field(default_factory=list)
    built_on_host_ms_p50: Any = None

    @classmethod
    def from_extras(cls, data: Any) -> TorchFallbackInfo:
        d: dict[str, Any] = data if isinstance(data, dict) else {}
        cost: dict[str, Any] = d["cost"] if isinstance(d.get("cost"), dict) else {}
        here: dict[str, Any] = cost["measured_here"] if isinstance(cost.get("measured_here"), dict) else {}
        reason = d.get("reason")
        return cls(
            reason=_text(reason),
            forcing_ops=list(d.get("forcing_ops") or []),
            built_on_host_ms_p50=here.get("eager_ms_p50"),
        )


def _io(data: Any, where: str = "io") -> dict[str, Any]:
    d = _obj(data, where)
    for key in ("inputs", "outputs"):
        if key in d:
            for i, entry in enumerate(_obj_list(d[key], f"{where}.{key}")):
                _str(entry.get("name"), f"{where}.{key}[{i}].name")
    return d


# --------------------------------------------------------------------------------------------- manifest

# Top-level keys this version reads; any other key (a newer minor's addition) is kept in ``other``.
_KNOWN = (
    "schema",
    "schema_version",
    HASH_FIELD,
    "bundle_id",
    "created",
    "model",
    "profile",
    "format",
    "precision",
    "plan",
    "fallbacks",
    "artifacts",
    "runtime",
    "io",
    "parity",
    "license",
    "tools",
    "build",
    "extras",
)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ParityCheck:
    """One parity check a manifest's ``parity`` section records, typed for reports. ``kind``:

    - ``precision``: an ONNX/TensorRT output vs its reference at ``label`` (fp32, fp16, ...): ``min_cosine``,
      ``max_abs``, ``samples``, ``reference``, ``passed``;
    - ``logits``: HF logits vs the F16 GGUF decoder (GGUF and VLM): ``min_cosine``, ``top1``, ``positions``;
    - ``perplexity``: the quantized decoder's perplexity (``ppl``) and its ratio to ``reference``'s;
    - ``vision``: image features vs PyTorch (``min_cosine`` per image token, ``encoder``) and greedy tokens
      (``greedy_equal``, ``greedy_near_tie``: "k/n" images);
    - ``none``: no reference to compare with (``reference`` says why).
    """

    kind: str
    label: str = ""
    min_cosine: float | None = None
    max_abs: float | None = None
    samples: int | None = None
    reference: str | None = None
    passed: bool = True
    top1: float | None = None
    positions: int | None = None
    ppl: float | None = None
    ppl_ratio: float | None = None
    encoder: str | None = None
    greedy_equal: str | None = None
    greedy_near_tie: str | None = None


def parity_checks(parity: Mapping[str, Any]) -> list[ParityCheck]:
    """The checks of a manifest's ``parity`` section in the order the build summary prints them."""
    out: list[ParityCheck] = []
    for key, p in parity.items():
        if not isinstance(p, dict):
            continue
        if key in ("logits_vs_hf", "decoder_logits_vs_hf"):  # GGUF / VLM: HF logits vs the F16 conversion
            out.append(
                ParityCheck(
                    "logits",
                    min_cosine=_num(p.get("min_cosine")),
                    top1=_num(p.get("top1_agreement")),
                    positions=p.get("positions") if isinstance(p.get("positions"), int) else None,
                )
            )
        elif key == "vision":
            out.append(
                ParityCheck(
                    "vision",
                    min_cosine=_num(p.get("encoder_min_cosine")),
                    encoder=_text(p.get("encoder")),
                    greedy_equal=_text(p.get("greedy_equal")),
                    greedy_near_tie=_text(p.get("greedy_near_tie")),
                )
            )
        elif "min_cosine" in p:
            samples = p.get("samples")
            out.append(
                ParityCheck(
                    "precision",
                    label=key,
                    min_cosine=_num(p.get("min_cosine")),
                    max_abs=_num(p.get("max_abs")),
                    samples=samples if isinstance(samples, int) else None,
                    reference=None if p.get("reference") is None else str(p.get("reference")),
                    passed=bool(p.get("passed", True)),
                )
            )
    ppl, ratio = parity.get("ppl"), parity.get("ppl_ratio")
    if isinstance(ppl, dict) and ratio is not None:  # GGUF
        out.append(
            ParityCheck(
                "perplexity", ppl=_num(ppl.get("ppl")), ppl_ratio=_num(ratio), reference=_text(parity.get("reference"))
            )
        )
    elif isinstance(parity.get("decoder_ppl"), dict) and parity.get("decoder_ppl_ratio") is not None:  # VLM
        out.append(
            ParityCheck(
                "perplexity",
                ppl=_num(parity["decoder_ppl"].get("ppl")),
                ppl_ratio=_num(parity.get("decoder_ppl_ratio")),
                reference="F16 decoder",
            )
        )
    elif isinstance(parity.get("reference"), str) and parity["reference"].startswith("none"):
        out.append(ParityCheck("none", reference=parity["reference"]))
    return out


@dataclass
class Manifest:
    """``manifest.json``. Builders fill the steering fields; ``edgesdk/build.py`` the rest."""

    format: str = ""
    precision: str = ""
    bundle_id: str = ""
    created: str = ""
    model: ModelInfo = field(default_factory=ModelInfo)
    profile: ProfileRef = field(default_factory=ProfileRef)
    plan: dict[str, Any] = field(default_factory=dict)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    runtime: RuntimeInfo = field(default_factory=RuntimeInfo)
    io: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    license: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    embedding: EmbeddingConfig | None = None  # JSON: extras.embedding
    llm: LLMConfig | None = None  # JSON: extras.llm
    extras: dict[str, Any] = field(default_factory=dict)  # format-specific records (describe, never steer)
    schema_version: str = SCHEMA_VERSION
    manifest_sha256: str = ""  # over every other field; set by to_json()
    other: dict[str, Any] = field(default_factory=dict)  # top-level keys of a newer minor version

    # ------------------------------------------------------------------ queries (typed: what the runtime steers by)
    def embed_max_batch(self, precision: str) -> int | None:
        """The largest ``embed()`` batch whose parity the build measured to hold at ``precision``
        (``parity.<precision>.padded.embed_max_batch``), None where the build did not measure it."""
        entry = self.parity.get(precision)
        padded = entry.get("padded") if isinstance(entry, dict) else None
        value = padded.get("embed_max_batch") if isinstance(padded, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    @property
    def shape_buckets(self) -> PlannedShapeBuckets | None:
        """The planner's CUDA-graph shape buckets (:func:`planned_shape_buckets`)."""
        return planned_shape_buckets(self.plan)

    def io_entries(self, kind: str) -> list[dict[str, Any]]:
        """``io.inputs`` or ``io.outputs`` (each ``{"name", "dtype", "shape"}``, names checked when read)."""
        if kind not in ("inputs", "outputs"):
            raise KeyError(kind)
        entries = self.io.get(kind) or []
        return [e for e in entries if isinstance(e, dict)]

    def _extras_section(self, name: str) -> dict[str, Any]:
        section = self.extras.get(name)
        return section if isinstance(section, dict) else {}

    @property
    def vlm_image_size(self) -> Any:
        """The vision encoder's input size (``extras.vlm.image_size``; None where not recorded)."""
        return self._extras_section("vlm").get("image_size")

    @property
    def vlm_image_tokens(self) -> int | None:
        """Image tokens per encoder frame (``extras.vlm.image_tokens``; for a dynamic-resolution family the most one
        image becomes); None where not recorded or not a positive integer."""
        n = self._extras_section("vlm").get("image_tokens")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    @property
    def vlm_family(self) -> str | None:
        """The VLM family record the bundle was built with (``extras.vlm.mmproj.family``; None where not recorded)."""
        mmproj = self._extras_section("vlm").get("mmproj")
        family = mmproj.get("family") if isinstance(mmproj, dict) else None
        return family if isinstance(family, str) else None

    @property
    def mmproj_encodes(self) -> bool:
        """False for a class-token (CLIP) tower, whose mmproj only tokenizes image chunks
        (``extras.vlm.mmproj.encodes``); True otherwise, as bundles before the field."""
        mmproj = self._extras_section("vlm").get("mmproj")
        return not (isinstance(mmproj, dict) and mmproj.get("encodes", True) is False)

    @property
    def torch_fallback(self) -> TorchFallbackInfo:
        return TorchFallbackInfo.from_extras(self.extras.get("torch_fallback"))

    def tensorrt_planned(self) -> tuple[Any, Any]:
        """What the build found for the TensorRT engine: the capability summary and the precision report's
        explanation (``extras.tensorrt``), for the backend's report."""
        trt = self._extras_section("tensorrt")
        prec = trt.get("precision_report")
        return trt.get("capability"), prec.get("explanation") if isinstance(prec, dict) else None

    def serve_table(self) -> tuple[Any, str]:
        """The bundle's ``serve`` limits table and where it came from: the manifest's top level (a key this
        schema keeps in ``other``), else the profile summary's (None where neither has one)."""
        table = self.other.get("serve")
        if table is not None and table != {}:
            return table, "serve"
        return self.profile.summary.get("serve"), "profile.summary.serve"

    def parity_checks(self) -> list[ParityCheck]:
        """The parity checks this manifest records, typed (:func:`parity_checks`): the build summary's lines."""
        return parity_checks(self.parity)

    @property
    def license_verdict(self) -> str | None:
        """The license gate's verdict at build (``license.verdict``), None where not recorded."""
        verdict = self.license.get("verdict")
        return _text(verdict)

    @property
    def sbom_path(self) -> str | None:
        """The bundle path of the SBOM the license section names (``license.sbom``), None where not recorded."""
        return _text(self.license.get("sbom"))

    def device_facts(self) -> dict[str, str]:
        """The profile summary's device facts (``sm``, ``jetpack``, ``l4t``, ``kind``, ``arch``) that are recorded,
        as text: what a registry annotates the bundle with (:mod:`edgesdk.distribution`)."""
        summary = self.profile.summary if isinstance(self.profile.summary, dict) else {}
        out = {}
        for key in ("sm", "jetpack", "l4t", "kind", "arch"):
            value = summary.get(key)
            if value not in (None, "", [], {}):
                out[key] = str(value)
        return out

    def artifacts_with(self, role: str | None = None) -> list[Artifact]:
        return [a for a in self.artifacts if role is None or a.role == role]

    def artifact(self, rel: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.path == rel), None)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        extras = dict(self.extras)
        if self.embedding is not None:
            extras["embedding"] = self.embedding.to_dict()
        if self.llm is not None:
            extras["llm"] = self.llm.to_dict()
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "schema_version": self.schema_version,
            "bundle_id": self.bundle_id,
            "created": self.created,
            "model": self.model.to_dict(),
            "profile": self.profile.to_dict(),
            "format": self.format,
            "precision": self.precision,
            "plan": self.plan,
            "fallbacks": self.fallbacks,
            "artifacts": [a.to_dict() for a in sorted(self.artifacts, key=lambda a: a.path)],
            "runtime": self.runtime.to_dict(),
            "io": self.io,
            "parity": self.parity,
            "license": self.license,
            "tools": self.tools,
            "build": self.build,
            "extras": extras,
            **self.other,
        }
        return d

    def to_json(self) -> str:
        """The file's text, with ``manifest_sha256`` computed over everything else."""
        body = json.loads(json.dumps(self.to_dict(), default=str))  # tuples -> lists, paths -> str
        body[HASH_FIELD] = self.manifest_sha256 = content_hash(body)
        return json.dumps(body, indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = "manifest.json") -> Manifest:
        """Check and read a parsed manifest; every problem is one BundleIntegrityError naming ``where``."""
        try:
            return cls._from_dict(data)
        except ManifestFieldError as exc:
            raise BundleIntegrityError(
                f"{where}: invalid manifest: {exc}", hint="the bundle was damaged or edited; rebuild it"
            ) from None
        except RecursionError:
            raise BundleIntegrityError(f"{where}: invalid manifest: nested too deeply") from None

    @classmethod
    def from_layout(cls, data: Mapping[str, Any]) -> Manifest:
        """A manifest given as its JSON layout (a dict: tests and tools write one): ``schema`` set,
        ``schema_version`` filled in where missing, :class:`Artifact` objects taken in ``artifacts``, a
        placeholder ``manifest_sha256`` (:meth:`to_json` computes the real one), then checked like a read one."""
        d = dict(data)
        d["artifacts"] = [a.to_dict() if isinstance(a, Artifact) else a for a in d.get("artifacts") or []]
        d.update(schema=SCHEMA, schema_version=d.get("schema_version", SCHEMA_VERSION))
        d[HASH_FIELD] = "0" * 64
        return cls.from_dict(json.loads(json.dumps(d, default=str)), "manifest")

    @classmethod
    def _from_dict(cls, data: Any) -> Manifest:
        d = _obj(data, "manifest")
        if d.get("schema") != SCHEMA:
            raise ManifestFieldError("schema", f"unknown manifest schema {d.get('schema')!r} (expected {SCHEMA})")
        check_version(d.get("schema_version"))
        extras = dict(_obj(d.get("extras") or {}, "extras"))
        emb, llm = extras.pop("embedding", None), extras.pop("llm", None)
        artifacts = [
            Artifact.from_dict(a, f"artifacts[{i}]") for i, a in enumerate(_list(d.get("artifacts"), "artifacts"))
        ]
        seen: set[str] = set()
        for a in artifacts:
            if a.path in seen or a.path == "manifest.json":
                raise ManifestFieldError("artifacts", f"{a.path} listed twice (or is the manifest itself)")
            seen.add(a.path)
        if HASH_FIELD not in d:
            raise ManifestFieldError(HASH_FIELD, "missing (every manifest of schema 1.x carries its own hash)")
        sha = _str(d[HASH_FIELD], HASH_FIELD)
        return cls(
            format=_str(d.get("format", ""), "format"),
            precision=_str(d.get("precision") or "", "precision"),
            bundle_id=_str(d.get("bundle_id", ""), "bundle_id"),
            created=_str(d.get("created", ""), "created"),
            model=ModelInfo.from_dict(d.get("model") or {}),
            profile=ProfileRef.from_dict(d.get("profile") or {}),
            plan=_obj(d.get("plan") or {}, "plan"),
            fallbacks=_obj_list(d.get("fallbacks") or [], "fallbacks"),
            artifacts=artifacts,
            runtime=RuntimeInfo.from_dict(d.get("runtime") or {}),
            io=_io(d.get("io") or {}),
            parity=_obj(d.get("parity") or {}, "parity"),
            license=_obj(d.get("license") or {}, "license"),
            tools=_obj(d.get("tools") or {}, "tools"),
            build=_obj(d.get("build") or {}, "build"),
            embedding=EmbeddingConfig.from_dict(emb) if emb is not None else None,
            llm=LLMConfig.from_dict(llm) if llm is not None else None,
            extras=extras,
            schema_version=d["schema_version"],
            manifest_sha256=sha,
            other={k: v for k, v in d.items() if k not in _KNOWN},
        )


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise ManifestFieldError(where, f"expected an array, got {_type_name(data)}" if data is not None else "missing")
    return data


def check_version(version: Any) -> None:
    """Accept ``1.x`` (older or newer minors); refuse a missing version, a newer major, or nonsense."""
    if version is None:
        raise ManifestFieldError(
            "schema_version",
            "missing (the bundle was written by an edgesdk older than "
            "manifest schema 1.0, before manifests were hashed): rebuild the bundle",
        )
    m = _VERSION.match(version) if isinstance(version, str) else None
    if m is None:
        raise ManifestFieldError("schema_version", f'expected "MAJOR.MINOR", got {version!r}')
    major = int(m.group(1))
    if major > MANIFEST_MAJOR:
        raise ManifestFieldError(
            "schema_version",
            f"{version} is newer than this edgesdk reads ({MANIFEST_MAJOR}.x): upgrade edgesdk to load this bundle",
        )
    if major < MANIFEST_MAJOR:
        raise ManifestFieldError("schema_version", f"{version} is older than {MANIFEST_MAJOR}.x: rebuild the bundle")


def content_hash(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, compact) of ``body`` without ``manifest_sha256``."""
    rest = {k: v for k, v in body.items() if k != HASH_FIELD}
    canon = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def parse_manifest(text: bytes, where: str) -> Manifest:
    """Bytes of ``manifest.json`` -> a checked :class:`Manifest` whose self-hash matches (else exit 7)."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise BundleIntegrityError(f"{where}: manifest is {len(text)} bytes (limit {MAX_MANIFEST_BYTES})")
    try:
        data = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BundleIntegrityError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise BundleIntegrityError(f"{where}: not valid JSON (nested too deeply)") from None
    manifest = Manifest.from_dict(data, where)
    try:
        actual = content_hash(data)
    except (RecursionError, ValueError) as exc:
        raise BundleIntegrityError(f"{where}: manifest cannot be hashed ({exc})") from None
    if actual != manifest.manifest_sha256:
        raise BundleIntegrityError(
            f"{where}: manifest_sha256 mismatch (the manifest was edited after the build)", hint="rebuild the bundle"
        )
    return manifest


# --------------------------------------------------------------------------------------------- as found
# `edgesdk check licenses BUNDLE` and `build --force` read a manifest as it is on disk, without checks or
# its self-hash, so that a damaged or edited bundle is still scanned (or recognised): these readers never
# raise; a missing key or one of another type reads as "not recorded".


def license_section(data: Any) -> dict[str, Any]:
    """The license gate's section of a manifest as found (what ``GateResult.to_manifest`` wrote, ``license``
    in a manifest of this version): the first object, depth-first from the top, whose
    ``runtime_distributions`` is an array of strings; ``{}`` where there is none."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            value = node.get("runtime_distributions")
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return {}


def component_table(extras: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Bundle path -> the components a format's ``extras.<format>.components`` mapping puts in that file
    (``{"vision_encoder": {"artifact": "mmproj.gguf"}, ...}``), in the format's order, each name once.
    Sections, mappings and entries that are not objects, and artifacts that are not non-empty strings, are
    skipped."""
    table: dict[str, list[str]] = {}
    for section in (extras or {}).values():
        comps = section.get("components") if isinstance(section, Mapping) else None
        if not isinstance(comps, Mapping):
            continue
        for name, spec in comps.items():
            artifact = spec.get("artifact") if isinstance(spec, Mapping) else None
            if isinstance(artifact, str) and artifact:
                names = table.setdefault(artifact, [])
                if str(name) not in names:
                    names.append(str(name))
    return table


@dataclass(frozen=True)
class ArtifactRecord:
    """One ``artifacts[]`` entry as found: ``path`` None where missing or not a string; ``role`` "" where
    missing or empty (``str()`` of anything else that is not a string)."""

    path: str | None
    role: str

    @classmethod
    def of(cls, entry: Any) -> ArtifactRecord:
        """From a JSON object, or from anything with ``path`` and ``role`` (an :class:`Artifact`)."""
        if isinstance(entry, Mapping):
            path, role = entry.get("path"), entry.get("role")
        else:
            path, role = entry.path, entry.role
        return cls(path=path if isinstance(path, str) else None, role=str(role) if role else "")


@dataclass(frozen=True)
class LicenseRecord:
    """What the license gate recorded at build time (:func:`license_section`), typed."""

    runtime_distributions: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)  # --accept-license at build: the array's strings
    model_license_declared: str | None = None  # --model-license at build; None where missing or empty

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> LicenseRecord:
        dists, accepted, declared = (
            section.get("runtime_distributions"),
            section.get("accepted"),
            section.get("model_license_declared"),
        )
        return cls(
            runtime_distributions=[d for d in dists if isinstance(d, str)] if isinstance(dists, list) else [],
            accepted=[a for a in accepted if isinstance(a, str)] if isinstance(accepted, list) else [],
            model_license_declared=declared if isinstance(declared, str) and declared else None,
        )


@dataclass(frozen=True)
class LenientManifest:
    """A ``manifest.json`` as found (parsed JSON, not checked, self-hash not compared): the fields that
    ``check licenses`` and ``build --force`` read, typed. Anything missing or of another type reads as
    not recorded (None, empty); a document that is not an object reads as all of them unrecorded, except
    ``license``, searched for wherever it is (:func:`license_section`)."""

    schema: str | None = None
    artifacts: list[ArtifactRecord] = field(default_factory=list)  # the entries that are objects
    extras: dict[str, Any] = field(default_factory=dict)
    model_source: str | None = None  # model.source: the file the bundle was built from
    license: LicenseRecord = field(default_factory=LicenseRecord)

    @classmethod
    def from_json(cls, data: Any) -> LenientManifest:
        lic = LicenseRecord.from_section(license_section(data))
        if not isinstance(data, dict):
            return cls(license=lic)
        schema, artifacts, extras, model = (data.get(k) for k in ("schema", "artifacts", "extras", "model"))
        source = model.get("source") if isinstance(model, dict) else None
        entries = artifacts if isinstance(artifacts, list) else []
        return cls(
            schema=_text(schema),
            artifacts=[ArtifactRecord.of(a) for a in entries if isinstance(a, dict)],
            extras=extras if isinstance(extras, dict) else {},
            model_source=_text(source),
            license=lic,
        )


def manifest_field_names() -> list[str]:
    """Top-level JSON keys a manifest of this version writes (the schema test compares them)."""
    names = [f.name for f in fields(Manifest) if f.name not in ("embedding", "llm", "other")]
    return sorted([*names, "schema"])


def json_schema() -> dict[str, Any]:
    """The shipped JSON Schema of this manifest version (``edgesdk/data/manifest.schema.json``)."""
    from edgesdk.resources import read_data_text

    schema: dict[str, Any] = json.loads(read_data_text("manifest.schema.json"))
    return schema
