# SPDX-License-Identifier: Apache-2.0
"""`edgesdk build`'s closing summary, read from the manifest through its typed parity view
(``Manifest.parity_checks()``): one line per check, for the ONNX, GGUF and VLM parity sections."""

from __future__ import annotations

from pathlib import Path

from edgesdk.commands.build import summarize
from edgesdk.manifest import Manifest, ProfileRef


def _manifest(fmt: str, parity: dict, **kw) -> Manifest:
    m = Manifest(format=fmt, precision="fp16", bundle_id="abc", parity=parity, license={"verdict": "pass"}, **kw)
    m.profile = ProfileRef(name="orin-agx-64gb")
    m.build = {"wall_s": 1.5}
    return m


def test_onnx_precision_line_as_before():
    m = _manifest("onnx", {"fp16": {"min_cosine": 1.0, "max_abs": 0.006026, "samples": 64, "reference": "pytorch"}})
    assert summarize(Path("/b"), m).splitlines() == [
        "bundle: /b  (id abc, onnx/fp16, profile orin-agx-64gb)",
        "parity fp16: min cosine 1.00000, max abs 0.006026 over 64 samples vs pytorch -> pass",
        "license gate: pass",
        "artifacts: 0 files, 0.0 MB; build 1.5 s",
    ]


def test_gguf_logits_and_perplexity():
    parity = {
        "logits_vs_hf": {"min_cosine": 0.99998, "top1_agreement": 0.997, "positions": 384},
        "ppl": {"ppl": 12.3456},
        "ppl_ratio": 1.02,
        "reference": "F16 GGUF",
    }
    lines = summarize(Path("/b"), _manifest("gguf", parity)).splitlines()
    assert lines[1:3] == [
        "parity logits (HF vs F16 GGUF): min cosine 0.99998, top-1 agreement 0.997 over 384 positions",
        "parity perplexity: 12.346, 1.02x the F16 GGUF",
    ]


def test_vlm_decoder_image_features_and_near_ties():
    parity = {
        "thresholds": {"encoder_min_cosine": 0.999, "greedy_tokens": 8},
        "decoder_logits_vs_hf": {"min_cosine": 0.99998, "max_abs": 0.0384, "top1_agreement": 0.9974, "positions": 384},
        "decoder_ppl": {"ppl": 1816.0},
        "decoder_ppl_ratio": 0.99488,
        "vision": {"encoder_min_cosine": 0.999999, "greedy_equal": "2/3", "greedy_near_tie": "1/3"},
    }
    lines = summarize(Path("/b"), _manifest("vlm", parity)).splitlines()
    assert lines[1:4] == [
        "parity logits (HF vs F16 GGUF): min cosine 0.99998, top-1 agreement 0.997 over 384 positions",
        "parity image features (F16 mmproj vs PyTorch): min cosine 0.999999 per image token; greedy tokens equal on "
        "2/3 test images, first differing at a near-tie on 1/3",
        "parity perplexity: 1816.000, 0.99488x the F16 decoder",
    ]
    assert "samples vs None" not in "\n".join(lines)  # what the dict reader printed for a VLM decoder


def test_no_reference_and_fallback_lines():
    m = _manifest("onnx", {"reference": "none (no PyTorch weights)"})
    m.fallbacks = [{"from": "fp16", "to": "fp32", "reason": "parity"}]
    lines = summarize(Path("/b"), m).splitlines()
    assert lines[1:3] == ["parity: none (no PyTorch weights)", "fallback: fp16 -> fp32: parity"]
