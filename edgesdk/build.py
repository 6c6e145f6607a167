# SPDX-License-Identifier: Apache-2.0
"""Run a plan stage by stage into a staging directory, gate on licenses, then commit atomically.

``make_plan()`` inspects the model, probes the host once and plans; ``build()`` executes that plan
(``edgesdk build`` shows the plan it then executes, never a second one). Nothing is written at ``out_dir``
until every stage (export, optimize, quantize, verify, license gate, package) has passed; on any failure the
staging directory is removed, so no partial bundle can exist.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib
import json
import os
import platform
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgesdk import __version__, telemetry
from edgesdk import bundle as B
from edgesdk.errors import DiskFullError, EdgeSDKError, InputError, Terminated
from edgesdk.formats import BuildContext, get_format
from edgesdk.inspect import inspect_model
from edgesdk.manifest import Manifest, ModelInfo, ProfileRef, RuntimeInfo
from edgesdk.plan import plan_build
from edgesdk.profiles import Profile, resolve_profile
from edgesdk.types import BuildOptions, Plan


def _bar_size() -> dict:
    """tqdm's ncols/nrows: asked from the terminal, unless stderr's terminal reports no size (a pseudo-terminal
    without a window size: `script` run from a pipe, CI ptys), where tqdm would draw nothing: 80 x 24."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return {}
    return {} if size.columns and size.lines else {"ncols": 80, "nrows": 24}


