# SPDX-License-Identifier: Apache-2.0
"""Turn licenses *as found* (SPDX expressions, HF card ids, free text, classifiers, license texts)
into normalised SPDX expressions.

Nothing here decides allow/deny (that is :mod:`edgesdk.compliance.policy`). An id we cannot map
is kept as ``LicenseRef-<slug>`` so it stays visible and the policy treats it as unknown
(default deny) instead of silently dropping it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import yaml

from edgesdk.resources import read_data_text

_MAX_ID_TEXT = 120  # longer than any license name: treat as a license text, not as an id
_WHOLE_TEXT = 0.75  # a license text matching this share of its signature's phrases counts as that license's


@dataclass(frozen=True)
class Normalized:
    expression: str | None  # normalised SPDX expression; None when nothing usable was found
    note: str = ""  # how it was derived (e.g. "HF id gemma -> LicenseRef-gemma")
    made_up: bool = False  # some id had no mapping and became LicenseRef-<slug> of the raw text


@functools.cache
def load_data(name: str):
    """Load one YAML file from edgesdk/data/licenses/."""
    text = read_data_text("licenses", name)
    return yaml.safe_load(text)


def read_user_yaml(path, what: str):
    """A user-supplied YAML file (policy, waivers); unreadable or invalid -> one-line InputError."""
    from pathlib import Path

    from edgesdk.errors import InputError

    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    except (UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable YAML {what} ({type(exc).__name__})") from exc


@functools.lru_cache(maxsize=1)
def licensing():
    from license_expression import get_spdx_licensing

    return get_spdx_licensing()


def _collapse(text: str) -> str:
    return " ".join(text.split()).strip().lower()


def slug(text: str) -> str:
    """A LicenseRef-safe id made from free text (SPDX allows letters, digits, '.' and '-')."""
    cleaned = re.sub(r"[^A-Za-z0-9.+]+", "-", text.strip()).strip("-").replace("+", "-plus")
    return f"LicenseRef-{cleaned[:60] or 'empty'}"


def hf_id(card_id: str) -> str | None:
    return load_data("hf-licenses.yaml").get(card_id.strip().lower())


def alias(text: str) -> tuple[bool, str | None]:
    """(known, spdx): known=False when the text is not in the alias table at all."""
    table = load_data("aliases.yaml")["text"]
    key = _collapse(text)
    if key in table:
        return True, table[key]
    return False, None


def _is_known_symbol(key: str) -> bool:
    return key in licensing().known_symbols or key.startswith(("LicenseRef-", "DocumentRef-"))


def normalize(raw: str | None, *, hf: bool = False) -> Normalized:
    """Normalise one license string. ``hf=True`` tries Hugging Face ids first (model metadata)."""
    if raw is None or not str(raw).strip():
        return Normalized(None, "empty")
    text = str(raw).strip()
    if len(text) > _MAX_ID_TEXT or "\n" in text:
        return identify_text(text)
    if hf and (mapped := hf_id(text)):
        return Normalized(mapped, f"HF id {text!r} -> {mapped}")
    known, mapped = alias(text)
    if known:
        return Normalized(mapped, f"name {text!r} -> {mapped}" if mapped else f"{text!r} names no single license")
    return _parse_expression(text)


def _parse_expression(text: str) -> Normalized:
    lic = licensing()
    try:
        expr = lic.parse(text, validate=False, simple=False)
    except Exception:  # noqa: BLE001 - license-expression raises several types on malformed input
        return Normalized(slug(text), f"unparseable expression {text!r}", made_up=True)
    if expr is None:
        return Normalized(None, "empty")
    from license_expression import LicenseWithExceptionSymbol

    used_exceptions = {
        s.exception_symbol.key
        for s in lic.license_symbols(expr, decompose=False)
        if isinstance(s, LicenseWithExceptionSymbol)
    }
    replacements = {}
    notes = []
    made_up = False
    for sym in lic.license_symbols(expr, decompose=True):
        if sym.key in used_exceptions:  # exceptions are judged by the policy's WITH entries
            continue
        # A deprecated combined id (GPL-2.0-with-classpath-exception) parses as a lone exception.
        if _is_known_symbol(sym.key) and not sym.is_exception:
            continue
        mapped = hf_id(sym.key) or alias(sym.key)[1]
        target = mapped or slug(sym.key)
        made_up = made_up or not mapped
        notes.append(f"{sym.key} -> {target}")
        replacements[sym] = lic.parse(target, validate=False)
    if replacements:
        expr = expr.subs(replacements)
        expr = lic.parse(str(expr), validate=False)  # re-normalise (e.g. new WITH nodes)
    out = str(expr)
    note = "; ".join(notes) if notes else (f"normalised {text!r} -> {out}" if out != text else "SPDX")
    return Normalized(out, note, made_up)


def from_classifiers(classifiers: list[str]) -> Normalized:
    table = load_data("aliases.yaml")["classifiers"]
    ids, unmapped = [], []
    for line in classifiers:
        if not line.startswith("License ::"):
            continue
        key = line[len("License ::") :].strip()
        mapped = table.get(key)
        if mapped:
            ids.append(mapped)
        else:
            unmapped.append(key)
    if not ids:
        return Normalized(None, f"classifiers name no single license: {unmapped}" if unmapped else "none")
    # Several classifiers do not say OR or AND: AND is the reading that cannot under-report.
    uniq = list(dict.fromkeys(ids))
    expr = " AND ".join(uniq)
    note = "classifiers" + (f" (several: read as AND; unmapped {unmapped})" if len(uniq) > 1 or unmapped else "")
    return Normalized(expr, note)


def identify_text(text: str) -> Normalized:
    """Recognise a license text (LICENSE/COPYING, long `License:` field) by distinctive phrases."""
    header = re.search(r"SPDX-License-Identifier:\s*([^\n*]+?)\s*(?:\*/|-->|$)", text[:4000], re.M)
    if header:
        return normalize(header.group(1))
    body = _collapse(text.replace("\u2019", "'"))
    found: list[tuple[str, float]] = []  # (id, coverage of its phrases)
    superseded: set[str] = set()
    for sig in load_data("text-signatures.yaml"):
        if all(p in body for p in sig["all"]) and not any(p in body for p in sig.get("none", [])):
            extra = sig.get("body", [])
            cover = (len(sig["all"]) + sum(p in body for p in extra)) / (len(sig["all"]) + len(extra))
            found.append((sig["id"], cover))
            superseded.update(sig.get("supersedes", []))
    found = [(lid, c) for lid, c in found if lid not in superseded]
    if not found:
        return Normalized(None, "license text not recognised")
    # The best-covering match wins: a closing paragraph naming another license is not that license's text.
    # Several texts in one file each cover their own phrases, and all of them are reported.
    bar = min(_WHOLE_TEXT, max(c for _, c in found))
    ids = [lid for lid, c in found if c >= bar]
    dropped = [f"{lid} {c:.0%}" for lid, c in found if c < bar]
    note = "license text" + (" (several licenses in one file)" if len(ids) > 1 else "")
    if dropped:
        note += f" (best-covering match; only partly covered: {', '.join(dropped)})"
    return Normalized(" AND ".join(ids), note)
