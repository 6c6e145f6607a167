# SPDX-License-Identifier: Apache-2.0
"""A draft model packed into a GGUF bundle (``edgesdk build MODEL --draft SMALL_MODEL``; issue 37 item 2): the small
model the runtime's speculative decoding drafts with (:mod:`edgesdk.runtime.draft`).

Plan (:func:`plan_draft`, decision ``gguf.draft``): the draft's file and what the build does with it, and the method
and ``k`` the runtime is to use, from the draft's weight bytes against the model's (a drafted token costs the draft's
weights read once; the verify step reads the model's once for all of them).

Build (:func:`build_draft`): the draft is converted (a HF directory, as the model is) and quantized to the plan's type
for the model, or kept as given when it is quantized already (requantizing a quantized file loses precision for a few
megabytes); its vocabulary is checked against the built model's (token count, every token's text and type, the
tokenizer model, BOS/EOS: :func:`check_same_vocabulary`), its logits sanity-checked, and the share of positions of the
built-in text where its greedy token is the model's measured (teacher-forced agreement: what a drafted token's
acceptance is near). It lands in the bundle as ``draft.gguf`` (role ``draft``, hashed in the manifest's artifacts),
so the license gate reads its own ``general.license`` like any model file's and the SBOMs list it as a component; the
manifest's ``extras.llm.draft`` says what it is.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgesdk.contracts.speculative import ASSUMED_ACCEPTANCE, VERIFY_COST, best_k
from edgesdk.errors import InputError, ModelError
from edgesdk.types import Decision, JSONable, JSONValue

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from edgesdk.formats import BuildContext
    from edgesdk.profiles import Profile
    from edgesdk.types import BuildOptions, ModelFacts


DECISION_KEY = "gguf.draft"
ARTIFACT = "draft.gguf"
ROLE = "draft"
#: float types a draft is quantized from; any other type is a quantized file, kept as given
UNQUANTIZED = ("F32", "F16", "BF16")
#: below this predicted gain the plan keeps prompt lookup for "auto"
MIN_GAIN = 1.05


@dataclass
class DraftChoice(JSONable):
    """The plan's ``gguf.draft``: the draft's source (a path), its kind (``gguf``/``hf``), the type the bundle's draft
    has (``quant_type``) and the build's action; the runtime's ``method`` for ``auto`` (``draft`` or ``lookup``) and
    ``k`` (tokens drafted per step), with the figures they came from."""

    source: str
    kind: str
    quant_type: str
    action: str
    method: str
    k: int
    cost_ratio: float
    predicted_gain: float

    def to_json(self) -> JSONValue:
        return {
            "source": self.source,
            "kind": self.kind,
            "quant_type": self.quant_type,
            "action": self.action,
            "method": self.method,
            "k": self.k,
            "cost_ratio": self.cost_ratio,
            "predicted_gain": self.predicted_gain,
        }

    @classmethod
    def from_json(cls, value: JSONValue) -> DraftChoice:
        assert isinstance(value, dict)
        k, cost, gain = value.get("k"), value.get("cost_ratio"), value.get("predicted_gain")
        return cls(
            str(value.get("source")),
            str(value.get("kind")),
            str(value.get("quant_type")),
            str(value.get("action")),
            str(value.get("method")),
            int(k) if isinstance(k, int) else 0,
            float(cost) if isinstance(cost, int | float) else 0.0,
            float(gain) if isinstance(gain, int | float) else 0.0,
        )


@dataclass
class DraftSource:
    """What the plan reads of ``--draft``: a GGUF file (its header) or a HF causal-LM directory (config.json and the
    safetensors headers); ``file_type`` the GGUF's type (``HF`` for a directory), ``params`` its weight count,
    ``shape`` its decoder facts as the model's (``layers``, ``kv_heads``, ``head_dim``, ``n_vocab``, ``hidden``,
    ``ffn``: what the memory arithmetic sizes its KV cache and compute buffer by)."""

    path: Path
    kind: str
    file_type: str
    params: int
    file_bytes: int
    shape: dict[str, Any] = field(default_factory=dict)

    def kept_type(self, quant: str) -> tuple[str, str]:
        """The type the bundle's draft has when the model is ``quant``, and the build's action: a float draft is
        quantized to the model's type, a quantized one kept as given."""
        src_type = self.file_type
        if self.kind == "hf":
            if quant == "F16":
                return quant, "convert HF -> F16 GGUF (gguf-py)"
            return quant, f"convert HF -> F16 GGUF (gguf-py), then llama.cpp quantize -> {quant}"
        if src_type in UNQUANTIZED and src_type != quant:
            return quant, f"llama.cpp quantize {src_type} -> {quant} (the model's type)"
        if src_type == quant:
            return src_type, f"kept as given: {src_type} is the model's type"
        return src_type, f"kept as given: already quantized ({src_type}); requantizing to {quant} would lose precision"

    def weight_bytes(self, quant: str) -> float:
        """The bundle's draft's weight bytes when the model is ``quant``: the file's size where it is kept as given,
        else its parameters at the type it is quantized to."""
        from edgesdk.contracts.gguf_types import BPW

        kept = self.kept_type(quant)[0]
        return (
            float(self.file_bytes)
            if self.kind == "gguf" and kept == self.file_type
            else self.params * BPW.get(kept, 16.0) / 8
        )


