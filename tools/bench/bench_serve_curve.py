# SPDX-License-Identifier: Apache-2.0
"""The whole load curve of `edgesdk serve` on a GGUF bundle against llama.cpp's own `llama-server`, in one run.

1. **Steady load** at every client count in --clients (default 1, 2, 3, 4, 6, 8, 16, 32): C closed-loop
   clients, each sending its next streaming `/v1/completions` request as soon as its last one ends, for
   --seconds per point; every prompt differs from its first token (a number sequence the model continues to
   --max-tokens, greedy). Tokens are counted as they stream inside the window (each finished request's chunks
   converted to tokens by its `usage`; a request still streaming at the window's end is cut there and counted
   for what it streamed). Per server and point: aggregate completion tok/s, requests, TTFT p50/p99 (request
   sent -> first streamed chunk with text or a token), errors.
   Servers: `edgesdk serve BUNDLE` with its defaults (as a user starts it), and with --llama-server PATH
   `llama-server -np N -c N*n_ctx -fa on|off -ngl all` for each N in --llama-server-np (default 16 and 4), on the
   same GGUF file, the same threads, GPU layers and flash attention as edgesdk's session, otherwise llama-server's
   defaults. They are measured in turns per point, the order reversed at every other point (A B C, C B A), so
   drift hits all alike. Ratios: each server against its own 1-client rate, and edgesdk against each llama-server
   at the same point.
2. **Mixed load** (--mixed): the TTFT of a short prompt alone (8 one after another, median), then 3 long prompts
   (--long-tokens, default 3000, capped at the context) sent together and, 50 ms later, 8 short streams: each
   short one's TTFT behind them, and the long ones' TTFT. Per server.

    python tools/bench/bench_serve_curve.py BUNDLE --threads 2 --clients 1,2,4 --seconds 20   # the CPU curve
    python tools/bench/bench_serve_curve.py BUNDLE --threads 8 --llama-server /tmp/lls/llama-server --mixed \
        --out tools/bench/results/serve_curve_h100_f16.json

Writes --out (default tools/bench/results/serve_curve.json) and prints one table row per point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_llm import git_state, llama_server_command, loadavg, pct, start_edgesdk, start_llama_server, stop

RESULTS = Path(__file__).resolve().parent / "results"


def number_prompt(i: int, k: int, n: int = 12) -> str:
    start = 100 + 37 * (1000 * i + k)
    return ", ".join(str(start + j) for j in range(n)) + ","


async def stream_one(
    http: httpx.AsyncClient, url: str, body: dict, arrivals: list[float] | None = None
) -> tuple[float | None, int, bool]:
    """(TTFT s: request sent -> first streamed chunk, completion tokens from usage, ok) of one completion.
    ``arrivals``: the perf_counter time of every chunk that carries a choice is appended as it comes (kept when
    the caller cancels the request mid-stream)."""
    t0 = time.perf_counter()
    first, tokens = None, 0
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return None, 0, False
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            choices = doc.get("choices") or []
            if choices:
                now = time.perf_counter()
                if first is None:  # the first chunk (a random-weight model's text can be empty bytes)
                    first = now - t0
                if arrivals is not None:
                    arrivals.append(now)
            if doc.get("usage"):
                tokens = int(doc["usage"].get("completion_tokens") or 0)
    return first, tokens, True


async def steady(url: str, clients: int, seconds: float, max_tokens: int, marks: Any = None) -> dict:
    """Closed-loop clients for exactly ``seconds``: the completion tokens streamed inside the window. Each
    request's chunks are timed as they arrive; a request that finishes converts its chunks to tokens by its
    ``usage`` (tokens / chunks, 1 when every chunk is one token), one still streaming at the window's end is cut
    there (cancelled: the server frees its slot) and counted by the mean tokens per chunk of the finished ones.
    So requests longer than the window count for what they streamed inside it, at any client count.
    ``marks``: an :class:`Energy` read at the window's opening and closing (joules and tokens per joule)."""
    done: list[tuple[list[float], int]] = []  # (chunk times, usage tokens) of finished requests
    cut: list[list[float]] = []  # chunk times of requests cut at the window's end
    out = {"requests": 0, "errors": 0, "ttft": []}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:

        async def client(i: int) -> None:
            k = 0
            while True:
                body = {
                    "model": "m",
                    "prompt": number_prompt(i, k),
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                k += 1
                arrivals: list[float] = []
                try:
                    ttft, tokens, ok = await stream_one(http, url, body, arrivals)
                except asyncio.CancelledError:
                    cut.append(arrivals)
                    raise
                except httpx.HTTPError:
                    ttft, tokens, ok = None, 0, False
                out["requests" if ok else "errors"] += 1
                if ok:
                    done.append((arrivals, tokens))
                if ttft is not None:
                    out["ttft"].append(ttft)

        # warm-up: every client's first request, not counted
        await asyncio.gather(
            *(
                stream_one(
                    http,
                    url,
                    {"model": "m", "prompt": number_prompt(i, 999), "max_tokens": 8, "temperature": 0, "stream": True},
                )
                for i in range(clients)
            )
        )
        opening = marks.read() if marks is not None else None
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        await asyncio.sleep(seconds)
        end = time.perf_counter()
        closing = marks.read() if marks is not None else None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    chunks = sum(len(a) for a, _ in done)
    per_chunk = sum(n for _, n in done) / chunks if chunks else 1.0
    tokens = sum(sum(1 for x in a if x <= end) * (n / len(a) if a else 0.0) for a, n in done)
    tokens += sum(sum(1 for x in a if x <= end) * per_chunk for a in cut)
    ttft = out["ttft"]
    return {
        "clients": clients,
        "tok_s": round(tokens / (end - t0), 1),
        "requests": out["requests"],
        "requests_cut_at_window_end": len(cut),
        "tokens_per_chunk": round(per_chunk, 3),
        "errors": out["errors"],
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1) if ttft else None,
        "ttft_p99_ms": round(1000 * pct(ttft, 0.99), 1) if ttft else None,
        "wall_s": round(end - t0, 2),
        **(marks.figures(opening, closing, t0, end, tokens) if marks is not None else {}),
    }


