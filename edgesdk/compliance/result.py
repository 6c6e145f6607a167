# SPDX-License-Identifier: Apache-2.0
"""The result of a license scan (:class:`GateResult`) and the names of the files it is written to.

Its own module so that the gate (:mod:`edgesdk.compliance.gate`, which produces it) and the renderers
(:mod:`edgesdk.compliance.report`, which read it) both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgesdk.compliance.findings import ACTIONS, LicenseFinding, worse

if TYPE_CHECKING:
    from edgesdk.compliance.policy import Policy
    from edgesdk.compliance.scanoss_match import ScanossResult

REPORT_NAME = "license-report.json"
SBOM_NAME = "sbom.cdx.json"
_VERDICT = {"allow": "pass", "review": "review", "deny": "deny"}


@dataclass
class GateResult:
    scanned: str
    mode: str  # "bundle" | "tree"
    policy: Policy
    findings: list[LicenseFinding]
    waiver_audit: dict
    accepted: list[str]
    unused_accepts: list[str]
    scanoss: ScanossResult
    without_own_info: dict[str, str] = field(default_factory=dict)
    vendored: list[dict] = field(default_factory=list)
    weights: list[dict] = field(default_factory=list)
    runtime_distributions: list[str] = field(default_factory=list)
    model_expression: str | None = None
    elapsed_s: float = 0.0
    missing_license_texts: list[str] = field(default_factory=list)  # REUSE: ids with no LICENSES/<id>.txt
    accepted_at_build: list[str] = field(default_factory=list)  # read back from a bundle's manifest
    model_license_declared: str | None = None  # --model-license at build (also read back from a manifest)
    # each component file with its own license and sha256 (compliance/components.py)
    components: list[dict] = field(default_factory=list)

    def _worst(self, attr: str) -> str:
        action = "allow"
        for f in self.findings:
            action = worse(action, getattr(f, attr))
        return _VERDICT[action]

    @property
    def policy_verdict(self) -> str:
        """Verdict from the policy alone, before waivers and --accept-license."""
        return self._worst("action")

    @property
    def verdict(self) -> str:
        """Verdict after waivers and --accept-license."""
        return self._worst("effective_action")

    def counts(self) -> dict[str, int]:
        c = {a: sum(1 for f in self.findings if f.action == a) for a in ACTIONS}
        c["waived"] = sum(1 for f in self.findings if f.waived_by and f.action != "allow")
        c["accepted"] = sum(1 for f in self.findings if f.action == "review" and f.accepted_as and not f.waived_by)
        return c

    def worst(self) -> LicenseFinding | None:
        ranked = sorted(
            self.findings, key=lambda f: (ACTIONS.index(f.effective_action), ACTIONS.index(f.action)), reverse=True
        )
        return ranked[0] if ranked else None

    def to_manifest(self) -> dict:
        return {
            "verdict": self.verdict,
            "policy_verdict": self.policy_verdict,
            "counts": self.counts(),
            "accepted": self.accepted,
            "waivers_used": [w["id"] for w in self.waiver_audit["applied"]],
            "policy": {"id": self.policy.id, "sha256": self.policy.sha256},
            "model_license": self.model_expression,
            "model_license_declared": self.model_license_declared,
            "runtime_distributions": self.runtime_distributions,
            "sbom": SBOM_NAME,
            "report": REPORT_NAME,
        }

    def to_report(self) -> dict:
        worst = self.worst()
        return {
            "schema": "edgesdk.license-report/1",
            "scanned": self.scanned,
            "mode": self.mode,
            "verdict": self.verdict,
            "policy_verdict": self.policy_verdict,
            "counts": self.counts(),
            "worst": worst.to_dict() if worst and self.verdict != "pass" else None,
            "policy": {"id": self.policy.id, "sha256": self.policy.sha256, "sources": self.policy.sources},
            "accepted": self.accepted,
            "accepted_at_build": self.accepted_at_build,
            "unused_accepts": self.unused_accepts,
            "waivers": self.waiver_audit,
            "model_license": self.model_expression,
            "model_license_declared": self.model_license_declared,
            "runtime_distributions": self.runtime_distributions,
            "findings": [f.to_dict() for f in self.findings],
            "vendored": self.vendored,
            "weights": self.weights,
            "components": self.components,
            "files_without_own_license_info": self.without_own_info,
            "missing_license_texts": self.missing_license_texts,
            "scanoss": self.scanoss.to_dict(),
            "elapsed_s": round(self.elapsed_s, 3),
        }