def draft_source(source: str) -> DraftSource:
    """``--draft`` read as the GGUF builder reads a model (headers only), or InputError: a draft is a GGUF file or a
    HF causal-LM directory (config.json of an architecture the converter knows, safetensors weights)."""
    import json

    from edgesdk.formats.gguf.facts import gguf_file_facts, hf_causal_lm_facts

    path = Path(source)
    if path.is_file() and path.suffix.lower() == ".gguf":
        facts = gguf_file_facts(path)
        return DraftSource(path, "gguf", str(facts.extra.get("file_type") or ""), int(facts.params or 0),
                           path.stat().st_size, dict(facts.extra))  # fmt: skip
    if path.is_dir() and (path / "config.json").is_file():
        info = hf_causal_lm_facts(path)
        if not info.get("gguf_supported"):
            raise InputError(
                f"--draft {source}: {info.get('architecture')} is not an architecture the GGUF converter knows"
            )
        params = 0
        files = sorted(path.glob("*.safetensors"))
        for f in files:  # a safetensors header: 8-byte length, then JSON of name -> {dtype, shape, offsets}
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
            for name, spec in header.items():
                if name != "__metadata__":
                    size = 1
                    for d in spec.get("shape", ()):
                        size *= int(d)
                    params += size
        if not files or not params:
            raise InputError(f"--draft {source}: no safetensors weights")
        return DraftSource(path, "hf", "HF", params, sum(f.stat().st_size for f in files), info)
    raise InputError(f"--draft {source}: not a .gguf file or a HF causal-LM directory (config.json)")


def plan_draft(
    facts: ModelFacts, profile: Profile, options: BuildOptions, quant: str, draft: DraftSource | None = None
) -> Decision | None:
    """The ``gguf.draft`` decision for ``--draft`` (None without one): what the build does with the draft and the
    runtime's method and k for ``auto``. ``draft``: ``--draft`` already read (:func:`draft_source`)."""
    from edgesdk.contracts.gguf_types import BPW

    source = options.option("draft")
    if source is None:
        return None
    if draft is None:
        draft = draft_source(str(source))
    if facts.kind == "gguf" and draft.kind == "gguf":
        check_same_vocabulary(Path(str(facts.source)), draft.path, str(source))  # header reads only
    kept, action = draft.kept_type(quant)
    if facts.kind == "gguf" and facts.extra.get("file_type") == quant:
        target = float(Path(str(facts.source)).stat().st_size)
    else:
        target = (facts.params or 0) * BPW.get(quant, 16.0) / 8
    cost = round(draft.weight_bytes(quant) / max(target, 1.0), 4)
    device = "gpu" if profile.is_gpu else "cpu"
    k, gain = best_k(ASSUMED_ACCEPTANCE, cost, VERIFY_COST[device])
    method = "draft" if gain >= MIN_GAIN else "lookup"
    why = (
        f"{draft.path.name}: {action}; the draft's weights are {cost:.1%} of the model's, so on "
        f"{'a GPU' if device == 'gpu' else 'the CPU'} (verify cost {VERIFY_COST[device]} step per drafted token) and "
        f"an assumed {ASSUMED_ACCEPTANCE:.0%} acceptance per token k={k} predicts {gain:.2f}x: "
        + (
            f"'auto' drafts with it (k={k})"
            if method == "draft"
            else f"below {MIN_GAIN}x, so 'auto' keeps prompt lookup ('draft' still uses it)"
        )
    )
    value = DraftChoice(str(source), draft.kind, kept, action, method, k, cost, round(gain, 3))
    return Decision(DECISION_KEY, value.to_json(), why)


# ------------------------------------------------------------------ the vocabulary check

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"
}  # fmt: skip
VOCAB_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
)


