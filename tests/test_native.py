# SPDX-License-Identifier: Apache-2.0
"""edgesdk.native: how llama.cpp's libraries are linked, read before they load, and the one import path.

A CUDA llama-cpp-python built with a compiler whose C++ runtime is not the system's carried its own copy
of it and crashed next to onnxruntime and torch (docs/native-libraries.md). These tests build real shared
libraries both ways with this machine's g++ and check what edgesdk reads and does for each.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.native import elf_needed, llama_cpp_build

REPO = Path(__file__).resolve().parents[1]
CXX_SOURCE = (
    "#include <mutex>\n#include <string>\nstatic std::once_flag f;\n"
    'extern "C" int probe() { int n = 0; std::call_once(f, [&] { n = std::string("ab").size(); });'
    " return n; }\n"
)


def _fake_llama_cpp(root: Path, *, static_cxx: bool) -> Path:
    """A package named llama_cpp whose lib/ holds real C++ shared libraries named as llama.cpp's are."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    pkg = root / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    src = root / "probe.cpp"
    src.write_text(CXX_SOURCE)
    for name in ("libllama.so", "libggml-base.so"):
        cmd = [gxx, "-shared", "-fPIC", "-O1", str(src), "-o", str(pkg / "lib" / name)]
        if static_cxx:
            cmd.insert(1, "-static-libstdc++")
        subprocess.run(cmd, check=True, capture_output=True)
    return root


def _child(root: Path, code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_elf_needed_matches_readelf_on_the_installed_llama_cpp():
    build = llama_cpp_build()
    if not build["installed"]:
        pytest.skip("llama-cpp-python is not installed")
    lib = Path(build["libdir"]) / "libllama.so"
    needed = elf_needed(lib)
    assert needed and "libstdc++.so.6" in needed
    if shutil.which("readelf"):
        text = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        assert needed == [ln.split("[", 1)[1].rstrip("]") for ln in text.splitlines() if "(NEEDED)" in ln]
    assert build["problem"] is None  # the suite's own build (make setup) links the shared C++ runtime


def test_elf_needed_refuses_what_is_not_a_64_bit_elf(tmp_path):
    (tmp_path / "x.so").write_bytes(b"not an elf at all")
    assert elf_needed(tmp_path / "x.so") is None
    assert elf_needed(tmp_path / "missing.so") is None


CHECK = (
    "import json, sys; from edgesdk.native import llama_cpp_build, import_llama_cpp; "
    "from edgesdk.doctor import _llama_cpp; b = llama_cpp_build(); import_llama_cpp(); "
    "mods = list(sys.modules); row = _llama_cpp(); "
    "print(json.dumps({'problem': b['problem'], 'runtime': b['cxx_runtime'], 'row': row, "
    "'ort_first': 'onnxruntime' in mods and mods.index('onnxruntime') < mods.index('llama_cpp'), "
    "'ort_loaded': 'onnxruntime' in mods}))"
)


def test_a_build_with_its_own_cxx_runtime_is_named_and_loaded_after_onnxruntime(tmp_path):
    root = _fake_llama_cpp(tmp_path, static_cxx=True)
    got = _child(root, CHECK)
    assert got["runtime"] == {"libllama.so": None, "libggml-base.so": None}
    assert "link no shared C++ runtime" in got["problem"]
    assert got["ort_first"] is True  # the order that works for such a build
    assert got["row"]["available"] is False and "CXX=g++" in got["row"]["detail"]


def test_a_build_on_the_shared_cxx_runtime_loads_nothing_else(tmp_path):
    root = _fake_llama_cpp(tmp_path, static_cxx=False)
    got = _child(root, CHECK)
    assert got["problem"] is None and set(got["runtime"].values()) == {"libstdc++.so.6"}
    assert got["ort_loaded"] is False  # a GGUF path brings no ONNX Runtime along


def test_every_llama_cpp_import_goes_through_edgesdk_native():
    offenders = []
    for path in (REPO / "edgesdk").rglob("*.py"):
        if path.name == "native.py" and path.parent.name == "edgesdk":
            continue
        tree = ast.parse(path.read_text())
        type_checking = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for n in ast.walk(node)
        }
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in names) and id(node) not in type_checking:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == [], "import llama_cpp through edgesdk.native.import_llama_cpp: " + ", ".join(offenders)


def test_nvml_reads_through_the_driver_library_without_pynvml(monkeypatch):
    """Without nvidia-ml-py, host.nvml() falls back to libnvidia-ml through ctypes (None where no driver)."""
    from edgesdk import host

    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with host.nvml() as nv:
        if nv is None:
            assert host.gpu_free_bytes() is None and host.read_gpus() == ()
            return
        assert isinstance(nv, host._CtypesNvml)
        assert nv.nvmlDeviceGetCount() >= 1
    assert host.gpu_free_bytes() is not None and host.read_gpus()


@pytest.mark.slow
def test_loading_a_gguf_bundle_imports_no_onnxruntime(gemma_gguf, tmp_path, run_cli):
    out = tmp_path / "gemma"
    res = run_cli(
        "build",
        str(gemma_gguf),
        "--profile",
        "cpu-x86_64",
        "-o",
        str(out),
        "--accept-license",
        "LicenseRef-gemma",
        "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # llama.cpp's own lines (llama_kv_cache_iswa ...) go to the logger, not stderr
    code = (
        "import json, sys, edgesdk; s = edgesdk.load(sys.argv[1]); t = s.generate('Hi', max_tokens=2, "
        "temperature=0); print(json.dumps({'ort': 'onnxruntime' in sys.modules, 'torch': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ort": False, "torch": False}
