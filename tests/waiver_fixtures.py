# SPDX-License-Identifier: Apache-2.0
"""Shared by the license-gate tests: a one-entry waivers file and a minimal MIT pyproject.toml."""

from __future__ import annotations

import json
from pathlib import Path

PYPROJECT = '[project]\nname="x"\nversion="0"\nlicense="MIT"\ndependencies=[]\n'


def waiver_file(tmp_path: Path, **fields) -> Path:
    """``tmp_path/waivers.yaml`` holding one valid waiver whose other fields are ``fields``."""
    entry = {"id": "W-1", "by": "jane@example.com", "reason": "because", "expires": "2099-12-31", **fields}
    path = tmp_path / "waivers.yaml"
    path.write_text(json.dumps({"waivers": [entry]}))  # JSON is YAML
    return path


def license_gguf(path: Path, license_id: str = "gemma") -> Path:
    """A minimal GGUF (one 4-float tensor) whose ``general.license`` is ``license_id``."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_license(license_id)
    writer.add_tensor("t", np.zeros(4, dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
