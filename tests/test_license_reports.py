# SPDX-License-Identifier: Apache-2.0
"""Reports people read or tools ingest, through the real CLI: ``check licenses --html`` (verdict
banner, findings by level, waivers, refused waivers), SPDX 2.3 JSON beside CycloneDX (``--spdx`` and
``sbom.spdx.json`` in every built bundle), ``inspect capability --html/--dot`` (partitions by placement,
boundary crossings)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_profiler import make_mlp_bundle  # tests/ is on sys.path (rootdir conftest)

PYPROJECT = '[project]\nname="x"\nversion="0"\nlicense="MIT"\ndependencies=[]\n'


class Page(HTMLParser):
    """Tables by id (rows of (class, cells)), the verdict banner's text, and every tag seen."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, list[tuple[str, list[str]]]] = {}
        self.ids: dict[str, str] = {}
        self.tags: list[tuple[str, dict]] = []
        self._table: str | None = None
        self._row: tuple[str, list[str]] | None = None
        self._cell: list[str] | None = None
        self._capture: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = (a.get("class") or "", [])
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        if a.get("id") and tag != "table":
            self._capture = a["id"]
            self.ids[a["id"]] = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row[1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row[1] and self._table is not None:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif self._capture and tag in ("div", "span", "p"):
            self._capture = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._capture:
            self.ids[self._capture] += data


def assert_self_contained(page: Page) -> None:
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "img", "iframe"), tag
        assert not any(k in ("src", "href") for k in attrs), (tag, attrs)


SPDX_ID = re.compile(r"^SPDXRef-[A-Za-z0-9.-]+$")


def assert_spdx23(doc: dict) -> None:
    """The fields SPDX 2.3 requires (spec clauses 6 and 7), checked here independently of edgesdk."""
    assert doc["spdxVersion"] == "SPDX-2.3" and doc["dataLicense"] == "CC0-1.0"
    assert doc["SPDXID"] == "SPDXRef-DOCUMENT" and doc["name"]
    assert re.match(r"^[a-z][a-z0-9+.-]*://[^#\s]+$", doc["documentNamespace"])
    info = doc["creationInfo"]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", info["created"])
    assert info["creators"] and all(re.match(r"^(Tool|Person|Organization): .+", c) for c in info["creators"])
    ids = {"SPDXRef-DOCUMENT"}
    for p in doc["packages"]:
        assert SPDX_ID.match(p["SPDXID"]) and p["SPDXID"] not in ids, p
        ids.add(p["SPDXID"])
        assert p["name"] and p["downloadLocation"]
        for key in ("licenseConcluded", "licenseDeclared"):
            assert p[key], (p["name"], key)
        if p.get("filesAnalyzed", True):
            assert "packageVerificationCode" in p
    refs = {
        m
        for p in doc["packages"]
        for k in ("licenseConcluded", "licenseDeclared")
        for m in re.findall(r"LicenseRef-[A-Za-z0-9.-]+", p[k])
    }
    assert refs <= {x["licenseId"] for x in doc.get("hasExtractedLicensingInfos", [])}
    rels = doc["relationships"]
    assert {
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": doc["packages"][0]["SPDXID"],
    } in rels
    for r in rels:
        assert r["spdxElementId"] in ids and r["relatedSpdxElement"] in ids, r
    from edgesdk.compliance.sbom import check_spdx

    assert check_spdx(doc) == []


# ------------------------------------------------------------------ check licenses --html / --spdx