@dataclass
class Vocabulary:
    """A GGUF's tokenizer as its metadata declares it."""

    model: str | None
    tokens: list[bytes]
    types: np.ndarray
    bos: int | None
    eos: int | None


def read_vocabulary(path: Path) -> Vocabulary:
    """The tokenizer keys of a GGUF header (:data:`VOCAB_KEYS`), token texts as bytes; ModelError on a bad file."""
    import numpy as np

    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            found = _vocab_fields(buf, path)
    except OSError as exc:
        raise ModelError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    except (ValueError, struct.error) as exc:
        raise ModelError(f"{path}: not a valid GGUF file ({exc})") from exc
    tokens = found.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        raise ModelError(f"{path}: no tokenizer.ggml.tokens in its metadata")
    types = found.get("tokenizer.ggml.token_type")
    return Vocabulary(
        found.get("tokenizer.ggml.model"),
        tokens,
        types if isinstance(types, np.ndarray) else np.zeros(0, dtype=np.int32),
        found.get("tokenizer.ggml.bos_token_id"),
        found.get("tokenizer.ggml.eos_token_id"),
    )


def _vocab_fields(buf: Any, path: Path) -> dict[str, Any]:
    import numpy as np

    if bytes(buf[:4]) != b"GGUF":
        raise ModelError(f"{path}: not a valid GGUF file (bad magic)")
    pos = 8
    _n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
    pos += 16

    def string(at: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", buf, at)
        if at + 8 + n > len(buf):
            raise ValueError("string past the end of the file")
        return bytes(buf[at + 8 : at + 8 + n]), at + 8 + n

    def value(vtype: int, at: int, keep: bool) -> tuple[Any, int]:
        if vtype in _SCALAR:
            size = struct.calcsize(_SCALAR[vtype])
            return (struct.unpack_from(_SCALAR[vtype], buf, at)[0] if keep else None), at + size
        if vtype == 8:
            raw, at = string(at)
            return (raw.decode("utf-8", "replace") if keep else None), at
        if vtype == 9:
            etype, n = struct.unpack_from("<IQ", buf, at)
            at += 12
            if etype in _NUMPY:
                size = np.dtype(_NUMPY[etype]).itemsize
                arr = np.frombuffer(buf, dtype=_NUMPY[etype], count=n, offset=at).copy() if keep else None
                return arr, at + n * size
            if etype == 8:
                out: list[bytes] = []
                for _ in range(n):
                    raw, at = string(at)
                    if keep:
                        out.append(raw)
                return (out if keep else None), at
            items = []
            for _ in range(n):
                item, at = value(etype, at, keep)
                items.append(item)
            return (items if keep else None), at
        raise ValueError(f"unknown value type {vtype}")

    found: dict[str, Any] = {}
    for _ in range(n_kv):
        key_raw, pos = string(pos)
        key = key_raw.decode("utf-8", "replace")
        (vtype,) = struct.unpack_from("<I", buf, pos)
        val, pos = value(vtype, pos + 4, key in VOCAB_KEYS)
        if key in VOCAB_KEYS:
            found[key] = val
            if len(found) == len(VOCAB_KEYS):
                break
    return found


def vocabulary_difference(model: Vocabulary, draft: Vocabulary) -> str | None:
    """Why ``draft``'s tokenizer is not ``model``'s (the first difference), or None when they are the same."""
    import numpy as np

    if len(model.tokens) != len(draft.tokens):
        return f"{len(draft.tokens)} tokens, the model {len(model.tokens)}"
    if model.model != draft.model:
        return f"tokenizer model {draft.model!r}, the model's {model.model!r}"
    if model.tokens != draft.tokens:
        i = next(i for i, (a, b) in enumerate(zip(model.tokens, draft.tokens, strict=True)) if a != b)
        return f"token {i} is {draft.tokens[i].decode('utf-8', 'replace')!r}, the model's is " + repr(
            model.tokens[i].decode("utf-8", "replace")
        )
    if len(model.types) != len(draft.types) or not np.array_equal(model.types, draft.types):
        if len(model.types) != len(draft.types):
            return f"{len(draft.types)} token types, the model {len(model.types)}"
        i = int(np.flatnonzero(model.types != draft.types)[0])
        return f"token {i} has type {int(draft.types[i])}, the model's {int(model.types[i])}"
    for name, a, b in (("BOS", model.bos, draft.bos), ("EOS", model.eos, draft.eos)):
        if a != b:
            return f"{name} token {b}, the model's {a}"
    return None


def check_same_vocabulary(model: Path, draft: Path, shown: str) -> int:
    """InputError (exit 3) unless the GGUF ``draft`` has ``model``'s vocabulary; returns the token count."""
    mv, dv = read_vocabulary(model), read_vocabulary(draft)
    why = vocabulary_difference(mv, dv)
    if why is not None:
        raise InputError(f"--draft {shown}: not the model's vocabulary: the draft has {why}")
    return len(mv.tokens)


# ------------------------------------------------------------------ the build


def check_draft_declares_a_license(source: Path, policy_path: str | None) -> None:
    """LicenseGateError (exit 2) when the draft declares no license (model card, GGUF ``general.license``, owning
    package) and the policy denies that: the gate would otherwise count the draft as covered by the model's license.
    What it declares is judged by the gate with the rest of the bundle (``draft.gguf`` keeps its
    ``general.license``: the converter writes the card's, llama.cpp's quantizer copies the metadata)."""
    from edgesdk.compliance.gate import refuse_undeclared
    from edgesdk.compliance.models import model_findings, package_finding

    found = [f for f in model_findings(source, source if source.is_dir() else source.parent) if f.spdx]
    if found or package_finding(source, found) is not None:
        return
    refuse_undeclared(
        source.name,
        "model card / GGUF metadata",
        f"--draft {source.name}",
        "no model card license, GGUF general.license or owning package",
        policy_path,
    )


def agreement(model: Path, draft: Path, text: str, n_tokens: int = 256) -> dict[str, Any]:
    """Teacher-forced greedy agreement on ``text``: the share of positions where the draft's most likely next token
    is the model's (both evaluate the same tokens: the model's tokenization of the text)."""
    import numpy as np

    from edgesdk.formats.gguf import convert as conv

    llm = conv._open_llama(model, n_ctx=n_tokens + 8, logits_all=True)
    try:
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:n_tokens]
        want = conv._eval_logits(llm, tokens).argmax(axis=-1)
    finally:
        llm.close()
    small = conv._open_llama(draft, n_ctx=n_tokens + 8, logits_all=True)
    try:
        got = conv._eval_logits(small, tokens).argmax(axis=-1)
    finally:
        small.close()
    return {"positions": len(tokens), "agreement": round(float(np.mean(want == got)), 4)}


