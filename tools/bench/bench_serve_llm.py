# SPDX-License-Identifier: Apache-2.0
"""`edgesdk serve` on a GGUF bundle (continuous batching, and one request at a time) vs llama-cpp-python's own
server, llama.cpp's own `llama-server -np N` (optional) and a bare `Llama` loop.

Same GGUF file, same settings everywhere: n_ctx (the bundle's, as `edgesdk.load` picks it), the
same thread count for prompt and decode, greedy decoding (temperature 0), `max_tokens` fixed.

1. Throughput: C concurrent asyncio httpx clients (C in --concurrency) send streaming
   `/v1/completions` requests, every prompt different from its first token (a number sequence the
   model continues to max_tokens). Per server: completion tokens/s over the wall time, TTFT
   (request sent -> first non-empty text chunk) p50/p99, request latency p50/p99, errors. Servers:
   `edgesdk serve` as a user starts it (continuous batching, slots from --parallel or its default),
   `edgesdk serve --parallel 1` (one request at a time: the single-stream anchor), llama_cpp.server and, with
   `--llama-server PATH`, llama.cpp's own server (`llama-server -np N -c N*n_ctx --no-kv-unified`: N slots of
   the bundle's n_ctx each, one KV stream per slot as edgesdk's engine; the same threads, GPU layers and flash
   attention as edgesdk's session; N = edgesdk's slots, read from its /metrics, unless --llama-server-np; build
   it with tools/device/build_llama_server.sh from the llama.cpp that llama-cpp-python vendors).
   They run at the same time (an idle one costs nothing) and are measured in turns, A B C C B A per
   concurrency, so machine noise hits all alike. llama_cpp.server runs with
   `--interrupt_requests False`: its default stops a streaming response as soon as another request
   waits, which truncates completions under concurrency. Completion tokens: edgesdk's and
   llama-server's streams end with `usage` (llama-server's /v1/completions stream always sends it in its
   final chunk, `completion_tokens` = the tokens it decoded; edgesdk's with `stream_options.include_usage`),
   and those are counted; llama_cpp.server's stream has no usage, so its returned text is tokenised with the
   model's own tokenizer (every row also records that text count, `completion_tokens_text`, as a cross-check).
   The bare loop runs the same prompts one after another in this process
   (`Llama.reset()` + `create_completion(stream=True)`), in turns between the servers' turns: the
   ceiling without HTTP.
2. Multi-turn prompt reuse: one conversation (a fixed system prompt + growing history, replies
   greedy) through `/v1/chat/completions` on the batched `edgesdk serve` with `--no-prefix-reuse` and
   with prefix reuse (the default: a slot keeps its last request's KV cells); TTFT per turn, and whether
   every reply is token-identical. Needs a GGUF with a chat template.

    python tools/bench/bench_serve_llm.py BUNDLE --threads 2 --max-tokens 32
    python tools/bench/bench_serve_llm.py BUNDLE --threads 2 --max-tokens 32 --concurrency 1,4,8 \
        --llama-server .llamacpp/server-cpu/llama-server --out tools/bench/results/serve_llm_cpu_vs_llama_server.json

Writes tools/bench/results/serve_llm.json (--out: elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

# Modules this script and llama_cpp.server (llama-cpp-python's [server] extra) import, and their packages:
# edgesdk's `bench` extra installs them all.
BENCH_MODULES = {
    "llama_cpp": "llama-cpp-python",
    "httpx": "httpx",
    "uvicorn": "uvicorn",
    "fastapi": "fastapi",
    "sse_starlette": "sse-starlette",
    "starlette_context": "starlette-context",
    "pydantic_settings": "pydantic-settings",
    "yaml": "PyYAML",
}


def require_bench_extra() -> None:
    missing = [pkg for mod, pkg in BENCH_MODULES.items() if find_spec(mod) is None]
    if missing:
        raise SystemExit(
            f"bench_serve_llm.py needs {', '.join(missing)} (llama_cpp.server's dependencies): "
            "install the bench extra, e.g. pip install -e '.[bench]' (llama-cpp-python: build it "
            'with CMAKE_ARGS="-DGGML_NATIVE=OFF", see the Makefile)'
        )


if __name__ == "__main__" and "--no-llama-cpp-server" not in sys.argv:
    require_bench_extra()  # before the imports below, so a missing package is one line naming the extra

import httpx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402
from bench_serve import free_port  # noqa: E402

SYSTEM = (
    "You are a concise assistant for engineers who deploy small language models on edge devices such "
    "as Jetson boards and x86 servers. Answer in one or two sentences, name concrete tools where it "
    "helps, and say when you are unsure. Prefer numbers to adjectives. "
) * 3
QUESTIONS = [
    "What is a GGUF file?",
    "Why would I quantize a model to 4 bits?",
    "What does the KV cache hold?",
    "How many CPU threads should llama.cpp use?",
    "What is prefill, compared with decode?",
    "How do I measure time to first token?",
    "What limits decode speed on a CPU?",
    "Should I batch requests on a single-core device?",
]


def prompt(i: int) -> str:
    start = 100 + 37 * i
    return ", ".join(str(start + k) for k in range(12)) + ","


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def wait_ready(proc: subprocess.Popen, url: str, what: str, path: str, log: Path | None = None) -> None:
    for _ in range(900):
        if proc.poll() is not None:
            tail = ("; its log ends:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])) if log else ""
            raise SystemExit(f"{what} exited {proc.returncode}{tail}")
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not start")


def start_edgesdk(bundle: str, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "serve",
            bundle,
            "--name",
            "m",
            "--port",
            str(port),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "edgesdk serve", "/health")
    return proc, url


def start_llama_cpp_server(gguf: str, threads: int, n_ctx: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--model_alias",
            "m",
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "llama_cpp.server", "/v1/models")
    return proc, url


def llama_server_command(
    binary: str, gguf: str, threads: int, n_ctx: int, slots: int, session: dict, extra: list[str]
) -> list[str]:
    """llama.cpp's own server set up as edgesdk's engine is: ``slots`` sequences of ``n_ctx`` tokens each (``-c``
    is the whole KV cache, split evenly over the slots when the cache is not unified), one KV stream per slot
    (``--no-kv-unified``, as edgesdk's ``kv_unified`` off), the threads for decode and prompt, the session's GPU
    layers (edgesdk's -1, all, is llama-server's ``all``; its -1 means auto) and flash attention, and ``--fit
    off`` so llama.cpp does not resize anything to fit memory. The rest are llama-server's defaults."""
    ngl = int(session.get("n_gpu_layers") or 0)
    return [
        binary,
        "-m",
        gguf,
        "--alias",
        "m",
        "--host",
        "127.0.0.1",
        "-np",
        str(slots),
        "-c",
        str(slots * n_ctx),
        "--no-kv-unified",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-ngl",
        "all" if ngl < 0 else str(ngl),
        "-fa",
        "on" if session.get("flash_attn") else "off",
        "--fit",
        "off",
        *extra,
    ]


def start_llama_server(cmd: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, "llama-server", "/health", log)  # 503 while the model loads, 200 when ready
    return proc, url


def edgesdk_slots(url: str) -> int | None:
    """The slots edgesdk serve decided on (its ``edgesdk_serve_slots`` gauge), or None."""
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(r'^edgesdk_serve_slots\{model="m"\} ([0-9.]+)$', text, re.M)
    return int(float(m.group(1))) if m else None


def git_state() -> dict:
    """HEAD and whether the code this run measures (edgesdk/, this script) differs from it."""
    root = Path(__file__).resolve().parents[2]

    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", "--no-optional-locks", *a], cwd=root, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted": git("status", "--porcelain", "--", "edgesdk", "tools/bench/bench_serve_llm.py").splitlines(),
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def one_request(client: httpx.AsyncClient, url: str, body: dict, route: str) -> dict:
    t0 = time.perf_counter()
    first = None
    text = ""
    done = False
    usage = None
    try:
        async with client.stream("POST", url + route, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return {"error": f"HTTP {resp.status_code}"}
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return {"error": str(chunk["error"])[:200]}
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if piece and first is None:
                        first = time.perf_counter()
                    text += piece
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    end = time.perf_counter()
    if not done:
        return {"error": "stream ended without [DONE]"}
    return {
        "ttft_s": (first or end) - t0,
        "latency_s": end - t0,
        "text": text,
        "completion_tokens": usage.get("completion_tokens") if usage else None,
    }


async def load(url: str, concurrency: int, n: int, offset: int, max_tokens: int, count, usage: bool = False) -> dict:
    """``usage``: the server reports usage in its stream (edgesdk): count its completion tokens (a random-weight
    model's text can re-tokenise to far fewer tokens than were generated); else tokenise the text."""
    todo = iter(range(n))
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency + 2)) as client:

        async def worker():
            for i in todo:
                body = {
                    "model": "m",
                    "prompt": prompt(offset + i),
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": True,
                    **({"stream_options": {"include_usage": True}} if usage else {}),
                }
                results.append(await one_request(client, url, body, "/v1/completions"))

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["completion_tokens"] if r.get("completion_tokens") is not None else count(r["text"]) for r in ok)
    return {
        "requests": n,
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "completion_tokens_text": sum(count(r["text"]) for r in ok),
        "tok_per_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(1000 * pct([r["ttft_s"] for r in ok], 0.5), 1) if ok else None,
        "ttft_p99_ms": round(1000 * pct([r["ttft_s"] for r in ok], 0.99), 1) if ok else None,
        "latency_p50_ms": round(1000 * pct([r["latency_s"] for r in ok], 0.5), 1) if ok else None,
        "latency_p99_ms": round(1000 * pct([r["latency_s"] for r in ok], 0.99), 1) if ok else None,
        "errors": len(results) - len(ok),
        "error_examples": sorted({r["error"] for r in results if "error" in r})[:3],
    }