class Energy:
    """The GPUs' energy over a window, two ways (as tools/bench/energy_check.py cross-checks them): NVML's total
    energy counter (``nvmlDeviceGetTotalEnergyConsumption``, summed over GPUs) read at the window's edges, and
    ``nvidia-smi``'s power.draw sampled every 100 ms and integrated over the same window; with ``metrics_url``
    also the server's own ``hw.energy`` counter from its /metrics (edgesdk serve's device metrics). Any source
    missing here is named in ``missing``, never guessed."""

    def __init__(self) -> None:
        self.missing: dict[str, str] = {}
        self.handles: list[Any] = []
        self.smi: Any = None
        self.metrics_url: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._energy_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption
            self.nvml_mj()
        except Exception as exc:  # no nvidia-ml-py, no driver, or a GPU without the counter
            self.handles = []
            self.missing["nvml"] = f"{type(exc).__name__}: {exc}"[:200]
        if shutil.which("nvidia-smi"):
            from energy_check import SmiSampler

            self.smi = SmiSampler("power.draw", 100)
        else:
            self.missing["nvidia-smi"] = "not on PATH"

    def nvml_mj(self) -> float | None:
        return float(sum(self._energy_mj(h) for h in self.handles)) if self.handles else None

    def served_j(self) -> float | None:
        if not self.metrics_url:
            return None
        try:
            text = httpx.get(self.metrics_url, timeout=5).text
        except httpx.HTTPError:
            return None
        values = [
            float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines()
            if ln.startswith("hw_energy") and ln.split("{")[0].split(" ")[0].endswith("_total")
        ]
        return sum(values) if values else None

    def read(self) -> tuple[float | None, float | None]:
        return self.nvml_mj(), self.served_j()

    def figures(self, opening: Any, closing: Any, t0: float, t1: float, tokens: float) -> dict:
        out: dict[str, Any] = {}
        if opening[0] is not None and closing[0] is not None:
            out["joules_nvml"] = round((closing[0] - opening[0]) / 1000.0, 1)
            out["tok_per_j"] = round(tokens / out["joules_nvml"], 2) if out["joules_nvml"] > 0 else None
        if opening[1] is not None and closing[1] is not None:
            out["joules_served_metrics"] = round(closing[1] - opening[1], 1)
        if self.smi is not None:
            time.sleep(0.3)  # nvidia-smi samples past the window's end
            j, _ = self.smi.joules(t0, t1)
            if j is not None:
                out["joules_smi"] = round(j, 1)
                if out.get("joules_nvml"):
                    out["nvml_vs_smi_pct"] = round(100.0 * (out["joules_nvml"] - j) / j, 1)
        return out

    def close(self) -> None:
        if self.smi is not None:
            self.smi.stop()


