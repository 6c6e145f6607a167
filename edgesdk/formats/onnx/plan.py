# SPDX-License-Identifier: Apache-2.0
"""ONNX plan: export, graph optimization, precision of the ONNX artifact, the EP chain and parity.

Pure: reads the facts and the profile only. TensorRT reuses :func:`export_decisions` for the ONNX
it hands to the engine builder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.types import (
    BuildOptions,
    Decision,
    ModelFacts,
    OptimizeMethod,
    execution_provider_chain,
    parity_thresholds,
)

if TYPE_CHECKING:
    from edgesdk.profiles import Profile

FUSION_MODEL_TYPE = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert",
                     "mpnet": "bert", "electra": "bert", "albert": "bert"}


def ep_chain_decision(profile: Profile) -> Decision:
    return Decision("ep_chain", execution_provider_chain(profile), "profile's execution providers, best first; the "
                    "runtime takes only those present and records each fallback; CPU is always last")


def parity_decision(profile: Profile, options: BuildOptions, precision: str) -> Decision:
    return Decision("parity", parity_thresholds(profile, precision), f"{precision} thresholds vs the PyTorch/source "
                    f"outputs on {options.parity_samples} sample inputs; a miss "
                    + ("falls back to the next precision" if options.on_parity_fail == "fallback"
                       else "fails the build"))


def plan_onnx(facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str) -> list[Decision]:
    return [*export_decisions(facts, profile, options, precision), ep_chain_decision(profile),
            parity_decision(profile, options, precision)]


def export_decisions(facts: ModelFacts, profile: Profile, options: BuildOptions, precision: str,
                     fmt: str = "onnx") -> list[Decision]:
    """Export, optimize and precision decisions of the ONNX artifact (``fmt="tensorrt"``: the engine's input)."""
    out: list[Decision] = []
    if facts.kind == "hf":
        out.append(Decision("export", f"optimum ONNX exporter, opset {options.opset}, dynamic batch/sequence axes",
                            "optimum-onnx knows each Hugging Face architecture's inputs/outputs and dynamic axes"))
    elif facts.kind == "torch":
        out.append(Decision("export", f"torch.onnx.export, opset {options.opset}", "plain nn.Module source"))
    else:
        out.append(Decision("export", "none (ONNX taken as is)", "the source is already ONNX"))
    if fmt == "tensorrt":
        out.append(Decision("optimize", OptimizeMethod.ONNXSLIM, "TensorRT parses standard ONNX only: onnxruntime's "
                            "fused com.microsoft ops (Attention, SkipLayerNormalization) would split the engine"))
        out.append(Decision("onnx_precision", "fp32", f"TensorRT applies {precision} itself when it builds the "
                            "engine; FP16-converted or dynamic-INT8 ONNX ops would fall off TensorRT"))
        return out
    fusion = FUSION_MODEL_TYPE.get(facts.family or "")
    if precision == "int8" and not profile.is_gpu:
        out.append(Decision("optimize", OptimizeMethod.NONE, "plain export; ONNX Runtime's session optimizer runs "
                            "at load: measured on CPU, INT8 on the fused graph ran at 0.56-0.68x FP32 against 0.52-0.58x on "
                            "the plain export in the same runs, and fusion gave FP32 no gain (docs/int8.md)"))
    elif fusion and facts.kind == "hf":
        heads = facts.config.get("num_attention_heads")
        hidden = facts.config.get("hidden_size")
        out.append(Decision("optimize", OptimizeMethod.ORT_TRANSFORMER, f"onnxruntime transformer optimizer "
                            f"(model_type={fusion}, heads={heads}, hidden={hidden}) fuses attention, LayerNorm+residual "
                            "and GELU into single kernels that both CPU and CUDA EPs implement"))
    else:
        out.append(Decision("optimize", OptimizeMethod.ONNXSLIM, "generic graph cleanup (constant folding, dead nodes); no "
                            "transformer fusion pattern applies to this model"))
    if precision == "int8":
        out.append(Decision("quantize", "accuracy-aware dynamic INT8 (per-channel weights), excluding the most "
                            "sensitive nodes until parity holds",
                            f"INT8 must keep min cosine >= {parity_thresholds(profile, 'int8')['min_cosine']} vs the source"))
    elif precision == "fp16":
        out.append(Decision("quantize", "FP16 weights and activations, keeping I/O FP32 and LayerNorm/Softmax "
                            "inputs in FP32 where FP16 overflows", "GPU profile; halves weight bytes"))
    return out
