# SPDX-License-Identifier: Apache-2.0
"""The shared build cache (issue 36, item 4): ``edgesdk build ... --cache oci://REGISTRY/NAMESPACE/NAME``.

A build's **key** is the sha256 of a canonical JSON record of everything its bundle is a function of: the
source's sha256 (what the manifest records as ``model.source_sha256``), the profile's name and file sha256, the
plan (every decision, the model facts without the source's local path), the build options (policy and waiver
files by content, the day when waivers are given: they expire), the output's name (the SBOM names the bundle),
the tool versions a build records in the manifest's ``tools`` plus the distributions the license gate lists, and
this platform. The registry holds a cached bundle under the tag ``cache-<key>`` of the cache repository, pushed
as ``edgesdk push`` does (its manifest annotated with the key).

A **hit** pulls that tag into the local store exactly as ``edgesdk pull`` does (every blob against its digest,
the directory against the bundle's own sha256 table, the trust policy of ``$EDGESDK_TRUST_POLICY`` when set),
checks that the bundle is what the key says (profile, source sha256, precision from the plan), and copies it to
the output through the build's own staging, lock and ``--force`` rules. A **miss** builds, then pushes. The cache
never fails a build by being away: a registry that cannot be reached or refuses is a warning and the build runs
(or, after a build, the push is skipped); a cached bundle that fails verification is an error (exit 7), as a
tampered pull is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk import __version__
from edgesdk import bundle as B
from edgesdk.distribution.oci import Reference, RegistryError
from edgesdk.errors import BundleIntegrityError, InputError
from edgesdk.profiles import Profile
from edgesdk.types import BuildOptions, Plan

KEY_SCHEMA = 1
CACHE_KEY_ANNOTATION = "io.edgesdk.cache_key"
#: distributions whose versions a build records (the formats' ``ctx.tools``) or whose metadata the license gate
#: reads into the SBOM: a different version is a different key
TOOL_DISTS = (
    "torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxslim",
    "gguf", "llama-cpp-python", "pillow", "tokenizers", "numpy", "safetensors", "cyclonedx-python-lib",
    "license-expression", "scanoss", "opentelemetry-api", "click", "pyyaml",
)  # fmt: skip
#: BuildOptions fields that cannot change the bundle (or are the output's business, not the build's)
NOT_KEYED = {"force", "progress", "example_inputs", "module", "license_policy", "waivers", "chat_template"}

Say = Callable[[str], None]


def _file_sha(path: str | None) -> str | None:
    return B.sha256_file(Path(path)) if path else None


def cache_reference(text: str) -> Reference:
    """``oci://REGISTRY/NAMESPACE/NAME`` (no tag, no digest: the key is the tag)."""
    if not text.startswith("oci://"):
        raise InputError(f"--cache {text!r}: expected oci://REGISTRY/NAMESPACE/NAME")
    ref = Reference.parse(text)
    tail = text.rstrip("/").rsplit("/", 1)[-1]
    if ref.digest or ":" in tail:
        raise InputError(f"--cache {text}: name a repository, not a tag or digest (the cache key is the tag)")
    return ref


def key_record(source: Path, profile: Profile, plan: Plan, options: BuildOptions, output: Path) -> dict[str, Any]:
    """What the key hashes (see the module docstring); JSON, so ``--json`` can show it."""
    from edgesdk.host import tool_versions

    plan_doc = plan.to_dict()
    model = dict(plan_doc.get("model") or {})
    model.pop("source", None)  # a local path: another checkout of the same source is the same build
    plan_doc["model"] = model
    opts: dict[str, Any] = {}
    for name, value in sorted(vars(options).items()):
        if name in NOT_KEYED or name == "extra":
            continue
        opts[name] = list(value) if isinstance(value, tuple) else value
    opts["extra"] = {k: v for k, v in sorted(options.extra.items()) if _jsonable(v)}
    opts["license_policy_sha256"] = _file_sha(options.license_policy)
    opts["waivers_sha256"] = _file_sha(options.waivers)
    if options.waivers:  # a waiver expires: a verdict holds for the day it was made
        opts["waivers_day"] = dt.date.today().isoformat()
    template = options.chat_template
    opts["chat_template"] = _file_sha(template) if template and Path(template).is_file() else template
    return {
        "schema": KEY_SCHEMA,
        "source_sha256": B.sha256_tree(source),
        "profile": {"name": profile.name, "sha256": B.sha256_file(profile.path)},
        "plan": plan_doc,
        "options": opts,
        "output_name": output.name,
        "tools": {"edgesdk": __version__, "python": platform.python_version(), **tool_versions(TOOL_DISTS)},
        "platform": {"system": platform.system(), "machine": platform.machine()},
    }


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def cache_key(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


@dataclass
class CacheResult:
    reference: str
    key: str
    hit: bool
    seconds: float
    pushed: bool = False
    digest: str | None = None
    note: str | None = None  # why the cache was not used (a warning already printed)
    record: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "record"} | {"key_record": self.record}


