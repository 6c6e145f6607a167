# SPDX-License-Identifier: Apache-2.0
"""CycloneDX 1.6 SBOM of a bundle: the model (MACHINE_LEARNING_MODEL), the runtime's Python
distributions, vendored code directories and the component files (weights, and in a multi-file
bundle every file that is part of the model, e.g. a VLM's mmproj, decoder and preprocessor config),
each with its own license and SHA-256.

The ``weights`` argument of both builders takes the entries of
:func:`~edgesdk.compliance.components.file_components` (``path``, ``sha256``, ``bytes``, ``component``,
``license``, ``license_source``) or plain weight entries (``path``, ``sha256``, ``bytes``: the
model's license applies)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.compliance.findings import LicenseFinding

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgesdk.compliance.result import GateResult


def _licenses(expression: str | None):
    from cyclonedx.model.license import LicenseExpression

    return [LicenseExpression(expression)] if expression else []


def of_result(build: Callable[..., str], name: str, result: GateResult) -> str:
    """``build`` (:func:`build_sbom` or :func:`build_spdx`) over what a license scan found: its findings, component
    files, vendored code, the model's license expression and the declared ``--model-license``."""
    return build(
        name,
        result.findings,
        result.components,
        result.vendored,
        result.model_expression,
        declared=result.model_license_declared,
    )


def build_sbom(
    name: str,
    findings: list[LicenseFinding],
    weights: list[dict],
    vendored: list[dict],
    model_expression: str | None,
    *,
    declared: str | None = None,
) -> str:
    """Return the SBOM as a JSON string (CycloneDX 1.6). ``declared``: the builder's ``--model-license``
    (part of ``model_expression``), recorded as a property of the model component too."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    from edgesdk import __version__

    bom = Bom()
    root = Component(
        name=name,
        type=ComponentType.APPLICATION,
        bom_ref="bundle",
        properties=[Property(name="edgesdk:version", value=__version__)],
    )
    bom.metadata.component = root
    model = Component(
        name=f"{name} model",
        type=ComponentType.MACHINE_LEARNING_MODEL,
        bom_ref="model",
        licenses=_licenses(model_expression),
        properties=[Property(name="edgesdk:model-license-declared", value=declared)] if declared else [],
    )
    bom.components.add(model)
    children = [model]
    for w in weights:
        props = [Property(name="edgesdk:bytes", value=str(w["bytes"]))]
        if w.get("component"):
            props.append(Property(name="edgesdk:component", value=str(w["component"])))
        if w.get("license_source"):
            props.append(Property(name="edgesdk:license-source", value=str(w["license_source"])))
        comp = Component(
            name=w["path"],
            type=ComponentType.FILE,
            bom_ref=f"file:{w['path']}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=w["sha256"])],
            licenses=_licenses(_file_license(w, model_expression)),
            description=str(w["component"]) if w.get("component") else None,
            properties=props,
        )
        model.components.add(comp)
    for f in findings:
        if f.layer != "distribution" or "==" not in f.subject:
            continue
        dist_name, version = f.subject.split("==", 1)
        comp = Component(
            name=dist_name,
            version=version,
            type=ComponentType.LIBRARY,
            bom_ref=f"pypi:{dist_name}@{version}",
            purl=PackageURL(type="pypi", name=dist_name.lower(), version=version),
            licenses=_licenses(f.spdx),
        )
        bom.components.add(comp)
        children.append(comp)
    for v in vendored:
        comp = Component(
            name=v["path"],
            type=ComponentType.LIBRARY,
            bom_ref=f"vendored:{v['path']}",
            licenses=_licenses(v["spdx"]),
            properties=[Property(name="edgesdk:license-file", value=v["license_file"])],
        )
        bom.components.add(comp)
        children.append(comp)
    bom.register_dependency(root, children)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cyclonedx warns about incomplete graphs of leaf components
        return JsonV1Dot6(bom).output_as_string(indent=2)


def validate_sbom(text: str) -> str | None:
    """None when valid against the strict CycloneDX 1.6 JSON schema, else the first error."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return None if error is None else str(error)[:300]