def test_html_report_has_verdict_levels_waivers_and_refused_waivers(tmp_path, run_cli):
    pytest.importorskip("scanoss")
    root = tmp_path / "tree"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    for rel, spdx in {"gpl.py": "GPL-3.0-only", "lgpl.py": "LGPL-3.0-only", "ok.py": "BSD-3-Clause"}.items():
        (root / rel).write_text(f"# SPDX-License-Identifier: {spdx}\nx = 1\n")
    (root / "note<b>.py").write_text("# SPDX-License-Identifier: ISC\n")  # markup in a file name is escaped
    waivers = tmp_path / "w.yaml"
    waivers.write_text(
        json.dumps(
            {
                "waivers": [
                    {
                        "id": "W-GPL",
                        "by": "a@example.com",
                        "reason": "no",
                        "expires": "2099-01-01",
                        "license": "GPL-3.0-only",
                    },
                    {
                        "id": "W-LGPL",
                        "by": "b@example.com",
                        "reason": "dynamic",
                        "expires": "2099-01-01",
                        "subject": "lgpl.py",
                    },
                ]
            }
        )
    )
    html, spdx = tmp_path / "r.html", tmp_path / "r.spdx.json"
    done = run_cli("check", "licenses", root, "--waivers", waivers, "--summary", "--html", html, "--spdx", spdx)
    assert done.returncode == 2, done.stderr
    text = html.read_text(encoding="utf-8")
    page = Page(text)
    assert_self_contained(page)
    assert page.ids["verdict"].strip() == "Verdict: DENY"
    rows = {cells[2]: (cls, cells) for cls, cells in page.tables["findings"][1:]}
    assert rows["gpl.py"][0] == "deny" and rows["gpl.py"][1][0] == "deny"
    assert rows["lgpl.py"][0] == "allow resolved" and rows["lgpl.py"][1][6] == "review -> waived (W-LGPL)"
    assert rows["ok.py"][0] == "allow"
    assert "note<b>.py" in rows and "note<b>.py" not in text  # escaped, not markup
    assert [c for _, c in page.tables["waivers"][1:]] == [
        ["applied", "W-LGPL", "b@example.com", "2099-01-01", "dynamic"]
    ]
    ((cls, refused),) = page.tables["refused"][1:]
    assert cls == "deny" and refused[:3] == ["W-GPL", "a@example.com", "source:gpl.py"]
    counts = page.tables["counts"]
    assert counts[1][1][:3] == ["1", "1", str(len(rows) - 2)]
    assert_spdx23(json.loads(spdx.read_text()))


@pytest.fixture(scope="module")
def built_bundle(tmp_path_factory) -> Path:
    """A real bundle built by `edgesdk build` (the license gate writes both SBOMs)."""
    import subprocess
    import sys

    src = make_mlp_bundle(tmp_path_factory.mktemp("src") / "mlp") / "model.onnx"
    out = tmp_path_factory.mktemp("built") / "b"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            str(src),
            "--profile",
            "cpu-x86_64",
            "-o",
            str(out),
            "--no-progress",
            "--model-license",
            "Apache-2.0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_build_writes_spdx_beside_cyclonedx(built_bundle):
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    arts = {a["path"]: a for a in manifest["artifacts"]}
    assert arts["sbom.spdx.json"]["role"] == "sbom-spdx" and "sbom.cdx.json" in arts
    doc = json.loads((built_bundle / "sbom.spdx.json").read_text())
    assert_spdx23(doc)
    by_name = {p["name"]: p for p in doc["packages"]}
    model = next(p for p in doc["packages"] if p["name"].endswith(" model"))
    assert model["licenseConcluded"] == "Apache-2.0" and "--model-license" in model["comment"]
    weight = by_name["model.onnx"]
    assert weight["checksums"] == [{"algorithm": "SHA256", "checksumValue": arts["model.onnx"]["sha256"]}]
    # The same inventory as the CycloneDX SBOM: every library there is a package here, same version.
    cdx = json.loads((built_bundle / "sbom.cdx.json").read_text())
    libs = {(c["name"], c.get("version")) for c in cdx["components"] if c["type"] == "library"}
    assert libs and libs <= {(p["name"], p.get("versionInfo")) for p in doc["packages"]}
    assert any(
        p.get("externalRefs", [{}])[0].get("referenceLocator", "").startswith("pkg:pypi/onnxruntime@")
        for p in doc["packages"]
    )


@pytest.mark.slow
def test_check_licenses_on_a_bundle_writes_html_and_spdx(built_bundle, run_cli, tmp_path):
    html, spdx = tmp_path / "b.html", tmp_path / "b.spdx.json"
    done = run_cli("check", "licenses", built_bundle, "--html", html, "--spdx", spdx)
    assert done.returncode == 0, done.stderr
    page = Page(html.read_text(encoding="utf-8"))
    assert page.ids["verdict"].strip() == "Verdict: PASS"
    assert all(cls == "allow" for cls, _ in page.tables["findings"][1:])
    assert "onnxruntime" in " ".join(c[2] for _, c in page.tables["findings"][1:])
    assert_spdx23(json.loads(spdx.read_text()))