class BuildCache:
    """One build's view of the cache: :meth:`restore` before the build, :meth:`store` after a miss."""

    def __init__(
        self, cache: str, source: Path, plan: Plan, options: BuildOptions, output: Path, say: Say | None = None
    ) -> None:
        self.repo = cache_reference(cache)
        if plan.facts is None or plan.target is None or plan.facts.kind == "torch":
            raise InputError("--cache needs a model file or directory as the source (an nn.Module has no hash)")
        self.output = Path(output)
        self.plan = plan
        self.say = say or (lambda _m: None)
        t0 = time.perf_counter()
        self.record = key_record(Path(source), plan.target, plan, options, self.output)
        self.key = cache_key(self.record)
        self.tag_ref = f"oci://{self.repo.registry}/{self.repo.repository}:cache-{self.key}"
        self.force = options.force
        self._t0 = t0

    def _result(self, hit: bool, **kw: Any) -> CacheResult:
        return CacheResult(self.tag_ref, self.key, hit, round(time.perf_counter() - self._t0, 3), record=self.record,
                           **kw)  # fmt: skip

    def restore(self) -> CacheResult:
        """Pull the cached bundle for this key into the output; ``hit`` False when there is none (or the registry
        is away: said as a warning)."""
        from edgesdk.distribution.store import pull

        try:
            got = pull(self.tag_ref, self.plan.target.name, progress=None)
        except RegistryError as exc:
            self.say(f"warning: build cache {self.repo.registry} not used: {exc.one_line()}")
            return self._result(False, note=exc.one_line())
        except InputError as exc:
            if "no such tag" in exc.message:
                self.say(f"build cache: miss ({self.key[:16]})")
                return self._result(False)
            raise
        self._check(got.path)
        self._place(got.path)
        self.say(f"build cache: hit ({self.key[:16]}), {got.how}: {got.digest}")
        return self._result(True, digest=got.digest)

    def _check(self, stored: Path) -> None:
        """The cached bundle is what the key names: its manifest's source hash, profile and format."""
        bundle = B.open_bundle(stored)
        m = bundle.manifest
        want = (self.record["source_sha256"], self.record["profile"]["name"], self.record["profile"]["sha256"])
        got = (m.model.source_sha256, m.profile.name, m.profile.sha256)
        if got != want or m.format != self.plan.format:
            raise BundleIntegrityError(
                f"build cache {self.tag_ref}: the cached bundle is not this build (source/profile/format "
                f"{got[0]!s:.12}/{got[1]}/{m.format}, expected {want[0]:.12}/{want[1]}/{self.plan.format}): not used"
            )

    def _place(self, stored: Path) -> None:
        """Copy the stored bundle to the output through the build's staging (lock, ``--force``, atomic rename)."""
        with B.output_lock(self.output):
            staging = B.make_staging(self.output, self.force)
            try:
                for f in sorted(p for p in stored.rglob("*") if p.is_file()):
                    dest = staging / f.relative_to(stored)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f, dest)
                B.commit_staging(staging, self.output, self.force)
            except BaseException:
                B.discard_staging(staging)
                raise

    def store(self, built: Path) -> CacheResult:
        """Push the bundle just built under this key (a warning, not a failure, when the registry is away)."""
        from edgesdk.distribution.store import push

        try:
            out = push(built, self.tag_ref, progress=None, annotations={CACHE_KEY_ANNOTATION: self.key})
        except RegistryError as exc:
            self.say(f"warning: build cache {self.repo.registry}: the bundle was not pushed: {exc.one_line()}")
            return self._result(False, note=exc.one_line())
        self.say(f"build cache: pushed {out['uploaded_bytes'] / 1e6:.1f} MB as {self.tag_ref}")
        return self._result(False, pushed=True, digest=out["manifest_digest"])
