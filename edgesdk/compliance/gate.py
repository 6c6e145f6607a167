# SPDX-License-Identifier: Apache-2.0
"""The license gate: collect findings from every layer, judge them by policy, apply waivers and
``--accept-license``, and write the SBOM + report (or stop packaging).

Library entry points: :func:`run_license_gate` (the build calls it on the staging directory) and
:func:`scan_licenses` (``edgesdk check licenses`` on a bundle or any source tree).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgesdk.compliance.components import component_labels, file_components
from edgesdk.compliance.distributions import distribution_findings
from edgesdk.compliance.findings import LicenseFinding
from edgesdk.compliance.models import (
    DECLARED_SOURCE,
    card_findings,
    declared_finding,
    family_findings,
    gguf_findings,
    model_findings,
    onnx_findings,
    package_finding,
    parse_model_license,
)
from edgesdk.compliance.policy import Policy, load_policy
from edgesdk.compliance.result import REPORT_NAME, SBOM_NAME, GateResult
from edgesdk.compliance.sbom import SPDX_NAME, build_spdx, of_result
from edgesdk.compliance.scanoss_match import configured_url, run_scanoss
from edgesdk.compliance.sources import scan_tree, scanoss_settings_findings
from edgesdk.compliance.spdx import normalize
from edgesdk.compliance.waivers import apply_waivers, load_waivers
from edgesdk.errors import InputError, LicenseGateError
from edgesdk.manifest import LenientManifest, license_section

GENERATED = {"manifest.json", SBOM_NAME, SPDX_NAME, REPORT_NAME, "license-report.md"}


def _pyproject_license(root: Path) -> tuple[tuple[str | None, str], list[str]] | None:
    """((license expression, where declared), dependencies) from pyproject.toml [project], else None."""
    path = root / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except ValueError as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from exc
    lic = project.get("license")
    if isinstance(lic, dict):
        lic = lic.get("text")
    return (str(lic) if lic else None, "pyproject.toml [project].license"), project.get("dependencies", [])


#: The gate's own section of a bundle manifest as found (tests/test_model_license.py reads it raw).
_manifest_license_section = license_section


def _recorded_model_findings(root: Path) -> list[LicenseFinding]:
    """Model declarations the gate recorded at build time (the source card is not in the bundle)."""
    try:
        report = json.loads((root / REPORT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for f in report.get("findings", []):
        if f.get("source") == DECLARED_SOURCE:
            continue  # the manifest's model_license_declared is the record of that one
        if f.get("layer") in ("model", "model-package") and isinstance(f.get("subject"), str):
            out.append(
                LicenseFinding(
                    f["layer"],
                    f["subject"],
                    str(f.get("found", "")),
                    f"recorded in {REPORT_NAME} at build ({f.get('source', '')})",
                    normalize(f.get("spdx")).expression if f.get("spdx") else None,
                    str(f.get("note", "")),
                )
            )
    return out


def _model_aliases(built_from: str | None, model_files: Sequence[str], labels: Mapping[str, str]) -> dict[str, str]:
    """Bundle model file -> the name of the model file it was built from, for waivers (a waiver names the model
    file as the user gave it to ``build``: ``gemma-3-270m-q4_k_m.gguf``, not the bundle's ``model.gguf``).
    Only the bundle's ``model`` artifact of the source's own kind (a GGUF from a GGUF): not a VLM's projector,
    not a model built from a directory."""
    if not built_from:
        return {}
    name = built_from.replace("\\", "/").rsplit("/", 1)[-1]
    suffix = Path(name).suffix.lower()
    if suffix not in (".gguf", ".onnx"):
        return {}
    return {
        rel: name
        for rel in model_files
        if rel != name and labels.get(rel, "model") == "model" and Path(rel).suffix.lower() == suffix
    }


def _judge(findings: list[LicenseFinding], policy: Policy, accepted: Sequence[str]) -> tuple[list[str], list[str]]:
    accepted_ids = [normalize(a, hf=True).expression or a for a in accepted]
    used: set[str] = set()
    for f in findings:
        if f.layer == "settings":
            continue  # action preset by the scanner-settings check
        d = policy.evaluate(f.spdx)
        f.category, f.action, f.chosen, f.reason = d.category, d.action, d.chosen, d.reason
        if d.action == "review" and d.review_ids and all(r in accepted_ids for r in d.review_ids):
            f.accepted_as = list(d.review_ids)
            used.update(d.review_ids)
    return accepted_ids, [a for a in accepted_ids if a not in used]


def scan_licenses(
    path: Path,
    *,
    model_source: Path | None = None,
    runtime_distributions: Sequence[str] | None = None,
    environment: bool = False,
    policy_path: Path | None = None,
    waivers_path: Path | None = None,
    accepted: Sequence[str] = (),
    scanoss_url: str | None = None,
    bundle: bool | None = None,
    scanoss_api_key: str | None = None,
    scanoss_timeout: float | None = None,
    model_license: str | None = None,
    components: Mapping[str, str] | None = None,
) -> GateResult:
    """Scan ``path`` (a bundle or staging dir, or any source tree) and judge every finding.

    ``model_license``: a license the builder declares for the model (``--model-license``), judged by
    the same policy and added to what the model itself declares; a bundle's manifest carries it.
    ``components``: bundle path -> what the file is (:func:`~edgesdk.compliance.components.component_labels`);
    read from a bundle's manifest when not given."""
    start = time.perf_counter()
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path} does not exist")
    policy = load_policy(policy_path)
    waivers = load_waivers(waivers_path)
    root = path if path.is_dir() else path.parent
    is_bundle = (root / "manifest.json").is_file() if bundle is None else bundle
    dists = list(runtime_distributions or [])
    fallback: tuple[str | None, str] | None = None
    accepted_at_build: list[str] = []
    built_from: str | None = None  # the model file the bundle was built from (manifest model.source)
    if is_bundle:
        if (root / "manifest.json").is_file():
            try:  # as found: a damaged or edited bundle is still scanned
                found = LenientManifest.from_json(json.loads((root / "manifest.json").read_text("utf-8")))
            except (OSError, ValueError) as exc:
                raise InputError(f"{root / 'manifest.json'}: not readable JSON ({exc})") from exc
            if components is None:
                components = component_labels(found.extras, found.artifacts)
            dists = dists or list(found.license.runtime_distributions)
            # An --accept-license given at build time is a recorded decision: honour it, and say so.
            accepted_at_build = list(found.license.accepted)
            accepted = list(accepted) + [a for a in accepted_at_build if a not in accepted]
            built_from = found.model_source
            if model_license is None and found.license.model_license_declared is not None:
                model_license = found.license.model_license_declared
    else:
        declared = _pyproject_license(root)
        if declared:
            fallback, deps = declared
            if not dists:
                dists = list(deps)
    tree = scan_tree(
        root,
        fallback=fallback,
        skip=GENERATED if is_bundle else frozenset(),
        payload_is_model=is_bundle,
        only=[path.name] if path.is_file() else None,
    )
    findings = list(tree.findings)
    model: list[LicenseFinding] = []
    if model_source is not None:
        source = Path(model_source)
        if not source.exists():
            raise InputError(f"model source {source} does not exist")
        model += model_findings(source, source.parent)
    for rel in tree.model_files:
        model += (gguf_findings if rel.endswith(".gguf") else onnx_findings)(root / rel, root)
    for rel in tree.cards:
        model += card_findings((root / rel).parent, root)
    if is_bundle and model_source is None and not any(m.spdx for m in model):
        model += _recorded_model_findings(root)
    if model_license is not None:
        model_license = parse_model_license(model_license)
        model.append(declared_finding(model_license, Path(model_source).name if model_source else root.name))
    if is_bundle:
        model = [m for m in model if m.spdx or not _declared_elsewhere(m, model)]
    else:
        # In a source tree a model file without a license field (a test fixture, a broken file on
        # purpose) is covered like any other file by REUSE rules. A model card that says
        # `license: unknown` is a declaration and stays.
        model = [m for m in model if m.spdx or "front matter" in m.source]
    ggufs = [(root / rel, root) for rel in tree.model_files if rel.endswith(".gguf")]
    if model_source is not None:
        source = Path(model_source)
        files = [source] if source.is_file() else sorted(source.rglob("*.gguf"))
        ggufs += [(f, source.parent) for f in files if f.suffix == ".gguf" and f.is_file()]
    model += family_findings(ggufs, model)  # a Gemma by name or architecture that declares Apache-2.0
    if model_source is not None and (pkg := package_finding(Path(model_source), model)):
        model.append(pkg)
    if is_bundle and not model:
        model.append(
            LicenseFinding(
                "model",
                root.name,
                "",
                "model card / GGUF / ONNX metadata",
                None,
                "the model declares no license anywhere we can read",
            )
        )
    findings = model + _drop_self_declared(findings, tree.without_own_info, model)
    findings += distribution_findings(dists, environment=environment)
    findings += scanoss_settings_findings(root, tree.scanoss_settings)
    scan = run_scanoss(
        root,
        tree.code_files,
        configured_url(scanoss_url),
        scanoss_api_key,
        weight_files=[w["path"] for w in tree.weights],
        timeout=scanoss_timeout,
    )
    findings += scan.findings
    accepted_ids, unused = _judge(findings, policy, accepted)
    if model_source is not None and Path(model_source).is_file():
        built_from = str(model_source)
    audit = apply_waivers(
        findings,
        waivers,
        model_aliases=_model_aliases(built_from, tree.model_files, components or {}) if is_bundle else None,
    )
    exprs = list(dict.fromkeys(m.spdx for m in model if m.spdx and m.layer == "model"))
    model_expr = " AND ".join(f"({e})" if " " in e else e for e in exprs) or None
    labels = {rel: label for rel, label in (components or {}).items() if rel not in GENERATED}
    if path.is_file():
        labels = {rel: label for rel, label in labels.items() if rel == path.name}
    parts = file_components(root, labels, tree.weights, findings, model_expr)
    return GateResult(
        str(path),
        "bundle" if is_bundle else "tree",
        policy,
        findings,
        audit,
        accepted_ids,
        unused,
        scan,
        tree.without_own_info,
        tree.vendored,
        tree.weights,
        dists,
        model_expr,
        time.perf_counter() - start,
        _missing_license_texts(root, findings),
        accepted_at_build,
        model_license,
        parts,
    )


