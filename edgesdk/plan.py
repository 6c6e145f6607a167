# SPDX-License-Identifier: Apache-2.0
"""The planner: a pure function of (model facts, device profile, user options, host facts) -> decisions.

:func:`plan_build` reads no file and probes nothing: the model facts come from
:func:`edgesdk.inspect.inspect_model` (headers only) and the host facts from
:func:`edgesdk.host.probe`, both passed in, so every decision is reproducible and explainable
(``edgesdk build --explain``). The format-specific decisions come from the format's plugin
(:mod:`edgesdk.formats`); this module decides only what every format shares.
"""

from __future__ import annotations

from edgesdk.errors import InputError
from edgesdk.formats import claim_order, get_format
from edgesdk.host import HostFacts
from edgesdk.inspect import inspect_model
from edgesdk.profiles import Profile, execution_provider_chain, parity_thresholds
from edgesdk.types import (
    DEFAULT_PARITY,
    BuildOptions,
    Decision,
    ModelFacts,
    OnnxRuntimeSection,
    Plan,
    PlanSection,
)

__all__ = ["DEFAULT_PARITY", "BuildOptions", "Decision", "ModelFacts", "Plan", "inspect_model", "plan_build"]


def _choose_format(facts: ModelFacts, profile: Profile, options: BuildOptions) -> Decision:
    allowed = profile.preferred_formats
    if options.format:
        fmt = get_format(options.format)
        fmt.check_source(facts)
        note = "" if fmt.name in allowed else f" (not in the profile's preferred formats {allowed})"
        return Decision("format", fmt.name, f"requested with --format{note}")
    for fmt in claim_order():  # specific formats (GGUF, VLM) before the ONNX catch-all
        claim = fmt.claims(facts, profile)
        if claim is not None:
            return claim
    raise InputError(f"no output format takes {facts.name} ({facts.kind}, {facts.task}); pass --format")


def _choose_precision(facts: ModelFacts, profile: Profile, options: BuildOptions, fmt: str) -> Decision:
    order = profile.precision_order
    if options.precision:
        if options.precision not in DEFAULT_PARITY:
            raise InputError(f"unknown precision {options.precision!r} (expected one of {', '.join(DEFAULT_PARITY)})")
        return Decision("precision", options.precision, "requested with --precision")
    special = get_format(fmt).plan_precision(facts, profile, options)
    if special is not None:
        return special
    usable = [p for p in order if p in ("fp32", "fp16", "int8")]
    choice = usable[0] if usable else "fp32"
    if choice == "int8" and facts.task in ("image-classification", "vision"):
        return Decision(
            "precision",
            "fp32",
            "the profile prefers INT8, but this model's compute is convolutions: "
            "accuracy-aware dynamic INT8 covers MatMul/Attention only, and static Conv INT8 needs "
            "calibration images from your data; pass --precision to override",
        )
    if profile.is_gpu:
        why = (
            f"GPU profile: tensor cores run FP16 at {profile.figure('device.peak.fp16_tflops')} TFLOPS "
            f"(profile), twice FP32 throughput and half the bytes; first in the profile's order {order}"
        )
    else:
        why = (
            "CPU profile: dynamic/accuracy-aware INT8 uses VNNI/AMX integer dot products and quarters weight bytes;"
            f" first in the profile's order {order}"
        )
    return Decision("precision", choice, why)


def plan_build(
    facts: ModelFacts, profile: Profile, options: BuildOptions | None = None, host: HostFacts | None = None
) -> Plan:
    """Decide format, precision, the format's own decisions, parity thresholds and the runtime chain.

    ``host`` is what :func:`edgesdk.host.probe` found (None: an unknown host, nothing assumed
    present); it matters only where a format decides what this host can build (a TensorRT engine).
    """
    options = options or BuildOptions()
    host = host if host is not None else HostFacts()
    head: list[Decision] = []
    if profile.resolved_from:
        head.append(
            Decision(
                "profile",
                profile.name,
                f"alias {profile.resolved_from!r} resolves to {profile.name} ({profile.display_name})",
            )
        )
    fmt = _choose_format(facts, profile, options)
    prec = _choose_precision(facts, profile, options, str(fmt.value))
    head += [fmt, prec]
    name, precision = str(fmt.value), str(prec.value)
    planned = get_format(name).plan(facts, profile, options, host, precision)
    # a built-in format returns its typed section; a registered one may return its decisions (kept untyped)
    section = planned if isinstance(planned, PlanSection) else PlanSection.from_decisions(planned)
    tail = [
        Decision(
            "license_gate",
            options.license_policy or "default policy",
            "packaging is gated on the license scan; unknown licenses are denied",
        )
    ]
    plan = Plan(
        format=name,
        precision=precision,
        section=section,
        model=facts.to_dict(),
        profile=profile.name,
        head=head,
        tail=tail,
        facts=facts,
        target=profile,
    )
    if not isinstance(section, OnnxRuntimeSection):  # GGUF/VLM/plugins: the profile's ORT chain, as JSON always held
        plan.profile_ep_chain = execution_provider_chain(profile)
        plan.profile_parity = parity_thresholds(profile, precision)
    return plan