def write_sbom(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- SPDX 2.3

SPDX_NAME = "sbom.spdx.json"
#: Document-level fields SPDX 2.3 requires (spec clause 6), and each package's (clause 7).
SPDX_REQUIRED = ("spdxVersion", "dataLicense", "SPDXID", "name", "documentNamespace", "creationInfo")
SPDX_PACKAGE_REQUIRED = ("SPDXID", "name", "downloadLocation")


def _spdx_id(kind: str, text: str) -> str:
    """``SPDXRef-<kind>-<text>`` with only the characters SPDX allows (letters, digits, '.', '-')."""
    import re

    return f"SPDXRef-{kind}-" + (re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x")


def _spdx_license(expression: str | None) -> str:
    return expression or "NOASSERTION"


def _file_license(entry: dict, model_expression: str | None) -> str | None:
    """A component file's own license (components.file_components), else the model's."""
    return entry["license"] if "license" in entry else model_expression


def _spdx_package(
    spdx_id: str,
    name: str,
    purpose: str,
    concluded: str,
    declared: str | None = None,
    *,
    version: str | None = None,
    download: str = "NOASSERTION",
    checksums: list[dict] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """One SPDX 2.3 package, its fields in the order every package of the document has them: not analysed
    file by file, no copyright text asserted; ``declared`` defaults to ``concluded``; ``more`` (comment,
    externalRefs) after the required and license fields."""
    package: dict[str, Any] = {"SPDXID": spdx_id, "name": name}
    if version is not None:
        package["versionInfo"] = version
    package.update(downloadLocation=download, filesAnalyzed=False)
    if checksums is not None:
        package["checksums"] = checksums
    package.update(
        licenseConcluded=concluded,
        licenseDeclared=concluded if declared is None else declared,
        copyrightText="NOASSERTION",
        primaryPackagePurpose=purpose,
        **more,
    )
    return package


def _spdx_rel(element: str, kind: str, related: str) -> dict[str, str]:
    return {"spdxElementId": element, "relationshipType": kind, "relatedSpdxElement": related}


def _pypi_package(finding: LicenseFinding) -> dict[str, Any]:
    """A runtime Python distribution (a finding of subject ``name==version``) as an SPDX LIBRARY package
    with its PyPI download location and purl; concluded: the license chosen of its alternatives, if any."""
    dist, version = finding.subject.split("==", 1)
    return _spdx_package(
        _spdx_id("Package", f"pypi-{dist}-{version}"),
        dist,
        "LIBRARY",
        _spdx_license(finding.chosen or finding.spdx),
        _spdx_license(finding.spdx),
        version=version,
        download=f"https://pypi.org/project/{dist}/{version}/",
        externalRefs=[
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:pypi/{dist.lower()}@{version}",
            }
        ],
    )


def _spdx_document(name: str, root_id: str, packages: list[dict], rels: list[dict], created: str) -> str:
    """The SPDX 2.3 JSON document around the packages and relationships: its required fields, a fresh
    namespace, and one ``hasExtractedLicensingInfos`` entry for every ``LicenseRef-*`` a package uses."""
    import json
    import re
    import uuid

    from edgesdk import __version__

    refs = sorted(
        {
            m
            for p in packages
            for key in ("licenseConcluded", "licenseDeclared")
            for m in re.findall(r"LicenseRef-[A-Za-z0-9.-]+", p[key])
        }
    )
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-") or "bundle"
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{name} bundle",
        "documentNamespace": f"https://spdx.org/spdxdocs/edgesdk-{slug}-{uuid.uuid4()}",
        "creationInfo": {"created": created, "creators": [f"Tool: edgesdk-{__version__}"]},
        "documentDescribes": [root_id],
        "packages": packages,
        "relationships": rels,
    }
    if refs:
        doc["hasExtractedLicensingInfos"] = [
            {
                "licenseId": r,
                "name": r.removeprefix("LicenseRef-"),
                "extractedText": f"{r}: a license with no SPDX identifier, named as the license scan found it; "
                "see license-report.json for where it was found.",
            }
            for r in refs
        ]
    return json.dumps(doc, indent=2) + "\n"


def build_spdx(
    name: str,
    findings: list[LicenseFinding],
    weights: list[dict],
    vendored: list[dict],
    model_expression: str | None,
    *,
    declared: str | None = None,
    created: str | None = None,
) -> str:
    """The same inventory as :func:`build_sbom` as an SPDX 2.3 JSON document: the bundle package
    DESCRIBES-d by the document, CONTAINS the model, its weight files (packages of purpose FILE with
    their SHA-256, so no SHA-1 per file is needed) and vendored code, DEPENDS_ON the runtime's Python
    distributions (with their purl). Every ``LicenseRef-*`` used gets a ``hasExtractedLicensingInfos``
    entry, as SPDX requires."""
    import datetime as dt

    from edgesdk import __version__

    created = created or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    root_id = _spdx_id("Package", f"bundle-{name}")
    model_id = _spdx_id("Package", f"model-{name}")
    model_license = _spdx_license(model_expression)
    packages: list[dict] = [
        _spdx_package(
            root_id,
            name,
            "APPLICATION",
            "NOASSERTION",
            version=__version__,
            comment=f"edgesdk bundle (edgesdk {__version__})",
        ),
        _spdx_package(
            model_id,
            f"{name} model",
            "OTHER",
            model_license,
            comment="machine-learning model"
            + (f"; license declared at build (--model-license): {declared}" if declared else ""),
        ),
    ]
    rels = [_spdx_rel("SPDXRef-DOCUMENT", "DESCRIBES", root_id), _spdx_rel(root_id, "CONTAINS", model_id)]
    for w in weights:
        wid = _spdx_id("File", w["path"])
        entry = _spdx_package(
            wid,
            w["path"],
            "FILE",
            _spdx_license(_file_license(w, model_expression)),
            checksums=[{"algorithm": "SHA256", "checksumValue": w["sha256"]}],
            comment=f"{w['bytes']} bytes"
            + (f"; license from {w['license_source']}" if w.get("license_source") else ""),
        )
        if w.get("component"):
            entry["summary"] = f"component: {w['component']}"
        packages.append(entry)
        rels.append(_spdx_rel(model_id, "CONTAINS", wid))
    for f in findings:
        if f.layer == "distribution" and "==" in f.subject:
            packages.append(_pypi_package(f))
            rels.append(_spdx_rel(root_id, "DEPENDS_ON", packages[-1]["SPDXID"]))
    for v in vendored:
        vid = _spdx_id("Package", f"vendored-{v['path']}")
        packages.append(
            _spdx_package(
                vid,
                v["path"],
                "LIBRARY",
                _spdx_license(v["spdx"]),
                comment=f"vendored code; license file {v['license_file']}",
            )
        )
        rels.append(_spdx_rel(root_id, "CONTAINS", vid))
    return _spdx_document(name, root_id, packages, rels, created)


def check_spdx(doc: dict) -> list[str]:
    """What an SPDX 2.3 JSON document lacks of the required fields, and relationships to unknown
    elements (empty: complete). A structural check, not a license-expression parser."""
    problems = [f"missing {k}" for k in SPDX_REQUIRED if not doc.get(k)]
    if doc.get("spdxVersion") not in (None, "SPDX-2.3"):
        problems.append(f"spdxVersion {doc['spdxVersion']!r} is not SPDX-2.3")
    if doc.get("dataLicense") not in (None, "CC0-1.0"):
        problems.append("dataLicense must be CC0-1.0")
    info = doc.get("creationInfo") or {}
    if not info.get("created") or not info.get("creators"):
        problems.append("creationInfo needs created and creators")
    ids = {"SPDXRef-DOCUMENT"}
    for i, p in enumerate(doc.get("packages") or []):
        problems += [f"package {i} missing {k}" for k in SPDX_PACKAGE_REQUIRED if not p.get(k)]
        ids.add(p.get("SPDXID"))
    for r in doc.get("relationships") or []:
        for k in ("spdxElementId", "relatedSpdxElement"):
            if r.get(k) not in ids:
                problems.append(f"relationship to unknown element {r.get(k)!r}")
    return problems