def _missing_license_texts(root: Path, findings: list[LicenseFinding]) -> list[str]:
    """REUSE layout check: every id the tree's own files declare needs LICENSES/<id>.txt."""
    texts = root / "LICENSES"
    if not texts.is_dir():
        return []
    from edgesdk.compliance.spdx import licensing

    have = {p.stem for p in texts.iterdir() if p.is_file()}
    used: set[str] = set()
    for f in findings:
        if f.layer == "source" and f.spdx:
            try:
                used.update(licensing().license_keys(licensing().parse(f.spdx, validate=False)))
            except Exception:  # noqa: BLE001 - already reported as unknown by the policy
                continue
    return sorted(used - have)


def _drop_self_declared(
    findings: list[LicenseFinding], without_own_info: dict[str, str], model: list[LicenseFinding]
) -> list[LicenseFinding]:
    """A GGUF/ONNX file whose metadata declares a license is covered by that declaration, not by
    the tree's fallback (or by nothing)."""
    declared = {rel for m in model if m.spdx for rel in m.files}
    if not declared:
        return findings
    out = []
    for f in findings:
        if f.layer == "source" and set(f.files) & declared:
            f.files = [rel for rel in f.files if rel not in declared]
            if not f.files:
                continue
            if len(f.files) == 1:
                f.subject = f.files[0]
        out.append(f)
    for rel in declared:
        without_own_info.pop(rel, None)
    return out


