# SPDX-License-Identifier: Apache-2.0
"""The VLM plan: a vision-language model as three components, each with its own format and precision.

* vision encoder + projector -> one F16 ``mmproj`` GGUF for llama.cpp's multimodal library. F16, not
  the decoder's type: quantizing a vision encoder degrades its features far more than a decoder's
  text quality (the survey behind issue 15: FP16 encoder + 4-bit decoder kept BLEU-4 at 30.6 vs 32.1
  all-FP16, while quantized encoders "collapse" visual features), and the encoder is a small share
  of the weights, so 4 bits there would save little memory.
* language decoder -> the GGUF planner's memory-driven quantization type (the profile's
  ``policy.llm.quant_order``), context, offload, flash attention and threads, computed on the
  decoder's own parameters.
* memory: decoder weights + KV + compute (as the GGUF plan) + encoder weights at F16 + the encoder's
  activations for one image, against the profile's budget.
Pure: reads the facts and the profile only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from edgesdk.contracts.gguf_types import kv_bytes
from edgesdk.errors import InputError, ModelError, ResourceError
from edgesdk.formats.gguf.plan import GB, GgufPlan, _gb, compute_bytes, plan_gguf
from edgesdk.types import BuildOptions, Decision, JSONable, JSONValue, ModelFacts, PlanSection

if TYPE_CHECKING:
    from edgesdk.formats.vlm.families import VLMFamily
    from edgesdk.profiles import Profile

ENCODER_MIN_COSINE = 0.999  # F16 mmproj image features vs the PyTorch (FP32) encoder + projector
GREEDY_TOKENS = 8  # end to end: first greedy tokens of the F16 build equal to PyTorch's
VISION_RUNTIMES = ("auto", "onnx", "gguf")
_FAST_EPS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@dataclass
class VisionRuntime(JSONable):
    """Where the vision encoder runs (``vlm.vision_runtime``): libmtmd's F16 mmproj only, or also an FP16 ONNX
    graph for ONNX Runtime on ``providers`` (``required``: a class-token tower, whose mmproj does not encode)."""

    runtime: str  # "gguf-mmproj" | "onnx"
    onnx: bool
    precision: str | None = None
    required: bool | None = None
    providers: list[str] | None = None

    def to_json(self) -> JSONValue:
        out: dict[str, JSONValue] = {"runtime": self.runtime, "onnx": self.onnx}
        if self.precision is not None:
            out["precision"] = self.precision
        if self.required is not None:
            out["required"] = self.required
        if self.providers is not None:
            out["providers"] = list(self.providers)
        return out

    @classmethod
    def from_json(cls, value: JSONValue) -> VisionRuntime:
        assert isinstance(value, dict)
        providers, precision, required = value.get("providers"), value.get("precision"), value.get("required")
        return cls(
            runtime=str(value["runtime"]),
            onnx=value.get("onnx") is True,
            precision=str(precision) if precision is not None else None,
            required=bool(required) if required is not None else None,
            providers=[str(p) for p in providers] if isinstance(providers, list) else None,
        )


@dataclass
class VlmPlan(GgufPlan):
    """The VLM format's decisions: the decoder's (:class:`GgufPlan`, its parity replaced by the components'),
    the vision encoder's, and the memory of all three components."""

    components: list[str] = field(default_factory=list)
    encoder: dict[str, JSONValue] = field(default_factory=dict)  # format, precision, runtime of encoder + projector
    vision_runtime: VisionRuntime | None = None
    memory_gb: float = 0.0
    image_prefix_reuse: bool = False

    FIELDS: ClassVar[dict[str, str]] = {
        **GgufPlan.FIELDS,
        "vlm.components": "components",
        "vlm.encoder": "encoder",
        "vlm.vision_runtime": "vision_runtime",
        "vlm.memory": "memory_gb",
        "vlm.image_prefix_reuse": "image_prefix_reuse",
    }
    PARSE: ClassVar[dict[str, object]] = {**GgufPlan.PARSE, "vision_runtime": VisionRuntime.from_json}

    @property
    def onnx_encoder(self) -> bool:
        """Whether the bundle also gets the FP16 ONNX vision encoder."""
        return self.vision_runtime is not None and self.vision_runtime.onnx


def vlm_section(section: PlanSection) -> VlmPlan:
    """``section`` as a :class:`VlmPlan` (typing the decisions of a plan made elsewhere)."""
    return section if isinstance(section, VlmPlan) else VlmPlan.from_decisions(section.decisions())


def _wants_onnx(decision: Decision) -> bool:
    return isinstance(decision.value, dict) and decision.value.get("onnx") is True


def vision_runtime(profile: Profile, options: BuildOptions, params: int) -> Decision:
    """Whether the bundle also gets the encoder + projector as an FP16 ONNX graph (for ONNX Runtime's
    TensorRT / CUDA providers), decided from the profile's execution providers; ``--vision-runtime``
    overrides. The F16 mmproj is built either way (libmtmd tokenizes image chunks with it, and it is
    the fallback where no fast provider initialises)."""
    asked = (getattr(options, "vision_runtime", None) or "auto").lower()
    if asked not in VISION_RUNTIMES:
        raise InputError(f"--vision-runtime must be one of {', '.join(VISION_RUNTIMES)}, got {asked!r}")
    eps = [ep for ep in profile.execution_providers if ep in _FAST_EPS]
    size = f"{params:,} params x 2 B = {_gb(params * 2)}"
    if asked == "gguf" or (asked == "auto" and not eps):
        why = (
            "--vision-runtime gguf"
            if asked == "gguf"
            else f"profile {profile.name} lists no TensorRT/CUDA execution provider"
        )
        return Decision(
            "vlm.vision_runtime",
            {"runtime": "gguf-mmproj", "onnx": False},
            f"{why}: the encoder runs in llama.cpp's libmtmd from the F16 mmproj only (no ONNX graph "
            f"built: without a GPU provider it would be a second copy of the encoder weights that "
            f"only the CPU could run)",
        )
    names = {"TensorrtExecutionProvider": "TensorRT", "CUDAExecutionProvider": "CUDA"}
    why = (
        f"profile {profile.name} has {' and '.join(names[e] for e in eps)}"
        if asked == "auto"
        else "--vision-runtime onnx"
    )
    return Decision(
        "vlm.vision_runtime",
        {"runtime": "onnx", "onnx": True, "precision": "FP16", "providers": eps or ["CPUExecutionProvider"]},
        f"{why}: encoder + projector also exported as one static-shape FP16 ONNX graph ({size}) for "
        f"ONNX Runtime (TensorRT > CUDA, chosen at load; the CPU only when asked); the F16 mmproj "
        f"stays (libmtmd tokenizes image chunks with it) and is the fallback when no fast provider "
        f"initialises",
    )


def decoder_facts(facts: ModelFacts) -> ModelFacts:
    """The language decoder as the GGUF planner sees a HF causal LM."""
    params = int((facts.extra.get("component_params") or {}).get("decoder") or 0)
    out = copy.deepcopy(facts)
    out.task, out.params = "text-generation", params or None
    from edgesdk.formats.vlm.families import by_name

    text_arch = by_name(facts.extra.get("family") or "llava").text_architecture
    out.extra = {**facts.extra, "architecture": f"{text_arch} (language_model of {facts.extra.get('architecture')})"}
    return out


def plan_vlm(facts: ModelFacts, profile: Profile, options: BuildOptions) -> VlmPlan:
    return VlmPlan.from_decisions(_vlm_decisions(facts, profile, options))


def _vlm_decisions(facts: ModelFacts, profile: Profile, options: BuildOptions) -> list[Decision]:
    from edgesdk.formats.vlm.convert import CLASS_TOKEN_VISION
    from edgesdk.formats.vlm.families import by_name

    info = facts.extra
    vt = info.get("vision_model_type")
    fam = by_name(info.get("family") or "llava")
    class_token = vt in CLASS_TOKEN_VISION and vt in fam.vision_model_types
    if vt not in fam.vision_model_types:
        raise ModelError(
            f"{facts.source}: vision tower {vt!r} is not supported for the {fam.name} family "
            f"(supported: {', '.join(sorted(fam.vision_model_types))})"
        )
    projector = fam.projector(info)
    if not info.get("preprocessor"):
        raise ModelError(
            f"{facts.source}: no image processor (preprocessor_config.json, or processor_config.json's "
            "image_processor with transformers 5): image size, mean/std come from it",
            hint="save the processor next to the weights with processor.save_pretrained()",
        )
    cp = info.get("component_params") or {}
    enc, proj, dec = int(cp.get("vision_encoder", 0)), int(cp.get("projector", 0)), int(cp.get("decoder", 0))
    if not (enc and proj and dec):
        raise ModelError(
            f"{facts.source}: cannot find the three components in the weights "
            f"(vision encoder {enc:,}, projector {proj:,}, decoder {dec:,} params)"
        )
    frames = info.get("max_frames")
    dynamic = bool(info.get("dynamic_resolution"))
    size_note = "dynamic resolution" if dynamic else f"{info.get('image_size')} px"
    tokens_note = (
        f"up to {info.get('image_tokens')} image tokens per image, by its size"
        if dynamic
        else f"{info.get('image_tokens')} image tokens"
    )
    frames_note = (
        f" per frame; image splitting: up to {frames - 1} tiles + 1 global frame per image, "
        f"{(frames or 0) * int(info.get('image_tokens') or 0)} image tokens"
        if info.get("image_splitting") and frames
        else ""
    )
    out = [
        Decision(
            "vlm.components",
            ["vision encoder", "projector", "language decoder"],
            f"{info.get('architecture')}: {vt} encoder {enc:,} params ({size_note}, "
            f"patch {info.get('patch_size')} -> {tokens_note}"
            f"{frames_note}), {projector} "
            f"{proj:,} params, {info.get('text_model_type')} decoder {dec:,} params",
        )
    ]
    mm_bytes = (proj if class_token else enc + proj) * 2  # a class-token tower's mmproj holds the projector only
    out.append(_encoder_decision(class_token, enc + proj, dec, mm_bytes))
    vr = _vision_runtime_decision(facts, profile, options, fam, class_token, enc + proj)
    out.append(vr)
    onnx_bytes = (enc + proj) * 2 if _wants_onnx(vr) else 0  # encoder + projector in FP16
    decoder = plan_gguf(decoder_facts(facts), profile, options)
    quant, n_ctx = decoder.quant_type, decoder.context_length
    out += [d for d in decoder.decisions() if d.key != "parity"]
    out.append(_memory_decision(facts, profile, dec, quant, n_ctx, mm_bytes, onnx_bytes))
    out.append(
        Decision(
            "vlm.image_prefix_reuse",
            True,
            "image features cached per (image sha256, mmproj sha256): a second question about the same "
            "image skips the encoder; the decoder's KV prefix up to the end of the image is kept",
        )
    )
    out.append(_parity_decision(class_token, bool(onnx_bytes)))
    return out


def _memory_decision(
    facts: ModelFacts, profile: Profile, dec: int, quant: str, n_ctx: int, mm_bytes: int, onnx_bytes: int
) -> Decision:
    """vlm.memory: the decoder's weights at ``quant``, its KV cache at ``n_ctx`` and compute buffer, the mmproj,
    one image's encoder activations and the ONNX encoder, against the profile's budget (ResourceError over it)."""
    from edgesdk.contracts.gguf_types import BPW

    info = facts.extra
    dec_w = dec * BPW[quant] / 8
    kv = kv_bytes(info, n_ctx)
    comp = compute_bytes(info, dec_w)
    n_img = int(info.get("image_tokens") or 0)
    width = int(info.get("vision_hidden") or 0)
    # encoder positions (before a pixel shuffle or pooling)
    n_pos = int(info.get("encoder_positions") or n_img * int(info.get("scale_factor") or 1) ** 2)
    enc_act = (n_pos + 1) * width * 4 * 8  # one image's activations in F32, ~8 live tensors
    if info.get("window_attention"):  # llama.cpp's F32 window mask over the largest image's positions (n_pos^2)
        enc_act += n_pos * n_pos * 4
    total = dec_w + kv + comp + mm_bytes + enc_act + onnx_bytes
    budget = profile.memory_budget_gb()
    arith = (
        f"decoder {quant} {dec:,} x {BPW[quant]} bpw / 8 = {_gb(dec_w)} + KV {_gb(kv)} at {n_ctx} ctx + "
        f"compute {_gb(comp)} + mmproj F16 {_gb(mm_bytes)} + encoder activations {_gb(enc_act)} "
        f"{'+ ONNX encoder FP16 ' + _gb(onnx_bytes) + ' ' if onnx_bytes else ''}"
        f"= {_gb(total)}"
    )
    if budget is not None and total > budget * GB:
        raise ResourceError(f"{facts.name} does not fit profile {profile.name}: {arith} > budget {budget} GB")
    budget_note = "<= budget " + str(budget) + " GB" if budget is not None else "(profile has no memory figure)"
    return Decision("vlm.memory", round(total / GB, 4), f"{arith} {budget_note}")


def _encoder_decision(class_token: bool, params: int, dec: int, mm_bytes: int) -> Decision:
    """vlm.encoder: the encoder + projector (``params``) as one FP16 ONNX graph beside a tokenize-only mmproj
    for a class-token tower, else as one F16 mmproj GGUF for libmtmd."""
    from edgesdk.formats.vlm.convert import CLASS_TOKEN_NOTE

    if class_token:
        return Decision(
            "vlm.encoder",
            {
                "format": "onnx",
                "precision": "FP16",
                "runtime": "onnxruntime",
                "mmproj": "F16, tokenizes image chunks only",
            },
            f"encoder + projector as one FP16 ONNX graph ({params:,} params x 2 B = "
            f"{_gb(params * 2)}) on ONNX Runtime; a tokenize-only F16 mmproj (no tower "
            f"layers, the projector: {_gb(mm_bytes)}) for libmtmd's image-chunk tokenization: "
            f"{CLASS_TOKEN_NOTE}",
        )
    return Decision(
        "vlm.encoder",
        {"format": "gguf-mmproj", "precision": "F16", "runtime": "llama.cpp mtmd"},
        f"encoder + projector as one F16 mmproj GGUF for llama.cpp's multimodal library "
        f"({params:,} params x 2 B = {_gb(mm_bytes)}): quantized vision encoders lose visual "
        f"features while the decoder tolerates 4 bits, and the encoder is "
        f"{params / (params + dec):.0%} of the weights",
    )


def _vision_runtime_decision(
    facts: ModelFacts, profile: Profile, options: BuildOptions, fam: VLMFamily, class_token: bool, params: int
) -> Decision:
    """vlm.vision_runtime: the profile's choice (:func:`vision_runtime`) within what the family can do: no ONNX
    encoder where its record has no export; a class-token tower's ONNX graph on any provider (CLASS_TOKEN_NOTE).
    ``--vision-runtime`` asking for what cannot be built is an InputError."""
    from edgesdk.formats.vlm.convert import CLASS_TOKEN_NOTE

    asked = (getattr(options, "vision_runtime", None) or "auto").lower()
    vr = vision_runtime(profile, options, params)
    if not fam.onnx_encoder and _wants_onnx(vr):  # the family record says whether the ONNX export covers it
        if asked == "onnx":
            raise InputError(f"--vision-runtime onnx is not supported for {fam.display} yet (use gguf or auto)")
        vr = Decision(
            "vlm.vision_runtime",
            {"runtime": "gguf-mmproj", "onnx": False},
            f"{fam.display}: the encoder runs in llama.cpp's libmtmd from the F16 mmproj (no ONNX "
            "encoder export for this family yet)",
        )
    if class_token:  # LLaVA-1.5's CLIP tower: the ONNX graph is the encoder, on any provider (CLASS_TOKEN_NOTE)
        if asked == "gguf":
            raise InputError(f"--vision-runtime gguf cannot build {facts.name}: {CLASS_TOKEN_NOTE}")
        eps = [ep for ep in profile.execution_providers if ep in _FAST_EPS]
        vr = Decision(
            "vlm.vision_runtime",
            {
                "runtime": "onnx",
                "onnx": True,
                "precision": "FP16",
                "required": True,
                "providers": eps + ["CPUExecutionProvider"],
            },
            f"CLIP tower with a class token: {CLASS_TOKEN_NOTE} ({params:,} params x 2 B = "
            f"{_gb(params * 2)} FP16 ONNX; {' > '.join(eps + ['CPU'])}, chosen at load); the mmproj "
            f"is tokenize-only (projector, no tower layers)",
        )
    return vr


def _parity_decision(class_token: bool, onnx_encoder: bool) -> Decision:
    """parity: image features vs PyTorch's encoder + projector and greedy tokens end to end, measured on the
    ONNX encoder for a class-token tower (its mmproj does not encode), else on the mmproj (and the ONNX
    encoder where the bundle has one)."""
    parity: dict[str, Any] = {"encoder_min_cosine": ENCODER_MIN_COSINE, "greedy_tokens": GREEDY_TOKENS}
    if class_token:
        parity["encoder"] = "onnx"
        return Decision(
            "parity",
            parity,
            f"image features (FP16 ONNX encoder via ONNX Runtime on the build host's CPU vs PyTorch "
            f"encoder + projector): min cosine per image token >= {ENCODER_MIN_COSINE}; first "
            f"{GREEDY_TOKENS} greedy tokens of the F16 decoder fed the ONNX features equal to "
            f"PyTorch's on the test images; decoder logits and perplexity as in the GGUF path; the "
            f"mmproj's own features are recorded, not gated (it does not encode)",
        )
    return Decision(
        "parity",
        parity,
        f"image features (F16 mmproj via llama.cpp vs PyTorch encoder + projector): min cosine per "
        f"image token >= {ENCODER_MIN_COSINE}; first {GREEDY_TOKENS} greedy tokens of the F16 "
        f"decoder + mmproj equal to PyTorch's on the test images (or first differing at a near-tie of "
        f"PyTorch's scores); decoder logits and perplexity as "
        f"in the GGUF path"
        + (
            "; the FP16 ONNX encoder: the same min cosine vs PyTorch, and the same greedy tokens as the mmproj path"
            if onnx_encoder
            else ""
        ),
    )
