# SPDX-License-Identifier: Apache-2.0
"""The ``torch`` format: a ``torch.export`` program, kept when an ``nn.Module`` has an op without an
ONNX symbolic (:mod:`.export`, called by the ONNX build). Never planned or requested: the ONNX
build falls back to it and records why; the runtime runs it eagerly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import SPECIFIC

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, Decision, ModelFacts


class TorchFormat:
    name = "torch"
    stages = ("export", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.torch_eager:load_torch"
    runtime_requires = ("torch", "torch")
    profiler_backend: str | None = None
    selectable = False
    claim_priority = SPECIFIC  # never claims (below); ahead of the catch-all like every non-catch-all format

    def check_source(self, facts: ModelFacts) -> None:
        raise InputError(
            "format torch cannot be requested: it is what an ONNX build of an nn.Module falls back "
            "to when the export fails",
            hint="use --format onnx",
        )

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        return None

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        return None

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> list[Decision]:
        return []

    def build(self, ctx: BuildContext) -> None:
        raise InputError("format torch is not built directly (the ONNX build falls back to it)")


FORMAT = TorchFormat()