def _declared_elsewhere(finding: LicenseFinding, model: list[LicenseFinding]) -> bool:
    """An artifact without a license field (e.g. an exported .onnx) is covered when the model card
    or another artifact declares one; only an undeclared model as a whole is a finding."""
    return any(m.spdx for m in model if m is not finding) and "unreadable" not in finding.note


def unlisted_license_refs(expression: str | None, policy: Policy) -> list[str]:
    """The ``LicenseRef-*`` ids in ``expression`` that the policy neither lists nor categorises."""
    if not expression:
        return []
    import re

    refs = dict.fromkeys(re.findall(r"LicenseRef-[A-Za-z0-9.\-]+", expression))
    return [r for r in refs if r not in (policy.data.get("licenses") or {}) and policy.category(r) == "unknown"]


def refuse_undeclared(name: str, read: str, shown: str, missing: str, policy_path: str | None, when: str = "") -> None:
    """LicenseGateError (exit 2) when the policy denies a model that declares no license, before the gate would see
    it: ``name`` the model's file or folder name, ``read`` where its license was looked for (the finding's source),
    ``shown`` how the message names it, ``missing`` what it lacks, ``when`` what the refusal stops."""
    policy = load_policy(Path(policy_path) if policy_path else None)
    decision = policy.evaluate(None)
    if decision.action == "deny":
        none = LicenseFinding("model", name, "", read, None, "")
        raise LicenseGateError(
            f"license gate: deny: {shown} declares no license ({missing}){when} "
            f"({decision.reason}, policy {policy.id})",
            hint=gate_hint("deny", none, policy),
        )


