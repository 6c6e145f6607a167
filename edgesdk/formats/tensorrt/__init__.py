# SPDX-License-Identifier: Apache-2.0
"""The TensorRT format: the ONNX artifact plus a native engine, built here when this host is the
target, else deferred to the device with the exact build configuration.

Modules: :mod:`.plan` (decisions), :mod:`.build` (stages and the ``edgesdk engine`` commands),
:mod:`.engine` (engine config, cache and trtexec/TensorRT builds). Light on import (see formats/).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import SPECIFIC

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.formats.tensorrt.plan import TensorRTPlan
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, Decision, ModelFacts


class TensorRTFormat:
    name = "tensorrt"
    stages = ("export", "optimize", "quantize", "verify", "engine", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.tensorrt:load_tensorrt"
    runtime_requires = ("tensorrt", "TensorRT (JetPack or an NVIDIA container)")
    profiler_backend: str | None = "tensorrt"
    selectable = True
    claim_priority = SPECIFIC  # never claims (below); ahead of the catch-all like every non-catch-all format

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
        return section

    def build(self, ctx: BuildContext) -> None:
        from edgesdk.formats.tensorrt.build import build_tensorrt

        build_tensorrt(ctx)


FORMAT = TensorRTFormat()
