# SPDX-License-Identifier: Apache-2.0
"""Interrupted and faulty builds (real `edgesdk build` subprocesses): SIGTERM, kill -9, two builds into one
output, a full disk, a FIFO as the model. Never a partial bundle at the output, never litter a rerun trips on."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgesdk import bundle as B


@pytest.fixture(scope="module")
def matmul_onnx(tmp_path_factory) -> Path:
    """A 4 MB MatMul model (random weights): an INT8 CPU build of it takes a few seconds, long enough to
    interrupt at a known stage."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((512, 2048)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2048])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    model.metadata_props.add(key="license", value="apache-2.0")
    path = tmp_path_factory.mktemp("src") / "mm.onnx"
    onnx.save(model, str(path))
    return path


def _build_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "edgesdk", "build", str(src), "-p", "cpu", "-o", str(out), "--no-progress", *extra]


# The build runs in a real subprocess; its first onnxruntime session (``check_ort_loads``, the export stage,
# after ``_work`` exists) writes a marker file and then sleeps. The signal lands at a known stage however
# fast the machine is: a 4 MB model builds in well under a second on CI, faster than a poll of the staging
# directory (the race that let a build finish before its SIGTERM arrived).
_PAUSED_BUILD = """
import sys, time
from pathlib import Path
import onnxruntime

marker = Path(sys.argv.pop(1))
_real_init = onnxruntime.InferenceSession.__init__

def _paused_init(self, *args, **kwargs):
    if not marker.exists():
        marker.write_text("paused")
        time.sleep(300)
    _real_init(self, *args, **kwargs)

onnxruntime.InferenceSession.__init__ = _paused_init
from edgesdk.cli import main
sys.argv[0] = "edgesdk"
sys.exit(main())
"""


def _start(src: Path, out: Path) -> subprocess.Popen:
    marker = out.parent / f"{out.name}.paused"
    cmd = [sys.executable, "-c", _PAUSED_BUILD, str(marker), *_build_cmd(src, out)[3:]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_stage(proc: subprocess.Popen, out: Path, timeout: float = 120) -> Path:
    """Wait until the build is paused inside the export stage; return its staging directory."""
    marker = out.parent / f"{out.name}.paused"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            staging = [p for p in out.parent.glob(f".{out.name}.staging-*") if p.is_dir()]
            assert len(staging) == 1 and (staging[0] / "_work").is_dir(), staging
            return staging[0]
        assert proc.poll() is None, f"build ended before the export stage: {proc.communicate()}"
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("the build never reached the export stage")


def _litter(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_sigterm_mid_build_is_one_error_line_and_leaves_nothing(matmul_onnx, tmp_path):
    out = tmp_path / "out"
    proc = _start(matmul_onnx, out)
    _wait_for_stage(proc, out)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip() == "error: terminated by SIGTERM", err
    assert not out.exists() and _litter(tmp_path, "out") == []


@pytest.mark.slow
def test_kill_9_leaves_no_bundle_and_the_rerun_cleans_up(matmul_onnx, tmp_path):
    out = tmp_path / "out"
    proc = _start(matmul_onnx, out)
    staging = _wait_for_stage(proc, out)
    proc.kill()
    proc.communicate(timeout=60)
    assert not out.exists(), "a partial bundle at the output path"
    assert staging.is_dir() and staging.with_name(staging.name + ".owner").is_file()  # what kill -9 leaves
    res = subprocess.run(_build_cmd(matmul_onnx, out), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert B.open_bundle(out).format == "onnx"
    assert _litter(tmp_path, "out") == [], "stale staging of the dead build not removed"


@pytest.mark.slow
def test_two_builds_into_one_output_second_fails_with_exit_4(matmul_onnx, tmp_path):
    """While one process holds the output's lock (what a running build does from staging to rename), a
    build into the same output fails at once with exit 4 naming the holder; once the holder is gone
    (even by kill -9: the kernel drops flock locks), builds proceed and leave no lock file behind."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom edgesdk.bundle import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('locked', flush=True)\n"
            "    time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = subprocess.run(_build_cmd(matmul_onnx, out, "--force"), capture_output=True, text=True, timeout=300)
        assert second.returncode == 4, second.stderr
        assert f"another edgesdk build is writing {out} (pid {holder.pid}" in second.stderr
        assert not out.exists()
    finally:
        holder.kill()
        holder.communicate()
    res = subprocess.run(_build_cmd(matmul_onnx, out), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    B.open_bundle(out)
    assert _litter(tmp_path, "out") == []


@pytest.mark.slow
def test_full_disk_is_exit_11_and_nothing_half_written(matmul_onnx, tmp_path):
    """A real full file system: a 1 MiB tmpfs (needs root and mount rights; skipped elsewhere, the
    simulated test below always runs)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here (not root or no mount rights)")
    try:
        res = subprocess.run(_build_cmd(matmul_onnx, mnt / "out"), capture_output=True, text=True, timeout=300)
        assert res.returncode == 11, res.stderr
        assert res.stderr.startswith("error: no space left on the device") and res.stderr.count("\n") == 1
        assert list(mnt.iterdir()) == [], "something half-written on the full file system"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("fault", ["enospc", "truncated-json"])
def test_full_disk_simulated(matmul_onnx, tmp_path, monkeypatch, fault):
    """ENOSPC raised by the manifest write; or a half-written JSON read back (what a child that hit ENOSPC
    leaves) while the file system reports no free space: both are DiskFullError, nothing at the output."""
    import json
    import shutil

    from edgesdk.build import build
    from edgesdk.errors import DiskFullError
    from edgesdk.types import BuildOptions

    if fault == "enospc":

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(B, "write_manifest", full)
    else:

        def truncated(*args, **kwargs):
            return json.loads('{"class": "Mod')

        real_usage = shutil.disk_usage
        monkeypatch.setattr(B, "write_manifest", truncated)
        monkeypatch.setattr(shutil, "disk_usage", lambda p: real_usage(p)._replace(free=4096))
    out = tmp_path / "out"
    with pytest.raises(DiskFullError, match="no space left on the device") as err:
        build(
            matmul_onnx,
            "cpu",
            out,
            BuildOptions(precision="fp32", progress=False, parity_samples=2, calibration_samples=2),
        )
    assert err.value.exit_code == 11
    assert not out.exists() and _litter(tmp_path, "out") == []


def test_fifo_as_model_is_exit_3_not_a_hang(tmp_path):
    fifo = tmp_path / "x.onnx"
    os.mkfifo(fifo)
    res = subprocess.run(_build_cmd(fifo, tmp_path / "out"), capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr
    assert "not a regular file" in res.stderr and not (tmp_path / "out").exists()