def gate_hint(verdict: str, worst: LicenseFinding | None, policy: Policy) -> str:
    """What clears a gate failure; for an unlisted LicenseRef (a company's own license) the policy entry."""
    if verdict == "review":
        return "clear review findings with --accept-license ID or a waiver"
    refs = unlisted_license_refs(worst.spdx if worst else None, policy)
    if refs:
        entries = ", ".join(f"{r}: allow" for r in refs)
        return (
            f"{' and '.join(refs)} {'is' if len(refs) == 1 else 'are'} in no policy: allow it in a policy file "
            f"(licenses: {{{entries}}}) passed with --license-policy FILE; waivers cannot clear a deny"
        )
    if worst is not None and worst.layer == "model" and not worst.spdx:
        return (
            "declare the model's license with --model-license SPDX-OR-LicenseRef, or change the policy "
            "(--license-policy); waivers cannot clear a deny"
        )
    return "a deny needs a policy change (--license-policy); waivers cannot clear it"


def run_license_gate(
    staging_dir: Path,
    *,
    model_source: Path,
    runtime_distributions: list[str],
    policy_path: Path | None = None,
    waivers_path: Path | None = None,
    accepted: Sequence[str] = (),
    scanoss_url: str | None = None,
    report_path: Path,
    scanoss_timeout: float | None = None,
    model_license: str | None = None,
    model_name: str | None = None,
    components: Mapping[str, str] | None = None,
    bundle_name: str | None = None,
) -> GateResult:
    """Gate packaging. On pass, writes ``sbom.cdx.json`` and ``license-report.json`` into
    ``staging_dir``; the report names what it scanned ``bundle_name`` (the bundle directory's name; default: the
    staging directory's, a temporary name that is gone once the bundle is in place). On deny, or review not
    cleared by ``accepted``/a waiver, writes the report to
    ``report_path`` and raises :class:`LicenseGateError`. A configured scanner that fails raises
    :class:`~edgesdk.errors.ExternalToolError` (fail closed)."""
    from edgesdk.compliance.report import to_json
    from edgesdk.compliance.sbom import build_sbom

    staging_dir = Path(staging_dir)
    result = scan_licenses(
        staging_dir,
        model_source=model_source,
        runtime_distributions=runtime_distributions,
        policy_path=policy_path,
        waivers_path=waivers_path,
        accepted=accepted,
        scanoss_url=scanoss_url,
        bundle=True,
        scanoss_timeout=scanoss_timeout,
        model_license=model_license,
        components=components,
    )
    result.scanned = bundle_name or staging_dir.name
    if result.verdict != "pass":
        report_path = Path(report_path)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(to_json(result), encoding="utf-8")
        worst = result.worst()
        headline = worst.headline() if worst is not None else "no finding"  # a non-pass verdict has one
        raise LicenseGateError(
            f"license gate: {result.verdict}: {headline} (report: {report_path})",
            hint=gate_hint(result.verdict, worst, result.policy),
        )
    name = model_name or Path(model_source).name
    (staging_dir / SBOM_NAME).write_text(of_result(build_sbom, name, result), encoding="utf-8")
    (staging_dir / SPDX_NAME).write_text(of_result(build_spdx, name, result), encoding="utf-8")
    (staging_dir / REPORT_NAME).write_text(to_json(result), encoding="utf-8")
    return result
