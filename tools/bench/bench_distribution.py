# SPDX-License-Identifier: Apache-2.0
"""Push + pull + verify of a ~1 GB bundle through a loopback registry vs plain HTTP with curl (issue 36's goal:
within 1.3x of copying the same blobs to and from the same registry).

A real registry (Debian's ``docker-registry``, CNCF distribution) on loopback, a bundle holding one ~1 GB ONNX model
(a MatMul with random float32 weights, built for ``cpu-x86_64`` at FP32). Per round, in turns:

- **edgesdk**: ``edgesdk push BUNDLE oci://.../bench/mm:rN`` (a fresh repository each round: every blob uploaded),
  then ``edgesdk pull`` into a fresh ``EDGESDK_HOME`` (digests checked while downloading, the bundle's sha256 table
  checked, then atomically renamed into the store);
- **curl**: every file of the bundle uploaded the way the distribution API takes a blob (POST an upload, PUT it
  with its digest: ``curl -T``) into another fresh repository, then downloaded with ``curl`` (GET each blob) and
  checked with ``sha256sum``: the same bytes, both ways, with the same integrity check, and none of edgesdk's
  manifest, index or store work.

The ratio is the sum of edgesdk's push and pull seconds over the sum of curl's, per round and median.

    python tools/bench/bench_distribution.py --size-mb 1024 --rounds 3

Writes --out (default tools/bench/results/distribution_1gb.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_registry(root: Path) -> tuple[subprocess.Popen, int]:
    port = _port()
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "config.yml"
    cfg.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n"
    )
    proc = subprocess.Popen([REGISTRY, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the registry did not start")


def make_bundle(work: Path, size_mb: int) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = int((size_mb * 2**20 / 4) ** 0.5)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    model.metadata_props.add(key="license", value="apache-2.0")
    src = work / "mm.onnx"
    onnx.save(model, str(src))
    out = work / "bundle"
    subprocess.run(
        [sys.executable, "-m", "edgesdk", "build", str(src), "-p", "cpu-x86_64", "--precision", "fp32", "-o", str(out),
         "--no-progress"],
        check=True,
    )  # fmt: skip
    return out


def curl_round(bundle: Path, port: int, repo: str, dest: Path) -> float:
    """Upload every file of ``bundle`` as a blob, download each again and check its sha256: seconds."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    digests = {}
    for p in files:  # the digests are what a client knows before it uploads (edgesdk's manifest has them too)
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        digests[p] = "sha256:" + h.hexdigest()
    base = f"http://127.0.0.1:{port}/v2/{repo}/blobs"
    t0 = time.perf_counter()
    for p in files:
        head = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-D", "-", "-X", "POST", f"{base}/uploads/"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        loc = next(ln.split(":", 1)[1].strip() for ln in head.splitlines() if ln.lower().startswith("location:"))
        if loc.startswith("/"):
            loc = f"http://127.0.0.1:{port}{loc}"
        sep = "&" if "?" in loc else "?"
        subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "-T", str(p), "-H", "Content-Type: application/octet-stream",
             f"{loc}{sep}digest={digests[p]}"],
            check=True,
        )  # fmt: skip
    dest.mkdir(parents=True)
    for i, p in enumerate(files):
        got = dest / f"{i}"
        subprocess.run(["curl", "-sfL", "-o", str(got), f"{base}/{digests[p]}"], check=True)
        out = subprocess.run(["sha256sum", str(got)], capture_output=True, text=True, check=True).stdout.split()[0]
        if "sha256:" + out != digests[p]:
            raise SystemExit(f"curl download of {p.name} has the wrong digest")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "tools/bench/results/distribution_1gb.json"))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    try:
        bundle = make_bundle(work, a.size_mb)
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        proc, port = start_registry(work / "registry")
        rows = []
        try:
            for r in range(a.rounds):
                home = work / f"home{r}"
                env = {**os.environ, "EDGESDK_HOME": str(home)}
                ref = f"oci://127.0.0.1:{port}/bench/mm{r}:v1"
                order = ("edgesdk", "curl") if r % 2 == 0 else ("curl", "edgesdk")
                row: dict = {"round": r}
                for who in order:
                    if who == "edgesdk":
                        t0 = time.perf_counter()
                        subprocess.run(
                            [sys.executable, "-m", "edgesdk", "push", str(bundle), ref, "-q"], check=True, env=env
                        )
                        t1 = time.perf_counter()
                        subprocess.run(
                            [sys.executable, "-m", "edgesdk", "pull", ref, "--profile", "cpu-x86_64", "-q"],
                            check=True, env=env, stdout=subprocess.DEVNULL,
                        )  # fmt: skip
                        t2 = time.perf_counter()
                        row.update(edgesdk_push_s=round(t1 - t0, 3), edgesdk_pull_s=round(t2 - t1, 3))
                        shutil.rmtree(home, ignore_errors=True)
                    else:
                        row["curl_s"] = round(curl_round(bundle, port, f"bench/curl{r}", work / f"curl{r}"), 3)
                        shutil.rmtree(work / f"curl{r}", ignore_errors=True)
                row["ratio"] = round((row["edgesdk_push_s"] + row["edgesdk_pull_s"]) / row["curl_s"], 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            proc.terminate()
            proc.wait(10)
        ratio = statistics.median(r["ratio"] for r in rows)
        git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        doc = {
            "what": "edgesdk push + pull (verified) vs curl upload + download + sha256sum of the same blobs, loopback "
            "docker-registry (tools/bench/bench_distribution.py)",
            "bundle_bytes": size,
            "rounds": rows,
            "median_ratio": ratio,
            "goal": "<= 1.3",
            "git": git.strip(),
            "loadavg_at_end": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"bundle {size / 2**20:.0f} MiB: edgesdk / curl median {ratio:.3f}x (goal <= 1.3)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
