# SPDX-License-Identifier: Apache-2.0
"""A device that installed the wheel without the build extra imports no build module to run a VLM (issue 40,
item 3). The VLM family record is split: the runtime side (prompt, chat format, image layout, preprocessing) is
``edgesdk/contracts/vlm_families/``, the build side (converter, checks, tensor names, parity) holds it as
``runtime`` in ``edgesdk/formats/vlm/families/``. tests/runtime_only.py refuses the build extra's packages and
edgesdk's build-side modules in a fresh interpreter; a real bundle loaded and run that way:
tests/test_vlm.py::test_a_vlm_bundle_runs_without_build_modules (slow tier)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_only import build_side_names, run_runtime_only  # noqa: E402  (tests/ on sys.path)

# every family's preprocessing, prompt and chat as the VLM backend runs them, short of llama.cpp
VLM_RUNTIME = """
import edgesdk
from PIL import Image
from edgesdk.runtime.backends import get_loader
from edgesdk.runtime.backends.vlm import ImagePreprocessor
from edgesdk.runtime.backends.vlm.families import frames_for, image_frames
from edgesdk.contracts import vlm_families

assert callable(get_loader("vlm"))
img = Image.new("RGB", (90, 60), (10, 200, 30))
msgs = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "What?"}]},
]
for fam in vlm_families.families():
    config = {"image_processor_type": sorted(fam.processor_types or {"SiglipImageProcessor"})[0],
              "size": {"height": 64, "width": 64, "longest_edge": 64 * 28 * 28}, "_family": fam.name,
              "do_image_splitting": True, "max_image_size": {"longest_edge": 64}, "_image_tokens": 16}
    pre = ImagePreprocessor(config, 64)
    assert pre.family == fam.name, (pre.family, fam.name)
    frames, layout = image_frames(pre, pre.record, img, "<m>")
    assert frames and frames[0].ndim == 3, fam.name
    assert frames_for(fam).image_tokens(pre, 90, 60), fam.name
    assert "What?" in fam.chat(msgs, "<m>") and "<m>" in fam.user_prompt("Hi", 1, "<m>")
"""


def test_the_vlm_runtime_imports_no_build_module():
    report, imported, _ = run_runtime_only(VLM_RUNTIME)
    assert report["refused"] == []  # nothing even tried to import build-side code
    assert build_side_names(imported) == []  # -X importtime: no such import was even tried
    assert "edgesdk.contracts.vlm_families.qwen_vl" in report["edgesdk"]
    assert not [m for m in report["edgesdk"] if m.startswith("edgesdk.formats.vlm.")]


def test_the_finder_refuses_build_modules():
    """The check can fail: the build-side record and torch are refused and recorded."""
    code = """
for name in ("edgesdk.formats.vlm.families", "torch"):
    try:
        __import__(name)
    except ImportError:
        pass
"""
    report, imported, _ = run_runtime_only(code)
    assert report["refused"] == ["edgesdk.formats.vlm.families", "torch"]
    assert set(build_side_names(imported)) == {"edgesdk.formats.vlm.families", "torch"}  # -X importtime logs tries
