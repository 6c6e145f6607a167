# SPDX-License-Identifier: Apache-2.0
"""The VLM format: a vision-language model as components for llama.cpp -- the vision encoder and
projector as an F16 ``mmproj`` GGUF, the language decoder as a quantized GGUF (docs/vlm.md).

Modules: :mod:`.facts` (headers only), :mod:`.plan` (pure), :mod:`.convert` (HF -> decoder + mmproj
GGUF), :mod:`.build` (stages and parity). Light on import (see formats/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import SPECIFIC, ClickOption, FormatOptions
from edgesdk.types import Decision

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.formats.vlm.plan import VlmPlan
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, ModelFacts

TASK = "image-text-to-text"


@dataclass
class VlmOptions(FormatOptions):
    """The VLM format's own ``edgesdk build`` option (its decoder takes the GGUF format's too)."""

    vision_runtime: str | None = None  # plan.VISION_RUNTIMES

    @staticmethod
    def click_options() -> list[ClickOption]:
        import click

        return [
            click.option(
                "--vision-runtime",
                type=click.Choice(["auto", "onnx", "gguf"]),
                help="VLM vision encoder: also an "
                "FP16 ONNX graph for TensorRT/CUDA (onnx), the F16 mmproj only (gguf), or by the profile (auto).",
            )
        ]


class VLMFormat:
    name = "vlm"
    stages = ("convert", "quantize", "verify", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.vlm:load_vlm"
    parity_backend = "edgesdk.runtime.backends.vlm:parity_backend"  # the verify stage's runtime path (BuildContext)
    runtime_requires = ("llama_cpp", "llama-cpp-python (pip install 'edgesdk[gguf]')")
    profiler_backend: str | None = None
    selectable = True
    claim_priority = SPECIFIC  # vision-language models, before the ONNX catch-all
    options = VlmOptions

    def check_source(self, facts: ModelFacts) -> None:
        if facts.task != TASK:
            raise InputError(f"--format vlm needs a vision-language model; {facts.name} is {facts.task}")

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        if facts.task != TASK:
            return None
        if "gguf" not in profile.preferred_formats:
            raise InputError(
                f"profile {profile.name} does not list gguf (the VLM runtime is llama.cpp); pass --format to override"
            )
        return Decision(
            "format",
            "vlm",
            "vision-language model: built as components for llama.cpp (F16 mmproj "
            "GGUF for the vision encoder + projector, quantized GGUF decoder), the "
            "runtime Jetson and CPU hosts use for LLMs",
        )

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        return Decision(
            "precision",
            "mixed",
            "per component: vision encoder + projector F16, decoder quantized by the memory arithmetic below",
        )

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> VlmPlan:
        from edgesdk.formats.vlm.plan import plan_vlm

        return plan_vlm(facts, profile, options)

    def build(self, ctx: BuildContext) -> None:
        from edgesdk.formats.vlm.build import build_vlm

        build_vlm(ctx)


FORMAT = VLMFormat()
