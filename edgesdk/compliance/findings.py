# SPDX-License-Identifier: Apache-2.0
"""What the license scanners report: one :class:`LicenseFinding` per license declaration found."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ACTIONS = ("allow", "review", "deny")  # ordered: a later action is worse
LAYERS = ("model", "model-package", "distribution", "source", "license-file", "scanoss", "settings")
#: The source of a model finding made from contradicting signals (compliance/models.family_findings): its
#: ``found`` says which, and the headline carries it.
SIGNALS_SOURCE = "GGUF architecture / name / basename / tags (contradicting signals)"


def worse(a: str, b: str) -> str:
    return a if ACTIONS.index(a) >= ACTIONS.index(b) else b


@dataclass
class LicenseFinding:
    layer: str  # one of LAYERS: where in the bundle the license applies
    subject: str  # file path relative to the scan root, "name==version", or the model's name
    found: str  # the license exactly as found (truncated), "" when nothing was declared
    source: str  # where it was found, e.g. "README.md front matter license", "METADATA License"
    spdx: str | None  # normalised SPDX expression (None: nothing usable)
    note: str = ""  # how `found` became `spdx`
    files: list[str] = field(default_factory=list)  # files this declaration covers (grouped)
    # Filled in by the policy:
    category: str = "unknown"
    action: str = "deny"
    chosen: str | None = None  # the side of an OR expression the policy picked
    reason: str = ""
    # Filled in by waivers / --accept-license; the policy action above is never rewritten.
    waived_by: str | None = None
    accepted_as: list[str] = field(default_factory=list)

    @property
    def effective_action(self) -> str:
        if self.action == "allow":
            return "allow"
        if self.waived_by:
            return "allow"
        if self.action == "review" and self.accepted_as:
            return "allow"
        return self.action

    @property
    def resolution(self) -> str:
        """How the policy action was resolved, for tables: "", "waived (W-1)", "accepted"."""
        if self.action == "allow":
            return ""
        if self.waived_by:
            return f"waived ({self.waived_by})"
        if self.action == "review" and self.accepted_as:
            return "accepted (--accept-license " + ",".join(self.accepted_as) + ")"
        return ""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["effective_action"] = self.effective_action
        if len(out["files"]) > 50:  # keep reports readable; the count stays exact
            out["files_total"] = len(out["files"])
            out["files"] = out["files"][:50]
        return out

    def headline(self) -> str:
        lic = self.spdx or (self.found or "no license")
        why = f": {self.found}" if self.source == SIGNALS_SOURCE else ""
        return f"{self.action} {self.category} {lic} in {self.layer} {self.subject}{why}"
