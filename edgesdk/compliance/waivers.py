# SPDX-License-Identifier: Apache-2.0
"""Waivers: a person takes responsibility for one finding, with a reason and an expiry.

A waiver never removes a finding: it marks it ``waived_by`` and the report keeps the policy's
original action next to it. Expired waivers and waivers that match nothing are reported.

File format (YAML)::

    waivers:
      - id: W-1                      # unique
        license: LGPL-2.1-or-later   # what it covers: an SPDX id/expression (as normalised) ...
        subject: "crc32c==*"         # ... and/or a glob on the finding's subject
        layer: distribution          # optional
        by: jane@example.com         # who
        reason: "linked dynamically; relink instructions in docs/relink.md"   # why
        expires: 2027-03-31          # until when (ISO date)
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass
from pathlib import Path

from edgesdk.compliance.findings import LAYERS, LicenseFinding
from edgesdk.compliance.spdx import normalize, read_user_yaml
from edgesdk.errors import InputError

_REQUIRED = ("id", "by", "reason", "expires")
_ALLOWED = set(_REQUIRED) | {"license", "subject", "layer"}


@dataclass
class Waiver:
    id: str
    by: str
    reason: str
    expires: dt.date
    license: str | None = None
    subject: str | None = None
    layer: str | None = None

    def expired(self, today: dt.date) -> bool:
        return today > self.expires

    def matches(self, finding: LicenseFinding) -> bool:
        if self.layer and finding.layer != self.layer:
            return False
        if self.subject and not fnmatch.fnmatchcase(finding.subject, self.subject):
            return False
        if self.license and self.license not in {finding.spdx, finding.chosen}:
            return False
        return True

    def to_dict(self) -> dict:
        return {"id": self.id, "by": self.by, "reason": self.reason, "expires": self.expires.isoformat(),
                "license": self.license, "subject": self.subject, "layer": self.layer}


def load_waivers(path: Path | None) -> list[Waiver]:
    if path is None:
        return []
    path = Path(path)
    data = read_user_yaml(path, "waivers file")
    entries = data.get("waivers") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise InputError(f"{path}: expected a top-level 'waivers:' list")
    waivers, seen = [], set()
    for index, entry in enumerate(entries):
        where = f"{path}: waivers[{index}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where} must be a mapping")
        missing = [k for k in _REQUIRED if not str(entry.get(k) or "").strip()]
        if missing:
            raise InputError(f"{where} lacks {', '.join(missing)} (every waiver needs id, by, reason, expires)")
        extra = set(entry) - _ALLOWED
        if extra:
            raise InputError(f"{where}: unknown key(s) {sorted(extra)}")
        if not entry.get("license") and not entry.get("subject"):
            raise InputError(f"{where} ({entry['id']}) names neither license nor subject: it would waive everything")
        if entry.get("subject") in ("*", "**") and not entry.get("license"):
            raise InputError(f"{where} ({entry['id']}) subject '*' without a license would waive everything")
        if entry.get("layer") and entry["layer"] not in LAYERS:
            raise InputError(f"{where}: layer {entry['layer']!r} is not one of {list(LAYERS)}")
        expires = entry["expires"]
        if not isinstance(expires, dt.date):
            try:
                expires = dt.date.fromisoformat(str(expires))
            except ValueError as exc:
                raise InputError(f"{where}: expires {expires!r} is not an ISO date (YYYY-MM-DD)") from exc
        wid = str(entry["id"])
        if wid in seen:
            raise InputError(f"{where}: duplicate waiver id {wid}")
        seen.add(wid)
        lic = normalize(str(entry["license"])).expression if entry.get("license") else None
        waivers.append(Waiver(wid, str(entry["by"]), str(entry["reason"]), expires, lic,
                              entry.get("subject"), entry.get("layer")))
    return waivers


def apply_waivers(findings: list[LicenseFinding], waivers: list[Waiver],
                  today: dt.date | None = None) -> dict:
    """Mark waived findings; return the audit record {applied, expired, unmatched}."""
    today = today or dt.date.today()
    applied, expired, unmatched = [], [], []
    for waiver in waivers:
        hits = [f for f in findings if f.action != "allow" and waiver.matches(f)]
        if waiver.expired(today):
            expired.append({**waiver.to_dict(), "would_match": [f.subject for f in hits]})
            continue
        if not hits:
            unmatched.append(waiver.to_dict())
            continue
        for finding in hits:
            if not finding.waived_by:
                finding.waived_by = waiver.id
        applied.append({**waiver.to_dict(), "matched": [f"{f.layer}:{f.subject}" for f in hits]})
    return {"applied": applied, "expired": expired, "unmatched": unmatched}
