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

Waivers must name what they waive (docs/licenses.md "Waivers"): a path, a package or a license id.
A pattern may narrow a named thing, never stand for it:

- a ``subject`` without a ``license`` names its thing before any wildcard (:func:`named_thing`): the
  whole subject when it has no wildcard (a file, a directory, a model name), else a literal package
  name followed by ``==`` (``crc32c==2.*``) or a literal first directory followed by ``/``
  (``vendor/*``, ``src/legacy_*.c``). ``*.gguf``, ``*0*``, ``gemma*``, ``*/LICENSE``, ``*==1.0`` stand
  for whatever happens to match and are refused;
- a waiver without a ``license`` that matches more than :data:`MAX_SUBJECT_MATCHES` findings of
  one scan is refused (name the license, or narrow the glob);
- a deny-level finding (strong/network copyleft, non-commercial, proprietary, unknown) is never
  waived: clearing one is a policy change (``--policy``), reviewed like one. Such a waiver is listed
  as ``refused`` in the audit and the finding stays denied.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgesdk.compliance.findings import LAYERS, LicenseFinding
from edgesdk.compliance.spdx import normalize, read_user_yaml
from edgesdk.errors import InputError

_REQUIRED = ("id", "by", "reason", "expires")
MAX_SUBJECT_MATCHES = 10  # a waiver without a license may match at most this many findings
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

    def matches(self, finding: LicenseFinding, alias: str | None = None) -> bool:
        """``alias``: another name of the finding's file (a bundle's model file: the model file it was built
        from); the subject glob may match either."""
        if self.layer and finding.layer != self.layer:
            return False
        if self.subject and not any(
            fnmatch.fnmatchcase(name, self.subject) for name in (finding.subject, alias) if name
        ):
            return False
        if self.license and self.license not in {finding.spdx, finding.chosen}:
            return False
        return True

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "by": self.by,
            "reason": self.reason,
            "expires": self.expires.isoformat(),
            "license": self.license,
            "subject": self.subject,
            "layer": self.layer,
        }


def _literal_chars(pattern: str) -> str:
    """The characters a glob matches literally (outside ``*``, ``?`` and ``[...]`` sets)."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c in "*?":
            continue
        if c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:  # a complete set: matches one character of a class, names nothing
                i = j + 1
                continue
        out.append(c)
    return "".join(out)


_WILDCARDS = "*?["


def named_thing(subject: str) -> str | None:
    """What a waiver's ``subject`` names, or None when a wildcard stands where the name should be.

    Every finding subject the gate reports is a file or directory path (``a/b.py``), a distribution
    ``name==version`` or a model name. A subject names its thing when each subject it can match has
    the same package name (the part before the first ``==``, when no ``/`` comes before it), the same
    first path component (when it contains ``/``), or is the subject itself (no wildcard at all).
    The named part must hold a letter or digit (``.``, ``..``, ``-`` name nothing).
    """
    cut = min((i for i in (subject.find(c) for c in _WILDCARDS) if i >= 0), default=-1)
    if cut < 0:  # no wildcard: the subject is the name
        return subject if any(c.isalnum() for c in subject) else None
    prefix = subject[:cut]  # literal: every match starts with it
    eq, slash = prefix.find("=="), prefix.find("/")
    if eq >= 0 and (slash < 0 or slash > eq):
        name = prefix[:eq]  # a package: crc32c==*
    elif slash >= 0:
        name = prefix[:slash]  # a directory: vendor/*
    else:
        return None  # the wildcard stands for the name itself
    return name if any(c.isalnum() for c in name) else None


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
        subject = entry.get("subject")
        if subject is not None and (not isinstance(subject, str) or not subject.strip()):
            raise InputError(
                f"{where} ({entry['id']}): subject must be a non-empty string (a file, "
                "name==version or model name, globs allowed)"
            )
        if subject and not entry.get("license"):
            if not any(c.isalnum() for c in _literal_chars(subject)):
                raise InputError(
                    f"{where} ({entry['id']}) subject {subject!r} without a license would waive "
                    "everything: it names nothing (only wildcards); name the file or package it "
                    "waives, or add the license"
                )
            if named_thing(subject) is None:
                raise InputError(
                    f"{where} ({entry['id']}) subject {subject!r} without a license names no file, "
                    "directory or package: a wildcard stands for the name (a pattern may narrow a "
                    "named thing, e.g. 'vendor/*' or 'crc32c==*', never stand for it); name what "
                    "it waives, or add the license"
                )
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
        if entry.get("license") and not lic:
            raise InputError(f"{where} ({wid}): license {entry['license']!r} is not a license expression")
        waivers.append(
            Waiver(wid, str(entry["by"]), str(entry["reason"]), expires, lic, entry.get("subject"), entry.get("layer"))
        )
    return waivers


def apply_waivers(
    findings: list[LicenseFinding],
    waivers: list[Waiver],
    today: dt.date | None = None,
    model_aliases: Mapping[str, str] | None = None,
) -> dict:
    """Mark waived findings; return the audit record {applied, expired, unmatched}.

    ``model_aliases``: subject of a ``model``-layer finding -> the name of the model file it was built from
    (a bundle's ``model.gguf`` -> ``gemma-3-270m-q4_k_m.gguf``): a waiver that names the model file as the
    user gave it to ``build`` clears the bundle's copy of it too."""
    today = today or dt.date.today()
    aliases = model_aliases or {}
    applied, expired, unmatched, refused = [], [], [], []
    for waiver in waivers:
        hits = [
            f
            for f in findings
            if f.action != "allow" and waiver.matches(f, aliases.get(f.subject) if f.layer == "model" else None)
        ]
        if not waiver.license and len(hits) > MAX_SUBJECT_MATCHES:
            raise InputError(
                f"waiver {waiver.id}: subject {waiver.subject!r} without a license matches "
                f"{len(hits)} findings (limit {MAX_SUBJECT_MATCHES}); waivers must name what they "
                "waive: narrow the subject or add the license"
            )
        if waiver.expired(today):
            expired.append({**waiver.to_dict(), "would_match": [f.subject for f in hits]})
            continue
        denied = [f for f in hits if f.action == "deny"]
        if denied:
            refused.append(
                {
                    **waiver.to_dict(),
                    "refused": [f"{f.layer}:{f.subject}" for f in denied],
                    "why": "deny-level findings cannot be waived: change the policy (--policy) instead",
                }
            )
        hits = [f for f in hits if f.action != "deny"]
        if not hits:
            if not denied:
                unmatched.append(waiver.to_dict())
            continue
        for finding in hits:
            if not finding.waived_by:
                finding.waived_by = waiver.id
        applied.append({**waiver.to_dict(), "matched": [f"{f.layer}:{f.subject}" for f in hits]})
    return {"applied": applied, "expired": expired, "unmatched": unmatched, "refused": refused}
