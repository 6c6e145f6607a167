# SPDX-License-Identifier: Apache-2.0
"""License policy as data: categories -> allow/review/deny, per-id overrides, WITH exceptions.

The shipped policy is ``edgesdk/data/licenses/default-policy.yaml``; a user policy extends it
(same keys replace, the rest stays). Expressions are evaluated on their disjunctive normal form:
an ``OR`` picks the best side (and records which), an ``AND`` is as bad as its worst part.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from edgesdk.compliance.findings import ACTIONS, worse
from edgesdk.compliance.spdx import licensing, load_data, normalize, read_user_yaml
from edgesdk.errors import InputError

CATEGORIES = (
    "public-domain",
    "permissive",
    "file-copyleft",
    "weak-copyleft",
    "strong-copyleft",
    "network-copyleft",
    "non-commercial",
    "restricted-model",
    "proprietary",
    "unknown",
)
_POLICY_KEYS = {"id", "version", "extends", "categories", "licenses", "exceptions", "license_categories"}


@dataclass(frozen=True)
class Decision:
    category: str
    action: str
    chosen: str | None  # the OR side picked, when the expression had more than one
    reason: str
    review_ids: tuple[str, ...] = ()  # ids that made the chosen side "review" (for --accept-license)


@functools.lru_cache(maxsize=1)
def _category_of_default() -> dict[str, str]:
    out = {}
    for category, ids in load_data("categories.yaml").items():
        for lid in ids:
            out[lid] = category
    return out


class Policy:
    def __init__(self, data: dict, sources: list[str]):
        self.data = data
        self.sources = sources
        self.id = str(data.get("id", "unnamed"))
        canonical = json.dumps(data, sort_keys=True, default=str).encode()
        self.sha256 = hashlib.sha256(canonical).hexdigest()
        self._category_of = dict(_category_of_default())
        self._category_of.update(data.get("license_categories") or {})

    def category(self, license_id: str) -> str:
        return self._category_of.get(license_id, "unknown")

    def _symbol_action(self, key: str) -> tuple[str, str, str]:
        """(category, action, reason) for one license id."""
        category = self.category(key)
        override = (self.data.get("licenses") or {}).get(key)
        if override:
            return category, override, f"{key}: policy entry {override}"
        action = self.data["categories"].get(category, "deny")
        return category, action, f"{key}: {category} -> {action}"

    def evaluate(self, expression: str | None) -> Decision:
        if not expression:
            action = self.data["categories"].get("unknown", "deny")
            return Decision("unknown", action, None, f"no license declared -> {action}")
        from license_expression import LicenseWithExceptionSymbol

        lic = licensing()
        try:
            dnf = lic.dnf(lic.parse(expression, validate=False))
        except Exception as exc:  # noqa: BLE001 - malformed expressions raise several types
            return Decision("unknown", "deny", None, f"cannot parse expression ({type(exc).__name__})")
        terms = list(dnf.args) if type(dnf).__name__ == "OR" else [dnf]
        evaluated = []
        for term in terms:
            symbols = lic.license_symbols(term, decompose=False)
            action, category, reasons, review_ids = "allow", "permissive", [], []
            for sym in symbols:
                if isinstance(sym, LicenseWithExceptionSymbol):
                    cat, base_action, why = self._symbol_action(sym.license_symbol.key)
                    entry = (self.data.get("exceptions") or {}).get(str(sym))
                    if entry:
                        sym_action, why = entry, f"{sym}: explicit exception entry {entry}"
                    else:
                        sym_action = worse(base_action, "review")
                        why += f"; exception {sym.exception_symbol.key} has no policy entry (>= review)"
                else:
                    cat, sym_action, why = self._symbol_action(sym.key)
                # Report the most notable category among the parts with the worst action.
                if (ACTIONS.index(sym_action), CATEGORIES.index(cat)) > (
                    ACTIONS.index(action),
                    CATEGORIES.index(category),
                ):
                    category = cat
                action = worse(action, sym_action)
                if sym_action == "review":
                    review_ids.append(str(sym))
                reasons.append(why)
            evaluated.append((ACTIONS.index(action), term, action, category, reasons, review_ids))
        best = min(evaluated, key=lambda e: e[0])  # stable: first best side in DNF order
        _, term, action, category, reasons, review_ids = best
        chosen = str(term) if len(evaluated) > 1 else None
        reason = "; ".join(reasons)
        if chosen:
            reason = f"OR: chose {chosen} ({reason})"
        return Decision(category, action, chosen, reason, tuple(review_ids))


def _check_policy(data: dict, path: str) -> None:
    if not isinstance(data, dict):
        raise InputError(f"{path}: a license policy must be a YAML mapping")
    unknown = set(data) - _POLICY_KEYS
    if unknown:
        raise InputError(f"{path}: unknown policy key(s) {sorted(unknown)}; expected {sorted(_POLICY_KEYS)}")
    for key in ("categories", "licenses", "exceptions", "license_categories"):
        section = data.get(key)
        if section is not None and (not isinstance(section, dict) or not all(isinstance(k, str) for k in section)):
            raise InputError(f"{path}: {key} must be a mapping of names to values, got {type(section).__name__}")
    for key in ("categories", "licenses", "exceptions"):
        for name, action in (data.get(key) or {}).items():
            if action not in ACTIONS:
                raise InputError(f"{path}: {key}.{name} = {action!r}; expected one of {list(ACTIONS)}")
    for name in data.get("categories") or {}:
        if name not in CATEGORIES:
            raise InputError(f"{path}: categories.{name} is not a category; expected one of {list(CATEGORIES)}")
    for lid, cat in (data.get("license_categories") or {}).items():
        if cat not in CATEGORIES:
            raise InputError(f"{path}: license_categories.{lid} = {cat!r}; expected one of {list(CATEGORIES)}")


def load_policy(path: Path | None = None) -> Policy:
    """The default policy, extended by the YAML file at ``path`` when given."""
    merged = copy.deepcopy(load_data("default-policy.yaml"))
    sources = ["edgesdk/data/licenses/default-policy.yaml"]
    if path is not None:
        path = Path(path)
        user = read_user_yaml(path, "license policy")
        _check_policy(user, str(path))
        for key in ("categories", "licenses", "exceptions", "license_categories"):
            section = {}
            for name, value in (user.get(key) or {}).items():
                # Keys are license ids/expressions as users write them: normalise like findings.
                norm = normalize(name).expression if key in ("licenses", "exceptions") else None
                section[norm or name] = value
            merged.setdefault(key, {}).update(section)
        merged["id"] = str(user.get("id", f"{merged['id']}+{path.name}"))
        sources.append(str(path))
    return Policy(merged, sources)
