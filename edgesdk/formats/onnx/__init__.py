# SPDX-License-Identifier: Apache-2.0
"""The ONNX format: export (optimum exporters / torch.onnx), optimize, quantize, verify parity.

Modules: :mod:`.plan` (decisions), :mod:`.build` (stages), :mod:`.export` (the exporter child
process), :mod:`.quant` + :mod:`.calibration` (accuracy-aware INT8), :mod:`.parity` (sample inputs
and output comparison). This module stays light: the registry imports it on every CLI start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import CATCH_ALL, ClickOption, FormatOptions
from edgesdk.types import Decision

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.formats.onnx.plan import OnnxPlan
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, ModelFacts


@dataclass
class OnnxOptions(FormatOptions):
    """The ONNX format's ``edgesdk build`` options: the planned and the largest shapes of the graph (calibration
    and parity inputs, ONNX Runtime's shape buckets; the TensorRT format, this graph plus an engine, bounds its
    optimization profiles by them)."""

    seq_len: int | None = None  # None: BuildOptions' 128
    max_seq_len: int | None = None
    max_batch: int | None = None

    @staticmethod
    def click_options() -> list[ClickOption]:
        import click

        return [
            click.option(
                "--seq-len",
                type=click.IntRange(min=1),
                help="Planned sequence length of text models: the opt of "
                "TensorRT shape profiles, and the length of calibration/parity inputs (default 128).",
            ),
            click.option(
                "--max-seq-len",
                type=click.IntRange(min=1),
                help="Sequence-length upper bound of TensorRT shape profiles for text models "
                "(default: the model's max positions).",
            ),
            click.option(
                "--max-batch",
                type=click.IntRange(min=1),
                help="Batch upper bound of TensorRT shape profiles (default 8).",
            ),
        ]


class OnnxFormat:
    name = "onnx"
    stages = ("export", "optimize", "quantize", "verify", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.onnxruntime:load_onnx"
    runtime_requires = ("onnxruntime", "onnxruntime")
    profiler_backend: str | None = "onnxruntime"
    selectable = True
    claim_priority = CATCH_ALL  # asked last: it claims whatever no specific format claimed
    options = OnnxOptions

    def facts(self, path: Path) -> ModelFacts | None:
        """An ``.onnx`` file's facts: its graph without external data (:mod:`.facts`)."""
        if path.suffix.lower() != ".onnx":
            return None
        from edgesdk.formats.onnx.facts import onnx_file_facts

        return onnx_file_facts(path)

    def check_source(self, facts: ModelFacts) -> None:
        if facts.kind == "gguf":
            raise InputError(f"--format {self.name} cannot take a GGUF source; use --format gguf")

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        # the catch-all: asked last (claim_priority), so causal LMs, VLMs and GGUF files were claimed before
        # by a format with a KV cache and a sampler (GGUF, VLM)
        allowed = profile.preferred_formats
        if "tensorrt" in allowed and profile.is_gpu:
            return Decision(
                "format",
                "onnx",
                "portable ONNX: the runtime takes TensorRT EP -> CUDA EP -> CPU EP, "
                "whichever the device has; pass --format tensorrt for a native engine "
                "(built on the device, deferred when this host cannot build it)",
            )
        return Decision("format", "onnx", f"profile {profile.name} prefers {allowed[0]}; ONNX Runtime is its runtime")

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        return None

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> OnnxPlan:
        from edgesdk.formats.onnx.plan import plan_onnx

        return plan_onnx(facts, profile, options, precision)

    def build(self, ctx: BuildContext) -> None:
        from edgesdk.formats.onnx.build import build_onnx

        build_onnx(ctx)


FORMAT = OnnxFormat()