async def mixed(url: str, long_prompt: str, long_tokens: int, max_tokens: int) -> dict:
    """A short prompt's TTFT alone, then behind 3 long prompts sent just before 8 short ones."""
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=32)) as http:

        def body(prompt: str, n: int) -> dict:
            return {
                "model": "m",
                "prompt": prompt,
                "max_tokens": n,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }

        alone = []
        for k in range(8):
            ttft, _, _ = await stream_one(http, url, body(number_prompt(7, k, 2), 4))
            if ttft is not None:
                alone.append(ttft)
        t0 = time.perf_counter()
        longs = [asyncio.create_task(stream_one(http, url, body(f"{i} {long_prompt}", max_tokens))) for i in range(3)]
        # (each long one starts with its own number: no prefix shared with another)
        await asyncio.sleep(0.05)
        shorts = [asyncio.create_task(stream_one(http, url, body(number_prompt(9, k, 2), 4))) for k in range(8)]
        short_res = await asyncio.gather(*shorts)
        long_res = await asyncio.gather(*longs)
        wall = time.perf_counter() - t0
    behind = [r[0] for r in short_res if r[0] is not None]
    return {
        "long_prompt_tokens": long_tokens,
        "short_alone_ttft_ms": round(1000 * statistics.median(alone), 1) if alone else None,
        "short_behind_long_ttft_ms": [round(1000 * x, 1) for x in behind],
        "short_behind_long_ttft_p50_ms": round(1000 * statistics.median(behind), 1) if behind else None,
        "short_behind_long_ttft_max_ms": round(1000 * max(behind), 1) if behind else None,
        "long_ttft_ms": [round(1000 * r[0], 1) if r[0] is not None else None for r in long_res],
        "short_errors": sum(1 for r in short_res if not r[2]),
        "long_errors": sum(1 for r in long_res if not r[2]),
        "wall_s": round(wall, 2),
    }


def session_settings(bundle: str, long_tokens: int) -> tuple[str, int, dict, str, int]:
    """The bundle's GGUF file, n_ctx and llama.cpp settings, as edgesdk.load picks them here, and a long prompt
    of at most ``long_tokens`` tokens of its tokenizer (with its token count)."""
    import edgesdk

    with edgesdk.load(bundle) as s:
        st = dict(s.backend.settings)
        gguf = str(s.backend._path)  # noqa: SLF001 - our own backend's file
        words: list[str] = []
        n = 0
        while True:
            more = words + [str(1000 + len(words) + j) for j in range(32)]
            m = len(s.backend.tokenize(" ".join(more)))
            if m > long_tokens:
                break
            words, n = more, m
    return gguf, int(st["n_ctx"]), st, " ".join(words), n


