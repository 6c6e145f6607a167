# SPDX-License-Identifier: Apache-2.0
"""The TensorRT format: the ONNX artifact plus a native engine, built here when this host is the
target, else deferred to the device with the exact build configuration.

Modules: :mod:`.plan` (decisions), :mod:`.build` (stages and the ``edgesdk engine`` commands),
:mod:`.engine` (engine config, cache and trtexec/TensorRT builds). Light on import (see formats/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import SPECIFIC, ClickOption, FormatOptions

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.formats.tensorrt.plan import TensorRTPlan
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, Decision, ModelFacts


@dataclass
class TensorRTOptions(FormatOptions):
    """The TensorRT format's ``edgesdk build`` options (the ONNX format's shape bounds apply to it too)."""

    shapes: tuple[str, ...] = ()  # NAME:MIN:OPT:MAX, parsed into BuildOptions.shapes by apply()
    dla: bool | None = None

    @staticmethod
    def click_options() -> list[ClickOption]:
        import click

        return [
            click.option(
                "--shapes",
                "shapes",
                multiple=True,
                metavar="NAME:MIN:OPT:MAX",
                help="TensorRT optimization profile for one input, trtexec's triple, e.g. "
                "pixel_values:1x3x224x224:4x3x224x224:8x3x224x224 (repeatable; --format tensorrt).",
            ),
            click.option("--dla/--no-dla", default=None, help="Force DLA on/off for TensorRT builds (Orin AGX/NX)."),
        ]

    def check_request(self, fmt: str | None) -> None:
        if self.shapes and fmt not in (None, "tensorrt"):
            raise InputError(f"--shapes sets TensorRT optimization profiles; --format {fmt} has none")
        if self.dla is not None and fmt not in (None, "tensorrt"):
            raise InputError(f"--dla/--no-dla apply to TensorRT engines; --format {fmt} has none")

    def check_plan(self, fmt: str) -> None:
        if self.shapes and fmt != "tensorrt":
            raise InputError(
                f"--shapes sets TensorRT optimization profiles; this plan builds {fmt}",
                hint="add --format tensorrt",
            )

    def apply(self, options: BuildOptions) -> None:
        from edgesdk.formats.tensorrt.plan import parse_shapes

        options.dla = self.dla
        options.shapes = parse_shapes(self.shapes) if self.shapes else None


class TensorRTFormat:
    name = "tensorrt"
    stages = ("export", "optimize", "quantize", "verify", "engine", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.tensorrt:load_tensorrt"
    runtime_requires = ("tensorrt", "TensorRT (JetPack or an NVIDIA container)")
    profiler_backend: str | None = "tensorrt"
    selectable = True
    claim_priority = SPECIFIC  # never claims (below); ahead of the catch-all like every non-catch-all format
    options = TensorRTOptions

    def check_source(self, facts: ModelFacts) -> None:
        if facts.kind == "gguf":
            raise InputError(f"--format {self.name} cannot take a GGUF source; use --format gguf")

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        return None  # never automatic: ONNX with the TensorRT EP first in its chain is the portable default

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        return None

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> TensorRTPlan:
        from edgesdk.formats.onnx.plan import ep_chain_decision, export_decisions, parity_decision
        from edgesdk.formats.tensorrt.plan import TensorRTPlan, plan_tensorrt

        section = TensorRTPlan.from_decisions(export_decisions(facts, profile, options, precision, fmt=self.name))
        for d in [
            ep_chain_decision(profile),
            *plan_tensorrt(facts, profile, options, host, precision),
            parity_decision(profile, options, section.onnx_precision or precision),
        ]:
            section.record(d.key, d.value, d.reason)
        section.decide_parity(profile, section.onnx_precision or precision)
        return section

    def build(self, ctx: BuildContext) -> None:
        from edgesdk.formats.tensorrt.build import build_tensorrt

        build_tensorrt(ctx)


FORMAT = TensorRTFormat()
