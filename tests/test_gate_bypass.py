# SPDX-License-Identifier: Apache-2.0
"""The license gate never fails open: broad waiver globs are refused, deny-level findings cannot be
waived, and a SCANOSS API that answers wrongly (wrong types, HTML, 500, never) is an error (exit 10)
that leaves nothing behind in the working directory. The scanner is a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edgesdk.compliance.gate import scan_licenses
from edgesdk.compliance.waivers import load_waivers
from edgesdk.errors import ExternalToolError, InputError

pytest.importorskip("scanoss")

from waiver_fixtures import PYPROJECT  # noqa: E402  (tests/ on sys.path)
from waiver_fixtures import waiver_file as _waiver_file  # noqa: E402


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    for rel, spdx in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# SPDX-License-Identifier: {spdx}\nx = 1\n")
    return root


# ------------------------------------------------------------------ waivers that name nothing


@pytest.mark.parametrize(
    "subject",
    [
        "*",
        "**",
        "?*",
        "***",
        "*.*",
        "**/*",
        "*?",
        "[!x]*",
        "*[a-z0-9]*",
        "?**",
        "[*]*",
        "*/**",
        "**.**",
        "*[!Z]*",
        "*==*",
    ],
)
def test_subject_glob_that_matches_everything_is_refused(tmp_path: Path, subject: str) -> None:
    with pytest.raises(InputError, match="would waive everything"):
        load_waivers(_waiver_file(tmp_path, subject=subject))


@pytest.mark.parametrize("subject", ["lgpl.py", "vendor/*", "crc32c==*", "src/legacy_*.c", "gemma-3-270m"])
def test_subject_that_names_something_is_kept(tmp_path: Path, subject: str) -> None:
    (waiver,) = load_waivers(_waiver_file(tmp_path, subject=subject))
    assert waiver.subject == subject


def test_broad_subject_with_a_license_is_bounded_by_the_license(tmp_path: Path) -> None:
    (waiver,) = load_waivers(_waiver_file(tmp_path, subject="*", license="LGPL-3.0-only"))
    assert (waiver.subject, waiver.license) == ("*", "LGPL-3.0-only")


@pytest.mark.parametrize("license_", ["   ", ""])
def test_license_that_is_no_expression_is_refused(tmp_path: Path, license_: str) -> None:
    with pytest.raises(InputError):
        load_waivers(_waiver_file(tmp_path, license=license_))


@pytest.mark.parametrize("subject", ["*a*", "*e*", "*m*", "*.gguf", "*0*"])
def test_glob_with_a_letter_that_names_nothing_is_refused(tmp_path: Path, subject: str) -> None:
    # Holds a literal letter, but the wildcard stands where the file or package name should be.
    with pytest.raises(InputError, match="names no file, directory or package"):
        load_waivers(_waiver_file(tmp_path, subject=subject))


def test_subject_only_waiver_matching_too_many_findings_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {f"pkg/m{i}/mod.py": "LGPL-3.0-only" for i in range(12)})
    waivers = _waiver_file(tmp_path, subject="pkg/*")  # names a directory, but 12 findings are too many
    with pytest.raises(InputError, match=r"matches 12 findings \(limit 10\)"):
        scan_licenses(root, waivers_path=waivers)
    ok = _waiver_file(tmp_path, subject="pkg/*", license="LGPL-3.0-only")  # named: bounded by the license
    assert scan_licenses(root, waivers_path=ok).verdict == "pass"


# ------------------------------------------------------------------ deny needs a policy change


def test_deny_level_finding_cannot_be_waived(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"gpl.py": "GPL-3.0-only", "lgpl.py": "LGPL-3.0-only"})
    waivers = tmp_path / "w.yaml"
    waivers.write_text(
        json.dumps(
            {
                "waivers": [
                    {"id": "W-GPL", "by": "a", "reason": "r", "expires": "2099-01-01", "license": "GPL-3.0-only"},
                    {"id": "W-LGPL", "by": "a", "reason": "r", "expires": "2099-01-01", "subject": "lgpl.py"},
                ]
            }
        )
    )
    result = scan_licenses(root, waivers_path=waivers)
    gpl = next(f for f in result.findings if f.subject == "gpl.py")
    lgpl = next(f for f in result.findings if f.subject == "lgpl.py")
    assert (gpl.action, gpl.waived_by, gpl.effective_action) == ("deny", None, "deny")
    assert (lgpl.action, lgpl.waived_by, lgpl.effective_action) == ("review", "W-LGPL", "allow")
    assert result.verdict == "deny"
    (refused,) = result.waiver_audit["refused"]
    assert refused["id"] == "W-GPL" and refused["refused"] == ["source:gpl.py"]
    assert "policy" in refused["why"]
    assert [w["id"] for w in result.waiver_audit["applied"]] == ["W-LGPL"]
    from edgesdk.compliance.report import to_markdown, to_summary

    assert "waiver W-GPL refused for source:gpl.py" in to_summary(result)
    assert "**refused** `W-GPL`" in to_markdown(result)
    # The documented way through is a policy change.
    policy = tmp_path / "p.yaml"
    policy.write_text("licenses:\n  GPL-3.0-only: allow\n")
    assert scan_licenses(root, waivers_path=waivers, policy_path=policy).verdict == "pass"


def test_cli_deny_with_waiver_still_exits_2(tmp_path: Path, run_cli) -> None:
    root = _tree(tmp_path, {"gpl.py": "AGPL-3.0-only"})
    waivers = _waiver_file(tmp_path, subject="gpl.py")
    proc = run_cli("check", "licenses", root, "--waivers", waivers, "--json", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["waivers"]["refused"][0]["id"] == "W-1"


# ------------------------------------------------------------------ scanner answers that are wrong


class _Api(BaseHTTPRequestHandler):
    """A SCANOSS API stand-in on loopback whose answer the test picks."""

    mode = "ok"
    release = threading.Event()

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"])).decode("utf-8", "replace")
        paths = [line.split(",", 2)[2] for line in body.splitlines() if line.startswith("file=")]
        good = {
            "id": "snippet",
            "component": "gplthing",
            "version": "1.0",
            "matched": "80%",
            "purl": ["pkg:github/acme/gplthing"],
            "licenses": [{"name": "GPL-2.0-only"}],
        }
        mode = self.mode
        if mode == "hang":
            self.release.wait(60)
            return
        if mode == "trickle":  # headers at once, then one byte a second: never complete in time
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(60):
                if self.release.wait(0.5):
                    return
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
            return
        status, ctype = 200, "application/json"
        answers = {
            "ok": {p: [good] for p in paths},
            "str-matches": {p: "GPL-2.0-only" for p in paths},
            "int-match": {p: [5] for p in paths},
            "licenses-str": {p: [{**good, "licenses": "GPL-2.0-only"}] for p in paths},
            "license-name-int": {p: [{**good, "licenses": [{"name": 2}]}] for p in paths},
            "id-int": {p: [{**good, "id": 7}] for p in paths},
            "purl-str": {p: [{**good, "purl": "pkg:github/acme/gplthing"}] for p in paths},
            "list-top": [{"file": p} for p in paths],
            "null-top": None,
        }
        if mode in answers:
            data = json.dumps(answers[mode]).encode()
        elif mode == "html":
            ctype, data = "text/html", b"<html><body>Bad gateway</body></html>"
        elif mode == "html-500":
            status, ctype, data = 500, "text/html", b"<html><body>Internal error</body></html>"
        elif mode == "json-500":
            status, data = 500, b'{"error": "boom"}'
        elif mode == "bad-json":
            data = b'{"copied.py": [{"id": "snippet", '
        else:
            raise AssertionError(mode)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def scan_api():
    servers = []

    def start(mode: str) -> str:
        handler = type("Handler", (_Api,), {"mode": mode, "release": threading.Event()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append((server, handler))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server, handler in servers:
        handler.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def code_tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "copied.py").write_text(
        "# SPDX-License-Identifier: MIT\n" + "".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(40))
    )
    return root


def test_well_formed_answer_still_becomes_a_finding(code_tree: Path, scan_api) -> None:
    result = scan_licenses(code_tree, scanoss_url=scan_api("ok"))
    (match,) = [f for f in result.findings if f.layer == "scanoss"]
    assert (match.subject, match.spdx, match.action) == ("copied.py", "GPL-2.0-only", "deny")


@pytest.mark.parametrize(
    "mode",
    ["str-matches", "int-match", "licenses-str", "license-name-int", "id-int", "purl-str", "list-top", "null-top"],
)
def test_answer_with_wrong_types_is_an_error_not_a_pass(code_tree: Path, scan_api, mode: str) -> None:
    with pytest.raises(ExternalToolError, match="malformed answer|no usable JSON"):
        scan_licenses(code_tree, scanoss_url=scan_api(mode))


@pytest.mark.parametrize(
    "mode, message",
    [
        ("html", "text/html, not JSON"),
        ("html-500", "HTTP 500"),
        ("json-500", "HTTP 500"),
        ("bad-json", "no usable JSON"),
    ],
)
def test_error_answers_fail_closed_and_leave_no_litter(
    code_tree: Path, scan_api, tmp_path: Path, monkeypatch, mode: str, message: str
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(ExternalToolError, match=message):
        scan_licenses(code_tree, scanoss_url=scan_api(mode))
    assert list(cwd.iterdir()) == [] and sorted(p.name for p in code_tree.iterdir()) == ["copied.py", "pyproject.toml"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hang", "trickle"])
def test_api_that_never_answers_times_out(code_tree: Path, scan_api, mode: str) -> None:
    url = scan_api(mode)
    start = time.monotonic()
    with pytest.raises(ExternalToolError, match=r"did not answer within 1\.5 s"):
        scan_licenses(code_tree, scanoss_url=url, scanoss_timeout=1.5)
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_cli_exit_10_on_malformed_answer_and_on_timeout(code_tree: Path, scan_api, tmp_path: Path, run_cli) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = run_cli("check", "licenses", code_tree, "--scanoss-url", scan_api("str-matches"), cwd=cwd, timeout=120)
    assert proc.returncode == 10, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: SCANOSS API")
    start = time.monotonic()
    proc = run_cli(
        "check",
        "licenses",
        code_tree,
        "--scanoss-url",
        scan_api("hang"),
        "--scanoss-timeout",
        "2",
        cwd=cwd,
        timeout=120,
    )
    assert proc.returncode == 10 and "did not answer within 2 s" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60
    proc = run_cli("check", "licenses", code_tree, "--scanoss-url", scan_api("html-500"), cwd=cwd, timeout=120)
    assert proc.returncode == 10 and "HTTP 500" in proc.stderr, proc.stderr
    assert list(cwd.iterdir()) == []
    proc = run_cli(
        "check", "licenses", code_tree, "--scanoss-url", scan_api("ok"), "--scanoss-timeout", "-1", cwd=cwd, timeout=120
    )
    assert proc.returncode == 1 and "not a positive number" in proc.stderr, proc.stderr


def test_default_timeout_is_documented_and_env_overrides(monkeypatch) -> None:
    from edgesdk.compliance.scanoss_match import DEFAULT_TIMEOUT_S, configured_timeout

    assert DEFAULT_TIMEOUT_S == 30.0 and configured_timeout(None) == 30.0
    monkeypatch.setenv("EDGESDK_SCANOSS_TIMEOUT", "4.5")
    assert configured_timeout(None) == 4.5 and configured_timeout(2) == 2.0
    monkeypatch.setenv("EDGESDK_SCANOSS_TIMEOUT", "nan")
    with pytest.raises(InputError):
        configured_timeout(None)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "licenses.md").read_text()
    assert "--scanoss-timeout" in doc and "30 s" in doc
