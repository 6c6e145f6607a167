# SPDX-License-Identifier: Apache-2.0
"""The GGUF format (llama.cpp): causal LMs as one file with weights, tokenizer and chat template.

Modules: :mod:`.facts`
(planner facts from a GGUF header or a HF causal-LM config), :mod:`.plan` (memory-driven
quantization plan), :mod:`.build` (stages), :mod:`.convert` (HF -> GGUF, llama.cpp quantize,
perplexity). The GGUF header reader and type table, shared with the profiles, the runtime, the profiler and
the license scan, are :mod:`edgesdk.contracts.gguf_header` and :mod:`edgesdk.contracts.gguf_types`. Light on
import (see formats/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgesdk.errors import InputError
from edgesdk.formats import SPECIFIC, ClickOption, FormatOptions
from edgesdk.types import Decision

if TYPE_CHECKING:
    from edgesdk.formats import BuildContext
    from edgesdk.formats.gguf.plan import GgufPlan
    from edgesdk.host import HostFacts
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, ModelFacts


@dataclass
class GgufOptions(FormatOptions):
    """The GGUF format's ``edgesdk build`` options (a VLM's decoder is planned by them too)."""

    quant_type: str | None = None
    context_length: int | None = None
    chat_template: str | None = None
    draft: str | None = None

    @staticmethod
    def click_options() -> list[ClickOption]:
        import click

        return [
            click.option("--quant-type", help="GGUF quantization type (e.g. Q4_K_M) instead of the planned one."),
            click.option("--context-length", type=click.IntRange(min=1), help="LLM context length to plan memory for."),
            click.option(
                "--chat-template",
                metavar="NAME|FILE",
                help="GGUF: the chat template to bundle (a shipped name: "
                "chatml, gemma, llama-2, llama-3, mistral, phi-3; or a Jinja file), instead of the model's own or "
                "the one its architecture gets.",
            ),
            click.option(
                "--draft",
                metavar="SMALL_MODEL",
                help="GGUF: pack a draft model for speculative decoding (a GGUF file or HF causal-LM directory with "
                "the model's vocabulary; quantized to the model's type unless already quantized; license-gated and "
                "listed in the SBOMs like the model). Runtime: --speculative draft, or auto where the plan says so.",
            ),
        ]

    def check_plan(self, fmt: str) -> None:
        if self.chat_template is not None and fmt != "gguf":
            raise InputError(f"--chat-template bundles a chat template with a GGUF build; this plan builds {fmt}")
        if self.draft is not None and fmt != "gguf":
            raise InputError(f"--draft packs a draft model into a GGUF build; this plan builds {fmt}")

    def check_request(self, fmt: str | None) -> None:
        if self.draft is not None and fmt not in (None, "gguf"):
            raise InputError(f"--draft packs a draft model into a GGUF build, not --format {fmt}")


class GGUFFormat:
    name = "gguf"
    stages = ("convert", "quantize", "verify", "license_gate", "package")
    runtime_loader = "edgesdk.runtime.backends.llamacpp:load_gguf"
    runtime_requires = ("llama_cpp", "llama-cpp-python (pip install 'edgesdk[gguf]')")
    profiler_backend: str | None = "llama.cpp"
    selectable = True
    claim_priority = SPECIFIC  # GGUF files and causal LMs, before the ONNX catch-all
    options = GgufOptions

    def facts(self, path: Path) -> ModelFacts | None:
        """A ``.gguf`` file's facts: its key/value header (:mod:`.facts`, standard library only)."""
        if path.suffix.lower() != ".gguf":
            return None
        from edgesdk.formats.gguf.facts import gguf_file_facts

        return gguf_file_facts(path)

    def check_source(self, facts: ModelFacts) -> None:
        if facts.task != "text-generation":
            raise InputError(f"--format gguf needs a causal language model; {facts.name} is {facts.task}")

    def claims(self, facts: ModelFacts, profile: Profile) -> Decision | None:
        if facts.kind != "gguf" and facts.task != "text-generation":
            return None
        if "gguf" not in profile.preferred_formats:
            raise InputError(f"profile {profile.name} does not list gguf; pass --format to override")
        return Decision(
            "format",
            "gguf",
            "causal LM: llama.cpp is the runtime Jetson and CPU hosts use for LLMs; "
            "GGUF carries weights, tokenizer and chat template in one file",
        )

    def plan_precision(self, facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision | None:
        return Decision("precision", "quantized", "GGUF quantization type is chosen by the memory arithmetic below")

    def plan(
        self, facts: ModelFacts, profile: Profile, options: BuildOptions, host: HostFacts, precision: str
    ) -> GgufPlan:
        from edgesdk.formats.gguf.chat_templates import DECISION_KEY, plan_decision
        from edgesdk.formats.gguf.draft import draft_source, plan_draft
        from edgesdk.formats.gguf.plan import parity_fallback_decision, plan_gguf

        # --draft read once (headers only): its memory counts in the plan's arithmetic, its figures in gguf.draft
        asked = options.option("draft")
        small = draft_source(str(asked)) if asked is not None else None
        section = plan_gguf(facts, profile, options, draft=small)
        template, source, why = plan_decision(facts, options.chat_template)
        draft = plan_draft(facts, profile, options, section.quant_type, small)  # --draft: None without one
        for d in (
            parity_fallback_decision(facts, profile, options, section),
            Decision(DECISION_KEY, {"template": template, "source": source}, why),
            *([draft] if draft is not None else []),
        ):
            section.record(d.key, d.value, d.reason)
        return section

    def build(self, ctx: BuildContext) -> None:
        from edgesdk.formats.gguf.build import build_gguf

        build_gguf(ctx)


FORMAT = GGUFFormat()