def merge(runs: list[dict]) -> dict:
    """Two turns of the same measurement: sums for throughput, the worse (max) of the percentiles."""
    wall = sum(r["wall_s"] for r in runs)
    tokens = sum(r["completion_tokens"] for r in runs)
    out = {
        "requests": sum(r["requests"] for r in runs),
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "completion_tokens_text": sum(r["completion_tokens_text"] for r in runs),
        "tok_per_s": round(tokens / wall, 2),
        "errors": sum(r["errors"] for r in runs),
        "turns_tok_per_s": [r["tok_per_s"] for r in runs],
    }
    for key in ("ttft_p50_ms", "latency_p50_ms"):
        vals = [r[key] for r in runs if r[key] is not None]
        out[key] = round(statistics.median(vals), 1) if vals else None
    for key in ("ttft_p99_ms", "latency_p99_ms"):
        vals = [r[key] for r in runs if r[key] is not None]
        out[key] = max(vals) if vals else None
    return out


class BareLoop:
    """Bare llama-cpp-python in this process, the same GGUF and settings: `reset()` + streaming
    `create_completion` per request, one after another. Measured in turns between the servers' turns."""

    def __init__(self, gguf: str, threads: int, n_ctx: int, max_tokens: int, count, settings: dict | None = None):
        import llama_cpp

        gpu = settings or {}  # on a GPU: the offload and flash attention the bundle's session got
        self.llm = llama_cpp.Llama(
            model_path=gguf,
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=int(gpu.get("n_gpu_layers") or 0),
            flash_attn=bool(gpu.get("flash_attn")),
            verbose=False,
        )
        self.max_tokens, self.count = max_tokens, count
        self.ttft: list[float] = []
        self.lat: list[float] = []
        self.tokens = 0
        self.wall = 0.0
        self.requests = 0
        for _ in self.llm.create_completion(prompt(9000), max_tokens=4, temperature=0, stream=True):  # warm-up
            pass

    def turn(self, offset: int, n: int) -> None:
        t_all = time.perf_counter()
        for i in range(offset, offset + n):
            self.llm.reset()
            t0 = time.perf_counter()
            first, text = None, ""
            for chunk in self.llm.create_completion(prompt(i), max_tokens=self.max_tokens, temperature=0, stream=True):
                piece = chunk["choices"][0]["text"]
                if piece and first is None:
                    first = time.perf_counter()
                text += piece
            end = time.perf_counter()
            self.ttft.append((first or end) - t0)
            self.lat.append(end - t0)
            self.tokens += self.count(text)
        self.wall += time.perf_counter() - t_all
        self.requests += n

    def result(self) -> dict:
        self.llm.close()
        return {
            "requests": self.requests,
            "wall_s": round(self.wall, 3),
            "completion_tokens": self.tokens,
            "tok_per_s": round(self.tokens / self.wall, 2),
            "ttft_p50_ms": round(1000 * pct(self.ttft, 0.5), 1),
            "ttft_p99_ms": round(1000 * pct(self.ttft, 0.99), 1),
            "latency_p50_ms": round(1000 * pct(self.lat, 0.5), 1),
            "latency_p99_ms": round(1000 * pct(self.lat, 0.99), 1),
            "errors": 0,
        }