def build_draft(
    ctx: BuildContext, model: Path, choice: DraftChoice, sanity_check: Callable[[Path, str], dict[str, Any]]
) -> dict[str, Any]:
    """Convert / quantize / check the plan's draft into ``ctx.staging/draft.gguf`` (role ``draft``); returns the
    manifest's ``extras.llm.draft`` record. ``sanity_check``: the GGUF build's (finite, non-constant logits)."""
    from edgesdk.formats.gguf import convert as conv
    from edgesdk.formats.gguf.facts import gguf_facts
    from edgesdk.resources import data_file

    source = Path(choice.source)
    check_draft_declares_a_license(source, ctx.options.license_policy)
    final = ctx.staging / ARTIFACT
    work = ctx.staging / "_draft_work"
    work.mkdir(parents=True, exist_ok=True)
    try:
        with ctx.stage("draft", {"edgesdk.gguf.quant_type": choice.quant_type}):
            if choice.kind == "hf":
                ctx.progress("draft: converting HF weights to F16 GGUF (gguf-py)")
                reference = work / "draft-f16.gguf"
                conv.convert_hf_to_gguf(source, reference, name=source.name)
            else:
                reference = source
            n_vocab = check_same_vocabulary(model, reference, choice.source)
            ref_type = "F16" if choice.kind == "hf" else str(gguf_facts(reference).get("file_type") or "")
            if ref_type == choice.quant_type:
                shutil.copyfile(reference, final)
            else:
                ctx.progress(f"draft: llama.cpp quantize {ref_type} -> {choice.quant_type}")
                conv.quantize(reference, final, choice.quant_type, allow_requantize=False)
            sanity = sanity_check(final, f"draft {source.name}")
            agree = agreement(model, final, data_file("ppl_text.txt").read_text(encoding="utf-8"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ctx.add_artifact(ARTIFACT, ROLE)
    facts = gguf_facts(final)
    return {
        "file": ARTIFACT,
        "source": source.name,
        "action": choice.action,
        "quant_type": choice.quant_type,
        "n_vocab": n_vocab,
        "architecture": facts.get("architecture"),
        "layers": facts.get("layers"),
        "params": facts.get("params"),
        "file_bytes": final.stat().st_size,
        "method": choice.method,
        "k": choice.k,
        "cost_ratio": choice.cost_ratio,
        "predicted_gain": choice.predicted_gain,
        "sanity": sanity,
        "agreement": agree,
    }
