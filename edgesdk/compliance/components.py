# SPDX-License-Identifier: Apache-2.0
"""A bundle's component files, each with its own license and SHA-256, for the SBOMs and the gate's report.

A multi-file bundle (a VLM: vision encoder + projector in ``mmproj.gguf``, the language decoder in
``model.gguf``, the image preprocessing in ``preprocessor_config.json``) is listed file by file. What
each file *is* comes from the manifest: a format's ``extras.<format>.components`` mapping
(``{"vision_encoder": {"artifact": "mmproj.gguf"}, ...}``) names the components a file holds; any
other artifact is named by its role (``config``, ``tokenizer``, ...). Which license covers a file,
first match wins:

1. the file's own metadata (GGUF ``general.license*``, ONNX ``metadata_props``);
2. the file's own header / ``.license`` sidecar / REUSE.toml annotation, or the LICENSE file that covers it;
3. the model's license (bundle payload without a declaration of its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from edgesdk.compliance.findings import LicenseFinding
from edgesdk.manifest import ArtifactRecord, component_table

#: Artifacts the gate writes itself: not components of the model.
GATE_ROLES = frozenset({"sbom", "sbom-spdx", "license-report"})
MODEL_FALLBACK = "the model's license (no declaration of its own)"


def component_labels(extras: Mapping[str, Any] | None, artifacts: Iterable[Any]) -> dict[str, str]:
    """bundle-relative path -> what the file is: the components a format's ``extras.*.components``
    puts in it (:func:`~edgesdk.manifest.component_table`, joined with " + ", in the format's order), else
    its artifact role. ``artifacts``: manifest :class:`~edgesdk.manifest.Artifact` objects, their dicts
    (``path``, ``role``) or :class:`~edgesdk.manifest.ArtifactRecord` objects."""
    out = {path: " + ".join(names) for path, names in component_table(extras).items()}
    for a in map(ArtifactRecord.of, artifacts):
        if a.path is not None and a.path not in out and a.role not in GATE_ROLES:
            out[a.path] = a.role or "file"
    return out


def _covering(rel: str, findings: list[LicenseFinding]) -> tuple[str | None, str] | None:
    for layers in (("model",), ("source", "license-file")):
        for f in findings:
            if f.layer in layers and rel in f.files and f.spdx:
                where = f"license file {f.subject}" if f.layer == "license-file" else f.source
                return f.spdx, where
    return None


def file_components(
    root: Path,
    labels: Mapping[str, str],
    weights: list[dict],
    findings: list[LicenseFinding],
    model_expression: str | None,
) -> list[dict]:
    """One entry per component file (the labelled files and every weight file):
    ``{path, component, sha256, bytes, license, license_source}``, sorted by path."""
    from edgesdk.compliance.sources import sha256_file

    by_path = {w["path"]: w for w in weights}
    out = []
    for rel in sorted(set(labels) | set(by_path)):
        w = by_path.get(rel)
        if w is None:
            path = root / rel
            if not path.is_file():
                continue  # listed in the manifest but not in this tree (e.g. a partial scan)
            w = {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}
        own = _covering(rel, findings)
        lic, where = own if own is not None else (model_expression, MODEL_FALLBACK)
        out.append(
            {
                "path": rel,
                "component": labels.get(rel, "weights"),
                "sha256": w["sha256"],
                "bytes": w["bytes"],
                "license": lic,
                "license_source": where,
            }
        )
    return out