def test_unwritable_report_path_is_one_line(tmp_path, run_cli):
    root = tmp_path / "t"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    done = run_cli("check", "licenses", root, "--html", tmp_path / "missing" / "r.html")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error: cannot write") and "Traceback" not in done.stderr


# ------------------------------------------------------------------ inspect capability --html / --dot


def parse_dot(text: str) -> dict:
    """A small DOT reader for what render_dot writes: clusters with their nodes, node fill colours, edges."""
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    clusters: dict[str, list[str]] = {}
    current = None
    nodes: dict[str, str] = {}
    edges = []
    for line in text.splitlines():
        s = line.strip()
        if m := re.match(r"subgraph (cluster_\w+) \{", s):
            current = m.group(1)
            clusters[current] = []
        elif s == "}":
            current = None
        elif m := re.match(r"(n\d+) -> (n\d+)(?: \[(.*)\])?;$", s):
            edges.append((m.group(1), m.group(2), m.group(3) or ""))
        elif m := re.match(r'(\w+) \[label=".*", fillcolor="(#[0-9a-f]{6})"', s):
            nodes[m.group(1)] = m.group(2)
            if current:
                clusters[current].append(m.group(1))
    for a, b, _ in edges:
        assert a in nodes and b in nodes, (a, b)
    return {"clusters": clusters, "nodes": nodes, "edges": edges}


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    import test_capability_models as models

    return models.make_cnn(tmp_path_factory.mktemp("cap") / "cnn.onnx")


def test_capability_dot_and_html_show_partitions_and_crossings(cnn_onnx, run_cli, tmp_path):
    from edgesdk.capability.render import PLACEMENT_STYLE

    dot, html = tmp_path / "cnn.dot", tmp_path / "cnn.html"
    done = run_cli(
        "inspect", "capability", cnn_onnx, "-p", "orin-agx-64gb", "--precision", "fp16", "--dot", dot, "--html", html
    )
    assert done.returncode == 0, done.stderr
    g = parse_dot(dot.read_text())
    parts = {k: v for k, v in g["clusters"].items() if k.startswith("cluster_p")}
    # Conv/ReLU/MaxPool on the DLA, pool+flatten on TensorRT, the classifier back on the DLA.
    dla, trt = PLACEMENT_STYLE["dla"][0], PLACEMENT_STYLE["tensorrt"][0]
    assert [{g["nodes"][n] for n in v} for v in parts.values()] == [{dla}, {trt}, {dla}]
    crossing = [e for e in g["edges"] if "penwidth=2.5" in e[2]]
    assert len(crossing) == 2 and all(e[0] in parts["cluster_p0"] or e[0] in parts["cluster_p1"] for e in crossing)
    assert len(g["nodes"]) - len(g["clusters"].get("cluster_legend", [])) == sum(len(v) for v in parts.values())
    if __import__("shutil").which("dot"):
        import subprocess

        assert subprocess.run(["dot", "-Tsvg", str(dot)], capture_output=True).returncode == 0
    page = Page(html.read_text(encoding="utf-8"))
    assert_self_contained(page)
    parts_rows = page.tables["partitions"][1:]
    assert [cells[1] for _, cells in parts_rows] == ["DLA", "TensorRT", "DLA"]
    assert [int(cells[2]) for _, cells in parts_rows] == [len(v) for v in parts.values()]
    assert len(page.tables["crossings"]) - 1 == 2
    assert [(c[1], c[2]) for _, c in page.tables["crossings"][1:]] == [
        ("#0 DLA", "#1 TensorRT"),
        ("#1 TensorRT", "#2 DLA"),
    ]
    strip = [a["style"] for t, a in page.tags if t == "div" and "flex:" in a.get("style", "")]
    assert len(strip) == 3 and dla in strip[0] and trt in strip[1]


@pytest.mark.slow
def test_capability_html_marks_cpu_fallback(tmp_path, run_cli):
    pytest.importorskip("onnx")
    import test_capability_models as models

    model = models.make_custom_op(tmp_path / "custom.onnx")
    html = tmp_path / "c.html"
    done = run_cli("inspect", "capability", model, "-p", "orin-nano-8gb", "--html", html)
    assert done.returncode == 0, done.stderr
    page = Page(html.read_text(encoding="utf-8"))
    labels = [cells[1] for _, cells in page.tables["partitions"][1:]]
    assert labels == ["TensorRT", "no backend", "TensorRT"]