async def conversation(url: str, max_tokens: int, turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": SYSTEM}]
    out = []
    async with httpx.AsyncClient(timeout=600) as client:
        for q in QUESTIONS[:turns]:
            msgs.append({"role": "user", "content": q})
            body = {"model": "m", "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "stream": True}
            r = await one_request(client, url, body, "/v1/chat/completions")
            if "error" in r:
                raise SystemExit(f"multi-turn request failed: {r['error']}")
            out.append({"ttft_ms": round(1000 * r["ttft_s"], 1), "reply": r["text"]})
            msgs.append({"role": "assistant", "content": r["text"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", help="a GGUF bundle directory (with a chat template for the multi-turn part)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--requests-per-client",
        type=int,
        default=1,
        help="requests per client per turn (at least 4 per turn); 2 turns per server",
    )
    ap.add_argument("--turns", type=int, default=6, help="multi-turn conversation length (0: none)")
    ap.add_argument("--parallel", type=int, default=None, help="edgesdk serve --parallel (default: its own)")
    ap.add_argument(
        "--no-llama-cpp-server",
        action="store_true",
        help="leave llama_cpp.server out (a machine without the bench extra)",
    )
    ap.add_argument(
        "--llama-server",
        metavar="PATH",
        default=None,
        help="also measure llama.cpp's own llama-server binary (tools/device/build_llama_server.sh)",
    )
    ap.add_argument(
        "--llama-server-np",
        type=int,
        default=None,
        help="llama-server -np (default: the slots edgesdk serve decided on)",
    )
    ap.add_argument(
        "--llama-server-args",
        default="",
        help="more llama-server arguments, one string: --llama-server-args='--cache-ram 0'",
    )
    ap.add_argument("--out", default=str(RESULTS / "serve_llm.json"))
    args = ap.parse_args()
    if args.llama_server and not os.access(args.llama_server, os.X_OK):
        raise SystemExit(f"--llama-server {args.llama_server}: not an executable file")
    load_before = loadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import llama_cpp

    import edgesdk

    bundle = Path(args.bundle)
    with edgesdk.load(bundle, threads=args.threads) as s:  # the GGUF and n_ctx exactly as the server loads them
        n_ctx = int(s.backend.settings["n_ctx"])
        got = dict(s.backend.settings)
        gguf = str(s.bundle.artifact_path("model"))
    vocab = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0

    levels = [int(c) for c in args.concurrency.split(",")]
    settings = {
        "n_ctx": n_ctx,
        "session": got,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "n_batch": 512,
        "requests_per_turn": {c: max(4, c * args.requests_per_client) for c in levels},
    }
    print(f"settings: {settings}", flush=True)
    bare_loop = BareLoop(gguf, args.threads, n_ctx, args.max_tokens, count, got)
    queue = ["--max-queue", str(max(levels) * args.requests_per_client)]
    par = ["--parallel", str(args.parallel)] if args.parallel else []
    servers = {
        "edgesdk": start_edgesdk(str(bundle), args.threads, queue + par),
        "edgesdk_parallel_1": start_edgesdk(str(bundle), args.threads, queue + ["--parallel", "1"]),
    }
    if not args.no_llama_cpp_server:
        servers["llama_cpp_server"] = start_llama_cpp_server(gguf, args.threads, n_ctx)
    log_dir = tempfile.TemporaryDirectory(prefix="bench-serve-llm-")  # llama-server's log, shown if it fails
    throughput: dict = {}
    try:  # llama-server starts in here: a failure stops the others too
        if args.llama_server:
            slots = args.llama_server_np or edgesdk_slots(servers["edgesdk"][1]) or args.parallel
            if not slots:
                raise SystemExit("edgesdk serve's /metrics has no edgesdk_serve_slots: pass --llama-server-np")
            cmd = llama_server_command(
                os.path.abspath(args.llama_server),
                gguf,
                args.threads,
                n_ctx,
                slots,
                got,
                args.llama_server_args.split(),
            )
            version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True, timeout=60)
            settings["llama_server"] = {
                "np": slots,
                "np_from": "--llama-server-np"
                if args.llama_server_np
                else "edgesdk serve's slots (/metrics edgesdk_serve_slots)",
                "command": [Path(cmd[0]).name, *cmd[1:]],
                "version": (version.stdout + version.stderr).strip().splitlines(),
            }
            print(f"llama-server: {' '.join(settings['llama_server']['command'])}", flush=True)
            servers["llama_server"] = start_llama_server(cmd, Path(log_dir.name) / "llama-server.log")
        names = list(servers)
        for _proc, url in servers.values():  # warm-up: first decodes allocate
            asyncio.run(load(url, 1, 2, 9000, args.max_tokens, count))
        for c in levels:
            n = max(4, c * args.requests_per_client)
            runs: dict = {name: [] for name in names}
            for turn, name in enumerate(names + names[::-1]):  # A B C C B A
                half = turn // len(names)
                offset = 1000 * c + half * n  # the same prompts for every server in each half
                runs[name].append(
                    asyncio.run(
                        load(servers[name][1], c, n, offset, args.max_tokens, count, usage=name != "llama_cpp_server")
                    )
                )
                if turn in (0, len(names)):  # the bare loop between turns: same machine conditions
                    bare_loop.turn(offset, 2)
            row = {name: merge(runs[name]) for name in names}
            e = row["edgesdk"]
            for other in names[1:]:
                row[f"ratio_vs_{other}"] = (
                    round(e["tok_per_s"] / row[other]["tok_per_s"], 3) if row[other]["tok_per_s"] else None
                )
            throughput[str(c)] = row
            print(
                f"c={c:>2}: "
                + " | ".join(
                    f"{name} {row[name]['tok_per_s']} tok/s (TTFT p50 {row[name]['ttft_p50_ms']} p99 "
                    f"{row[name]['ttft_p99_ms']} ms, latency p50 {row[name]['latency_p50_ms']} ms, errors "
                    f"{row[name]['errors']})"
                    for name in names
                )
                + " | "
                + ", ".join(f"edgesdk/{o} {row[f'ratio_vs_{o}']}x" for o in names[1:]),
                flush=True,
            )
    finally:
        for proc, _url in servers.values():
            stop(proc)
        log_dir.cleanup()
    single = throughput[str(levels[0])]["edgesdk_parallel_1"]["tok_per_s"] if levels[0] == 1 else None
    if single:
        for row in throughput.values():
            row["edgesdk_vs_single_stream"] = round(row["edgesdk"]["tok_per_s"] / single, 2)
        print(
            "edgesdk aggregate / single-stream (edgesdk --parallel 1, 1 client): "
            + ", ".join(f"{c} clients {row['edgesdk_vs_single_stream']}x" for c, row in throughput.items()),
            flush=True,
        )
    bare = bare_loop.result()
    print(
        f"bare Llama loop (sequential, {bare['requests']} requests in turns between the servers'): "
        f"{bare['tok_per_s']} tok/s (TTFT p50 {bare['ttft_p50_ms']} ms, latency p50 {bare['latency_p50_ms']} ms)",
        flush=True,
    )
    for row in throughput.values():
        row["ratio_vs_bare_loop"] = round(row["edgesdk"]["tok_per_s"] / bare["tok_per_s"], 3)

    multi: dict = {}
    for label, flags in (("reuse_off", ["--no-prefix-reuse"]), ("reuse_on", [])) if args.turns else ():
        proc, url = start_edgesdk(str(bundle), args.threads, flags + par)
        try:
            asyncio.run(load(url, 1, 1, 9000, 4, count))  # warm-up
            multi[label] = asyncio.run(conversation(url, args.max_tokens, args.turns))
        finally:
            stop(proc)
    multi_turn: dict = {}
    if args.turns:
        off, on = multi["reuse_off"], multi["reuse_on"]
        later_off = statistics.median(t["ttft_ms"] for t in off[1:])
        later_on = statistics.median(t["ttft_ms"] for t in on[1:])
        identical = [a["reply"] == b["reply"] for a, b in zip(off, on, strict=True)]
        multi_turn = {
            "turns": args.turns,
            "prefix_reuse": "batched edgesdk serve, --no-prefix-reuse vs default",
            "ttft_ms_per_turn": {"reuse_off": [t["ttft_ms"] for t in off], "reuse_on": [t["ttft_ms"] for t in on]},
            "ttft_p50_turns_2_on_ms": {"reuse_off": later_off, "reuse_on": later_on},
            "ttft_reduction": round(later_off / later_on, 2),
            "replies_identical": identical,
            "replies": {"reuse_off": [t["reply"] for t in off], "reuse_on": [t["reply"] for t in on]},
        }
        print(
            f"multi-turn TTFT (turns 2..{args.turns}, p50): prefix reuse off {later_off} ms, on {later_on} ms -> "
            f"{multi_turn['ttft_reduction']}x lower; replies identical: {sum(identical)}/{len(identical)}",
            flush=True,
        )
    out = {
        "what": "edgesdk serve (batched, and --parallel 1) vs llama_cpp.server"
        + (" vs llama.cpp's llama-server -np N" if args.llama_server else "")
        + " vs a bare Llama loop, streaming /v1/completions, greedy; multi-turn chat TTFT with prefix reuse "
        "off/on",
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_state(),
        "edgesdk_from": str(Path(edgesdk.__file__).resolve().parent),
        "load_average_1_5_15": {"before": load_before, "after": loadavg()},
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "bundle": bundle.name,
        "gguf": Path(gguf).name,
        "machine": machine(),
        "llama_cpp_python": llama_cpp.__version__,
        "settings": settings,
        "note": "clients run on the same machine as the servers; the machine's cores were shared with other "
        "work during the run: compare ratios, not absolute figures",
        "throughput": throughput,
        "bare_llama_loop": bare,
        "multi_turn": multi_turn,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
