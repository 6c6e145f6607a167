# SPDX-License-Identifier: Apache-2.0
"""The roofline's Orin decode predictions against published figures (issue 38, item 4).

The comparison is recomputed from edgesdk/profiler/published.py: every error must stay within ±25 %, the table in
docs/profiler.md must be what the code prints, the calibration must read only the figures it names, and the
sizes the comparison feeds the predictor must equal what ``profiler predict`` reads from a real GGUF file of the
same architecture (random weights, dimensions cut down).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from edgesdk.profiler import published, roofline

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "profiler.md"
BEGIN, END = "<!-- orin-published:begin -->", "<!-- orin-published:end -->"


def test_every_published_figure_is_predicted_within_tolerance():
    rows = published.compare()
    assert len(rows) == len(published.PUBLISHED)
    outside = [f"{r['key']}: {r['error_pct']:+.1f} %" for r in rows if abs(r["error_pct"]) > published.TOLERANCE_PCT]
    assert not outside, f"outside ±{published.TOLERANCE_PCT} %: {outside}"


def test_each_runtime_has_calibration_and_held_out_figures():
    for runtime, spec in published.CALIBRATION.items():
        figs = [f for f in published.PUBLISHED if f.runtime == runtime]
        calibrated = {f.key for f in figs if f.role == "calibration"}
        assert calibrated == set(spec["figures"]), runtime
        assert any(f.role == "held-out" for f in figs), f"{runtime} has no held-out figure"


def test_the_issue_figures_are_in_the_comparison():
    """Issue 38 names these five figures; each is compared (values as the sources print them)."""
    got = {(f.model, f.device): f.tok_s for f in published.PUBLISHED}
    assert got[("Llama-3.2-3B", "Jetson Orin Nano (original)")] == 27.7
    assert got[("Llama-3.2-3B", "Jetson Orin Nano Super")] == 43.07
    assert got[("Qwen3-1.7B", "Jetson AGX Orin (64GB)")] == 98.6
    assert got[("Qwen3-1.7B", "Jetson Orin NX (16GB)")] == 60.4
    assert got[("Qwen3-1.7B", "Jetson Orin Nano (8GB)")] == 37.4


def test_doc_table_is_what_the_code_predicts():
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"docs/profiler.md lacks the {BEGIN} ... {END} block"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    expected = published.markdown_table() + "\n\n" + "\n".join(published.calibration_lines())
    assert block == expected, (
        "docs/profiler.md's comparison differs from the code: paste `python -m edgesdk.profiler.published`"
    )


def test_held_out_figures_do_not_move_the_calibration():
    before = {rt: published.calibrate(rt) for rt in published.CALIBRATION}
    changed = [dataclasses.replace(f, tok_s=f.tok_s * 3) if f.role == "held-out" else f for f in published.PUBLISHED]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(published, "PUBLISHED", changed)
        after = {rt: published.calibrate(rt) for rt in published.CALIBRATION}
        assert after == before
        # ...while a calibration figure does move it (the fit reads the figures, nothing is hard-coded).
        moved = [
            dataclasses.replace(f, tok_s=f.tok_s * 1.5) if f.role == "calibration" else f for f in published.PUBLISHED
        ]
        mp.setattr(published, "PUBLISHED", moved)
        for rt in published.CALIBRATION:
            assert published.calibrate(rt)["efficiency"] != pytest.approx(before[rt]["efficiency"])


def test_calibration_entry_is_what_predict_uses():
    fig = next(f for f in published.PUBLISHED if f.role == "held-out" and f.runtime == "tensorrt-edge-llm")
    entry = published.calibrate(fig.runtime)
    pred = roofline.predict(
        published.work_for(fig), published.profile_for(fig), backend=fig.runtime, context=fig.context, table=[entry]
    )
    assert pred["decode"]["efficiency"] == entry["efficiency"]
    assert pred["decode"]["efficiency_source"] == entry["source"]
    row = next(r for r in published.compare() if r["key"] == fig.key)
    assert row["predicted_tok_s"] == pred["decode"]["tok_s"]


def test_super_mode_bandwidth_is_applied_to_a_copy_only():
    fig = next(f for f in published.PUBLISHED if f.mode == "MAXN_SUPER")
    from edgesdk.profiles import resolve_profile

    assert published.profile_for(fig).figure("device.memory.bandwidth_gbps") == 102.0
    assert resolve_profile(fig.profile).figure("device.memory.bandwidth_gbps") == 68


def _write_gguf(path: Path, arch: published.Architecture, gguf_arch: str) -> Path:
    """A random-weight GGUF of ``arch``'s architecture: llama.cpp's tensor names, F16 matrices, F32 vectors."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), gguf_arch)
    w.add_block_count(arch.layers)
    w.add_embedding_length(arch.hidden)
    w.add_feed_forward_length(arch.intermediate)
    w.add_head_count(arch.heads)
    w.add_head_count_kv(arch.kv_heads)
    w.add_key_length(arch.head_dim)
    w.add_value_length(arch.head_dim)
    w.add_file_type(1)  # MOSTLY_F16

    def mat(rows: int, cols: int):
        return rng.standard_normal((rows, cols)).astype(np.float16)

    def vec(n: int):
        return rng.standard_normal(n).astype(np.float32)

    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    w.add_tensor("token_embd.weight", mat(arch.vocab, h))
    for i in range(arch.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", vec(h))
        w.add_tensor(p + "attn_q.weight", mat(q, h))
        w.add_tensor(p + "attn_k.weight", mat(kv, h))
        w.add_tensor(p + "attn_v.weight", mat(kv, h))
        if arch.attention_bias:
            w.add_tensor(p + "attn_q.bias", vec(q))
            w.add_tensor(p + "attn_k.bias", vec(kv))
            w.add_tensor(p + "attn_v.bias", vec(kv))
        if arch.qk_norm:
            w.add_tensor(p + "attn_q_norm.weight", vec(arch.head_dim))
            w.add_tensor(p + "attn_k_norm.weight", vec(arch.head_dim))
        w.add_tensor(p + "attn_output.weight", mat(h, q))
        w.add_tensor(p + "ffn_norm.weight", vec(h))
        w.add_tensor(p + "ffn_gate.weight", mat(arch.intermediate, h))
        w.add_tensor(p + "ffn_up.weight", mat(arch.intermediate, h))
        w.add_tensor(p + "ffn_down.weight", mat(h, arch.intermediate))
    w.add_tensor("output_norm.weight", vec(h))
    if not arch.tied:
        w.add_tensor("output.weight", mat(arch.vocab, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "name,gguf_arch",
    [("Llama-3.2-3B", "llama"), ("Llama-3.1-8B", "llama"), ("Qwen2.5-7B", "qwen2"), ("Qwen3-1.7B", "qwen3")],
)
def test_config_sizes_equal_what_predict_reads_from_a_gguf_of_the_architecture(tmp_path, name, gguf_arch):
    """Each compared architecture (tied or not, q/k norms, q/k/v biases) with its dimensions divided by 32 and
    2 layers: the sizes computed from the config equal the ones gguf_work reads from the file's header."""
    full = published.ARCHITECTURES[name]
    small = dataclasses.replace(
        full,
        hidden=full.hidden // 32,
        intermediate=full.intermediate // 32,
        vocab=full.vocab // 32,
        head_dim=full.head_dim // 32,
        layers=2,
    )
    path = _write_gguf(tmp_path / "m.gguf", small, gguf_arch)
    from_file = roofline.gguf_work(path)
    from_config = published.config_work(small, published.SCHEMES["gguf-f16"])
    for field in ("weight_bytes", "params", "kv_bytes_per_position", "layers", "d_model", "flops"):
        assert getattr(from_config, field) == getattr(from_file, field), field


def test_module_prints_the_table():
    assert re.search(r"^\| MLC INT4 \| Llama-3.2-3B \|", published.markdown_table(), re.M)


def test_doc_prose_figures_are_the_codes():
    """The two errors the prose quotes (the issue's held-out figure and the largest held-out error)."""
    text = DOC.read_text(encoding="utf-8")
    rows = {r["key"]: r for r in published.compare()}
    super_row = rows["mlc-llama3.2-3b-nano-super"]
    m = re.search(r"Orin Nano Super \(43\.07 tok/s\), is predicted at ([\d.]+) \(([−+])([\d.]+) %\)", text)
    assert m, "docs/profiler.md no longer quotes the Super prediction"
    assert float(m.group(1)) == round(super_row["predicted_tok_s"], 1)
    assert (-1 if m.group(2) == "−" else 1) * float(m.group(3)) == round(super_row["error_pct"], 1)
    held = [r for r in rows.values() if r["role"] == "held-out"]
    worst = max(held, key=lambda r: abs(r["error_pct"]))
    m = re.search(r"largest held-out error is ([\w.-]+) on the ([\w ]+?)\n?\s*\(([+−])([\d.]+) %\)", text)
    assert m, "docs/profiler.md no longer quotes the largest held-out error"
    assert m.group(1) == worst["model"]
    assert float(m.group(4)) == round(abs(worst["error_pct"]), 1)