def document(
    a: argparse.Namespace, gguf: str, n_ctx: int, st: dict, rows: dict, mixed_rows: dict, energy: Any, metrics: str
) -> dict:
    """The results document so far (written after every point: a run cut short keeps what it measured)."""
    rows = {name: [dict(r) for r in rs] for name, rs in rows.items()}
    base = {n: (r[0]["tok_s"] if r and r[0]["clients"] == 1 else None) for n, r in rows.items()}
    for name, rs in rows.items():
        for r in rs:
            r["vs_1_client"] = round(r["tok_s"] / base[name], 2) if base[name] else None
            if name != "edgesdk":
                e = next((x for x in rows["edgesdk"] if x["clients"] == r["clients"]), None)
                r["edgesdk_ratio"] = round(e["tok_s"] / r["tok_s"], 2) if e and r["tok_s"] else None
    return {
        "what": "closed-loop steady load curve, edgesdk serve vs llama-server (tools/bench/bench_serve_curve.py)",
        "bundle": a.bundle,
        "gguf": gguf,
        "n_ctx": n_ctx,
        "session": {k: st.get(k) for k in ("n_gpu_layers", "flash_attn", "threads", "n_batch", "n_ubatch")},
        "seconds": a.seconds,
        "max_tokens": a.max_tokens,
        "curve": rows,
        "mixed": mixed_rows,
        "energy_missing": energy.missing if energy is not None else {"gpu": "no nvidia-smi on this host"},
        "edgesdk_slots_line": [ln for ln in metrics.splitlines() if ln.startswith("edgesdk_serve_slots")],
        "complete": bool(metrics),
        "git": git_state(),
        "loadavg": loadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write(path: str, doc: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,2,3,4,6,8,16,32")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--llama-server", help="llama-server binary (tools/device/build_llama_server.sh)")
    ap.add_argument("--llama-server-np", default="16,4")
    ap.add_argument("--serve-args", default="", help="extra edgesdk serve arguments, space separated")
    ap.add_argument("--mixed", action="store_true", help="also the mixed-load run")
    ap.add_argument("--long-tokens", type=int, default=3000)
    ap.add_argument("--out", default=str(RESULTS / "serve_curve.json"))
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    gguf, n_ctx, st, long_prompt, long_n = session_settings(a.bundle, a.long_tokens)
    if long_n + a.max_tokens + 64 > n_ctx:  # shorter, to fit a slot's context
        gguf, n_ctx, st, long_prompt, long_n = session_settings(a.bundle, n_ctx - a.max_tokens - 64)
    servers: dict[str, tuple] = {}
    tmp = Path(tempfile.mkdtemp(prefix="curve-"))
    energy = Energy() if shutil.which("nvidia-smi") else None  # a CPU host: no GPU energy to read
    try:
        servers["edgesdk"] = start_edgesdk(a.bundle, a.threads, a.serve_args.split())
        if a.llama_server:
            for np_ in (int(x) for x in a.llama_server_np.split(",")):
                cmd = llama_server_command(a.llama_server, gguf, a.threads, n_ctx, np_, st, [])
                cmd.remove("--no-kv-unified")  # as a user starts it: -np N alone (llama-server's default then)
                servers[f"llama-server -np {np_}"] = start_llama_server(cmd, tmp / f"ls{np_}.log")
        rows: dict[str, list[dict]] = {name: [] for name in servers}
        print(f"{'clients':>7} " + " ".join(f"{n:>22}" for n in servers), flush=True)
        for idx, c in enumerate(counts):
            order = list(servers) if idx % 2 == 0 else list(reversed(servers))
            for name in order:
                if energy is not None:  # edgesdk serve's own hw.energy counter beside NVML and nvidia-smi
                    energy.metrics_url = servers[name][1] + "/metrics" if name == "edgesdk" else None
                rows[name].append(asyncio.run(steady(servers[name][1], c, a.seconds, a.max_tokens, energy)))
            print(f"{c:>7} " + " ".join(f"{rows[n][-1]['tok_s']:>16.1f} tok/s" for n in servers), flush=True)
            write(a.out, document(a, gguf, n_ctx, st, rows, {}, energy, ""))
        mixed_rows = {}
        if a.mixed:
            for name, (_, url) in servers.items():
                mixed_rows[name] = asyncio.run(mixed(url, long_prompt, long_n, 16))
                print(f"mixed {name}: {json.dumps(mixed_rows[name])}", flush=True)
                write(a.out, document(a, gguf, n_ctx, st, rows, mixed_rows, energy, ""))
        metrics = httpx.get(servers["edgesdk"][1] + "/metrics", timeout=10).text
    finally:
        for proc, _ in servers.values():
            stop(proc)
        if energy is not None:
            energy.close()
    write(a.out, document(a, gguf, n_ctx, st, rows, mixed_rows, energy, metrics))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