class _Progress:
    """A stage progress bar on stderr (tqdm), quiet when disabled or not a terminal."""

    def __init__(self, stages: list[str], enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=len(stages),
                    desc="build",
                    unit="stage",
                    file=sys.stderr,
                    disable=not sys.stderr.isatty(),
                    leave=False,
                    **_bar_size(),
                    bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar:20}| {elapsed}",
                )
            except ImportError:
                self.bar = None
        self.enabled = enabled

    def stage(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"build [{name}]")

    def done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def note(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(f"  {msg}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def make_plan(source: Any, profile: str | Profile, options: BuildOptions | None = None, host: Any = None) -> Plan:
    """Inspect ``source`` (headers only), probe this host once, and plan: what ``--explain`` prints
    and what :func:`build` executes. ``host`` overrides the probe (a :class:`edgesdk.host.HostFacts`)."""
    from edgesdk.host import probe

    options = options or BuildOptions()
    prof = profile if isinstance(profile, Profile) else resolve_profile(profile)
    facts = inspect_model(source, options)
    if options.name:  # --name: the model's name in spans, manifest, SBOM and reports
        facts.name = options.name
    return plan_build(facts, prof, options, host if host is not None else probe())


def explain(source: Any, profile: str | Profile, options: BuildOptions | None = None) -> Plan:
    """Plan only (no heavy I/O): what ``edgesdk build --explain`` prints."""
    return make_plan(source, profile, options)


def _runtime_function(spec: str | None) -> Any:
    """A format's ``"module:function"`` in the runtime (``parity_backend``), imported here: the build sits in the
    runtime's layer, a format below it may not import the runtime (docs/architecture.md, "Layers")."""
    if not spec:
        return None
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def _license_gate(ctx: BuildContext, out_dir: Path) -> dict:
    from edgesdk.compliance.components import component_labels
    from edgesdk.compliance.gate import run_license_gate

    opts = ctx.options
    result = run_license_gate(
        ctx.staging,
        model_source=Path(str(ctx.facts.source)) if ctx.facts.kind != "torch" else ctx.staging,
        runtime_distributions=sorted(set(ctx.runtime_requires)),
        policy_path=Path(opts.license_policy) if opts.license_policy else None,
        waivers_path=Path(opts.waivers) if opts.waivers else None,
        accepted=tuple(opts.accept_licenses),
        scanoss_url=opts.scanoss_url,
        report_path=out_dir.with_name(out_dir.name + ".license-report.json"),
        model_name=ctx.facts.name,
        model_license=opts.model_license,
        components=component_labels(ctx.manifest.extras, ctx.artifacts),  # per-file license + sha256 in the SBOMs
        bundle_name=out_dir.name,
    )
    for rel, role in (
        ("sbom.cdx.json", "sbom"),
        ("sbom.spdx.json", "sbom-spdx"),
        ("license-report.json", "license-report"),
    ):
        if (ctx.staging / rel).is_file():
            ctx.add_artifact(rel, role)
    return result.to_manifest()


def build(
    source: Any,
    profile: str | Profile,
    out_dir: str | Path,
    options: BuildOptions | None = None,
    *,
    plan: Plan | None = None,
) -> Path:
    """Build ``source`` for ``profile`` into the bundle directory ``out_dir`` (atomically).

    ``plan``: execute this plan (from :func:`make_plan` with the same source and options) instead of
    planning again, so what was shown is what is built."""
    options = options or BuildOptions()
    out_dir = Path(out_dir)
    if plan is None:
        plan = make_plan(source, profile, options)
    if plan.facts is None or plan.target is None:
        raise InputError("build(plan=...) needs a plan made by make_plan() or plan_build() (it carries the facts)")
    facts = plan.facts
    prof: Profile = plan.target  # Plan.target is typed Any (types.py imports nothing from edgesdk)
    fmt = get_format(plan.format)
    with _sigterm_as_interrupt(), B.output_lock(out_dir):
        staging = B.make_staging(out_dir, options.force)
        progress = _Progress(list(fmt.stages), options.progress)
        t_start = time.perf_counter()
        try:
            with telemetry.build_trace(
                facts.name, prof.name, {"edgesdk.build.format": plan.format, "edgesdk.precision": plan.precision}
            ):
                ctx = BuildContext(source, facts, prof, plan, options, staging, progress)
                ctx.parity_backend = _runtime_function(getattr(fmt, "parity_backend", None))
                fmt.build(ctx)
                with ctx.stage("license_gate"):
                    license_summary = _license_gate(ctx, out_dir)
                with ctx.stage("package"):
                    manifest = _manifest(ctx, license_summary, time.perf_counter() - t_start)
                    B.write_manifest(staging, manifest)
                    B.commit_staging(staging, out_dir, options.force)
        except Exception as exc:
            full = _disk_full(exc, staging)
            B.discard_staging(staging)
            if full is not None:
                raise full from exc
            raise
        except BaseException:
            B.discard_staging(staging)
            raise
        finally:
            progress.close()
    return out_dir


DISK_FULL_FREE_BYTES = 16 << 20  # an unexplained failure with less free than this at the output is "disk full"


def _disk_full(exc: Exception, staging: Path) -> DiskFullError | None:
    """A clear error for a full disk: ENOSPC/EDQUOT anywhere in the chain, or a non-edgesdk failure (a
    child's half-written JSON, a truncated file) while the output's file system is (nearly) full."""
    if isinstance(exc, EdgeSDKError) and not B.is_disk_full(exc):
        return None
    try:
        free = shutil.disk_usage(staging.parent).free
    except OSError:
        free = -1
    if not B.is_disk_full(exc) and not (0 <= free < DISK_FULL_FREE_BYTES):
        return None
    return DiskFullError(
        f"no space left on the device while writing the bundle in {staging.parent} "
        f"({free / 2**20:.1f} MiB free; {type(exc).__name__}: {str(exc)[:120]})",
        hint="free space or build into another directory; nothing was written at the output",
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (docker stop, systemd, CI cancellation) unwinds the build like Ctrl-C: the staging
    directory is removed and the CLI prints one ``error:`` line (exit 143). Only in the main thread,
    and only where nobody installed a SIGTERM handler of their own."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Terminated("terminated by SIGTERM")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _manifest(ctx: BuildContext, license_summary: dict, wall_s: float) -> Manifest:
    """Complete the builder's record (``ctx.manifest``) into the bundle's manifest."""
    facts = ctx.facts
    rec = ctx.manifest
    source_sha = B.sha256_tree(Path(facts.source)) if facts.kind != "torch" else None
    artifacts = sorted(ctx.artifacts, key=lambda a: a.path)
    plan = ctx.plan.to_dict()
    plan["precision"] = ctx.precision
    id_seed = json.dumps([source_sha, ctx.profile.name, ctx.precision, [a.sha256 for a in artifacts]])
    tools = {"edgesdk": __version__, "python": platform.python_version(), **ctx.tools}
    model = ModelInfo.from_dict({**facts.to_dict(), "source_sha256": source_sha, **rec.model.details}, "model")
    return Manifest(
        bundle_id=hashlib.sha256(id_seed.encode()).hexdigest()[:16],
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        model=model,
        profile=ProfileRef(
            name=ctx.profile.name, sha256=B.sha256_file(ctx.profile.path), summary=ctx.profile.summary()
        ),
        format=rec.format or ctx.plan.format,
        precision=ctx.precision,
        plan=plan,
        fallbacks=ctx.fallbacks,
        artifacts=artifacts,
        runtime=RuntimeInfo(
            backend_chain=list(rec.runtime.backend_chain or ctx.plan.ep_chain),
            requires=sorted(set(ctx.runtime_requires)),
        ),
        io=rec.io,
        parity=rec.parity,
        license=license_summary,
        tools=tools,
        build={
            "host": platform.node(),
            "machine": platform.machine(),
            "wall_s": round(wall_s, 2),
            "stage_s": ctx.stage_times,
        },
        embedding=rec.embedding,
        llm=rec.llm,
        extras=rec.extras,
    )
