# SPDX-License-Identifier: Apache-2.0
"""CycloneDX 1.6 SBOM of a bundle: the model (MACHINE_LEARNING_MODEL), the runtime's Python
distributions, vendored code directories and the weight files, each with its license."""

from __future__ import annotations

import warnings
from pathlib import Path

from edgesdk.compliance.findings import LicenseFinding


def _licenses(expression: str | None):
    from cyclonedx.model.license import LicenseExpression

    return [LicenseExpression(expression)] if expression else []


def build_sbom(name: str, findings: list[LicenseFinding], weights: list[dict], vendored: list[dict],
               model_expression: str | None, *, declared: str | None = None) -> str:
    """Return the SBOM as a JSON string (CycloneDX 1.6). ``declared``: the builder's ``--model-license``
    (part of ``model_expression``), recorded as a property of the model component too."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    from edgesdk import __version__

    bom = Bom()
    root = Component(name=name, type=ComponentType.APPLICATION, bom_ref="bundle",
                     properties=[Property(name="edgesdk:version", value=__version__)])
    bom.metadata.component = root
    model = Component(name=f"{name} model", type=ComponentType.MACHINE_LEARNING_MODEL, bom_ref="model",
                      licenses=_licenses(model_expression),
                      properties=[Property(name="edgesdk:model-license-declared", value=declared)] if declared else [])
    bom.components.add(model)
    children = [model]
    for w in weights:
        comp = Component(name=w["path"], type=ComponentType.FILE, bom_ref=f"file:{w['path']}",
                         hashes=[HashType(alg=HashAlgorithm.SHA_256, content=w["sha256"])],
                         licenses=_licenses(model_expression),
                         properties=[Property(name="edgesdk:bytes", value=str(w["bytes"]))])
        model.components.add(comp)
    for f in findings:
        if f.layer != "distribution" or "==" not in f.subject:
            continue
        dist_name, version = f.subject.split("==", 1)
        comp = Component(name=dist_name, version=version, type=ComponentType.LIBRARY,
                         bom_ref=f"pypi:{dist_name}@{version}",
                         purl=PackageURL(type="pypi", name=dist_name.lower(), version=version),
                         licenses=_licenses(f.spdx))
        bom.components.add(comp)
        children.append(comp)
    for v in vendored:
        comp = Component(name=v["path"], type=ComponentType.LIBRARY, bom_ref=f"vendored:{v['path']}",
                         licenses=_licenses(v["spdx"]),
                         properties=[Property(name="edgesdk:license-file", value=v["license_file"])])
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
