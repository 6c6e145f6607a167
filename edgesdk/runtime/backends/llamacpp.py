# SPDX-License-Identifier: Apache-2.0
"""llama.cpp backend for GGUF bundles: generate / stream / chat with GenAI telemetry, and eager fallbacks.

Load order (each step down is recorded with ``ctx.record_fallback``):
  planned settings (flash attention per the profile's kernel table, all layers on the GPU, sized to
  the free device memory) -> flash attention off -> half the layers -> CPU only.
Each attempt is a load plus a first decode. Where the profile marks the platform risky (sm_87:
llama.cpp issue #24457, flash attention crashing on Orin), the attempt first runs in a child
process, so a segfault there costs one fallback record instead of the host process.
"""

from __future__ import annotations

import codecs
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from time import perf_counter

from edgesdk import telemetry
from edgesdk.errors import BackendUnavailableError, InputError, ShapeError
from edgesdk.runtime.backend import TensorSpec

RISKY_SMS = {"8.7"}  # llama.cpp FA/offload crashes reported on Orin (docs/devices.md)
GPU_RESERVE_BYTES = 512 * 1024 * 1024  # CUDA context + cuBLAS workspace, kept free when sizing offload
DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}

_PROBE_CHILD = """
import sys, llama_cpp
path, ngl, fa, n_ctx = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_gpu_layers=ngl, flash_attn=fa, n_ctx=n_ctx, verbose=False)
llm.eval(llm.tokenize(b"Hello", add_bos=True))
"""


def _free_device_bytes() -> tuple[int | None, str]:
    """Free memory llama.cpp can offload into: NVML on discrete GPUs, MemAvailable on Jetson (unified)."""
    from edgesdk import host

    if host.probe().is_jetson:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            with open("/proc/meminfo") as fh:
                kb = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
            return kb * 1024, "MemAvailable (Jetson unified memory)"
    free = host.gpu_free_bytes(0)
    if free is not None:
        return free, "NVML free memory of GPU 0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        return int(out.stdout.strip().splitlines()[0]) * 1024 * 1024, "nvidia-smi memory.free of GPU 0"
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None, "free device memory unknown (no NVML, nvidia-smi or Jetson meminfo)"


def _layers_that_fit(llm_info: dict, n_ctx: int, free: int) -> int:
    """Transformer layers whose weights + KV fit in ``free`` bytes (output layer counted as one)."""
    layers = int(llm_info["layers"])
    kv_per_layer = 2 * int(llm_info["kv_heads"]) * int(llm_info["head_dim"]) * n_ctx * 2
    per_layer = int(llm_info["file_bytes"]) / (layers + 1) + kv_per_layer
    return max(0, min(layers + 1, int((free - GPU_RESERVE_BYTES) // per_layer)))


class LlamaCppBackend:
    """One loaded GGUF model. ``generate``/``stream``/``chat`` go through ``telemetry.inference``."""

    name = "llama.cpp"
    provider = "llama.cpp"

    def __init__(self, llm, *, settings: dict, report: dict, model: str, attributes: dict):
        self._llm = llm
        self.settings = settings
        self._report = report
        self._model = model
        self._attrs = attributes
        self._eos = llm.token_eos()
        self._formatter = None
        self.device = "cpu" if settings["n_gpu_layers"] == 0 else f"cuda:0 ({report['placement']})"
        # run(): token ids of any rank (flattened) -> the last position's logits.
        self.inputs = (TensorSpec("input_ids", "int64", None),)
        self.outputs = (TensorSpec("logits", "float32", (1, int(llm.n_vocab()))),)
        import llama_cpp

        vocab = llm._model.vocab
        self._is_eog = lambda tok: llama_cpp.llama_vocab_is_eog(vocab, tok)
        # llama.cpp's own per-context timers (what llama-bench reports): prompt evaluation and
        # token-by-token evaluation, without Python, sampling or detokenising in between.
        perf, reset = getattr(llama_cpp, "llama_perf_context", None), getattr(llama_cpp, "llama_perf_context_reset", None)
        self._perf = (perf, reset) if perf and reset else None
        self.last: dict = {}

    def _perf_reset(self) -> None:
        if self._perf is not None:
            with contextlib.suppress(Exception):
                self._perf[1](self._llm.ctx)

    def _perf_read(self) -> dict:
        """Prompt-eval and eval time/tokens of the last request, from llama.cpp (empty when unavailable)."""
        if self._perf is None:
            return {}
        try:
            data = self._perf[0](self._llm.ctx)
        except Exception:  # noqa: BLE001 - timing is a bonus, never a failure
            return {}
        out = {}
        if data.n_p_eval > 0 and data.t_p_eval_ms > 0:
            out["prompt_eval_tokens"], out["prompt_eval_ms"] = int(data.n_p_eval), round(float(data.t_p_eval_ms), 3)
        if data.n_eval > 0 and data.t_eval_ms > 0:
            out["eval_tokens"], out["eval_ms"] = int(data.n_eval), round(float(data.t_eval_ms), 3)
        return out

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)

    def run(self, feeds: dict) -> dict:
        """Raw forward pass: ``{"input_ids": [...]}`` -> ``{"logits": last-position logits}``."""
        import numpy as np

        ids = feeds.get("input_ids")
        if ids is None:
            raise ShapeError("llama.cpp run() takes {'input_ids': token ids}")
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        self._check_fits(len(ids), 0)
        self._llm.reset()
        self._llm.eval(ids)
        return {"logits": np.asarray(self._llm.scores[len(ids) - 1], dtype=np.float32)[None, :]}

    def _check_fits(self, n_prompt: int, max_tokens: int) -> int:
        n_ctx = self._llm.n_ctx()
        if n_prompt >= n_ctx:
            raise ShapeError(f"prompt is {n_prompt} tokens; the context holds {n_ctx} "
                             "(shorten the prompt or rebuild with a longer --context-length)")
        return min(max_tokens, n_ctx - n_prompt)

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: str, **kw):
        """Completion text for ``prompt`` (``stream=True`` returns an iterator of text pieces)."""
        if kw.pop("stream", False):
            return self.stream(prompt, **kw)
        return "".join(self._run(prompt, "text_completion", stream=False, special=False, **kw))

    def stream(self, prompt: str, **kw) -> Iterator[str]:
        return self._run(prompt, "text_completion", stream=True, special=False, **kw)

    def chat(self, messages: list[dict], **kw):
        """Reply to ``messages`` formatted with the model's own chat template (GGUF tokenizer.chat_template)."""
        fmt = self._chat_formatter()
        try:
            result = fmt(messages=messages)
        except Exception as exc:  # noqa: BLE001 - jinja errors on malformed messages: one line
            raise InputError(f"chat template failed on these messages ({type(exc).__name__}: {exc})") from exc
        stop = list(kw.pop("stop", None) or [])
        stop += [s for s in ([result.stop] if isinstance(result.stop, str) else (result.stop or [])) if s]
        stream = kw.pop("stream", False)
        gen = self._run(result.prompt, "chat", stream=stream, special=True, stop=stop,
                        add_bos=not getattr(result, "added_special", False), _capture_messages=messages, **kw)
        return gen if stream else "".join(gen)

    def _chat_formatter(self):
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            template = self._llm.metadata.get("tokenizer.chat_template")
            if not template:
                raise InputError(f"{self._model} has no chat template in its GGUF (tokenizer.chat_template): "
                                 "use generate() with your own prompt format")
            piece = self._llm._model.token_get_text
            self._formatter = Jinja2ChatFormatter(template=template, eos_token=piece(self._eos),
                                                  bos_token=piece(self._llm.token_bos()),
                                                  stop_token_ids=[self._eos])
        return self._formatter

    def _run(self, prompt: str, operation: str, *, stream: bool, special: bool, max_tokens: int = 128,
             stop: list[str] | str | None = None, seed: int | None = None, add_bos: bool = True,
             _capture_messages: list | None = None, **sampling):
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, got {type(prompt).__name__}")
        unknown = set(sampling) - set(DEFAULT_SAMPLING)
        if unknown:
            raise InputError(f"unknown generation option(s): {', '.join(sorted(unknown))} "
                             f"(known: max_tokens, stop, seed, stream, {', '.join(DEFAULT_SAMPLING)})")
        params = {**DEFAULT_SAMPLING, **sampling}
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        tokens = self._llm.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=special)
        budget = self._check_fits(len(tokens), int(max_tokens))
        if seed is not None:
            self._llm.set_seed(int(seed))
        request = {"max_tokens": int(max_tokens), "temperature": params["temperature"], "top_p": params["top_p"],
                   "top_k": params["top_k"], "stop_sequences": stops or None, "seed": seed}
        return self._decode(prompt, tokens, budget, stops, params, operation, stream, request, _capture_messages)

    def _decode(self, prompt, tokens, budget, stops, params, operation, stream, request, messages=None):
        llm = self._llm
        hold = max((len(s) for s in stops), default=1) - 1  # chars kept back while they may start a stop
        with telemetry.inference(operation, self._model, self.provider, stream=stream, request=request,
                                 attributes=self._attrs) as rec:
            rec.set_input_tokens(len(tokens))
            rec.capture_input(prompt if messages is None else messages)  # chat: the roles, not the template
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text, emitted, n_out, finish, cut_at_stop = "", 0, 0, "length", False
            chunk, is_eog, detok = rec.chunk, self._is_eog, llm.detokenize
            self._perf_reset()
            t0 = perf_counter()
            t_first = None
            try:
                if budget > 0:
                    for tok in llm.generate(tokens, top_k=params["top_k"], top_p=params["top_p"],
                                            min_p=params["min_p"], temp=params["temperature"],
                                            repeat_penalty=params["repeat_penalty"]):
                        chunk()
                        if t_first is None:
                            t_first = perf_counter()
                            rec.first_chunk()
                        if is_eog(tok):
                            finish = "stop"
                            break
                        n_out += 1
                        text += decoder.decode(detok([tok]))
                        if stops:
                            cut = min((i for i in (text.find(s, max(0, emitted - len(s))) for s in stops)
                                       if i >= 0), default=-1)
                            if cut >= 0:
                                text, finish, cut_at_stop = text[:cut], "stop", True
                                break
                        if n_out >= budget:
                            break
                        if stream and len(text) - hold > emitted:
                            yield text[emitted:len(text) - hold]
                            emitted = len(text) - hold
                if not cut_at_stop:
                    text += decoder.decode(b"", final=True)
                if len(text) > emitted:
                    yield text[emitted:]
            except GeneratorExit:
                finish = "cancelled"
                raise
            finally:
                t_end = perf_counter()
                rec.set_output_tokens(n_out)
                rec.finish([finish])
                rec.capture_output(text)
                self.last = {"input_tokens": len(tokens), "output_tokens": n_out, "finish_reason": finish,
                             "ttft_s": round(t_first - t0, 6) if t_first else None,
                             "decode_tok_s": round((n_out - 1) / (t_end - t_first), 2)
                             if t_first and n_out > 1 and t_end > t_first else None,
                             # perf_counter() instants, for callers timing tokens (not text chunks:
                             # a token may yield no text, so chunk times can lag token times).
                             "first_token_at": t_first, "last_token_at": t_end if t_first else None,
                             "llama_cpp_timings": self._perf_read()}

    # ------------------------------------------------------------------ report / close
    def report(self) -> dict:
        return {**self._report, "last_request": dict(self.last)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._llm.close()


# ---------------------------------------------------------------------------------------------
# Loader with eager fallbacks


def _probe_in_child(path: str, ngl: int, fa: bool, n_ctx: int) -> str | None:
    """Load + first decode in a child process; None when it worked, else why (signal or last error line)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE_CHILD, path, str(ngl), "1" if fa else "0",
                               str(min(n_ctx, 512))], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "probe timed out after 600 s"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        import signal

        with contextlib.suppress(ValueError):
            return f"crashed in a child probe ({signal.Signals(-proc.returncode).name})"
        return f"crashed in a child probe (signal {-proc.returncode})"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return f"failed in a child probe: {lines[-1][:160] if lines else 'exit ' + str(proc.returncode)}"


def _attempts(fa: bool, ngl: int) -> list[tuple[bool, int]]:
    out = [(fa, ngl)]
    if fa:
        out.append((False, ngl))
    if ngl > 1:
        out.append((False, max(1, ngl // 2)))
    if ngl != 0:
        out.append((False, 0))
    return out


def _label(fa: bool, ngl: int, layers: int) -> str:
    where = "CPU" if ngl == 0 else f"{min(ngl, layers + 1)}/{layers + 1} layers on GPU"
    return f"llama.cpp ({where}, flash attention {'on' if fa else 'off'})"


def load_gguf(bundle, ctx) -> LlamaCppBackend:
    """Loader registered for format ``gguf`` (see edgesdk.runtime.backends)."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailableError("llama-cpp-python is not installed (pip install 'edgesdk[gguf]'; build it "
                                      "with CMAKE_ARGS=-DGGML_CUDA=on on GPU hosts)") from exc
    info = dict((bundle.manifest.get("extras") or {}).get("llm") or {})
    opts = dict(ctx.options or {})
    path = str(bundle.artifact_path("model"))
    layers = int(info.get("layers") or 0)
    n_ctx = int(opts.get("n_ctx") or info.get("n_ctx") or 2048)
    profile = ctx.profile
    planned = opts.get("n_gpu_layers", info.get("n_gpu_layers", 0))
    ngl = layers + 1 if planned in ("all", -1) else int(planned)
    if profile is not None and "flash_attn" not in opts:
        fa_entry = profile.kernels.get("flash_attention") or {}
        fa = bool(profile.is_gpu and fa_entry.get("supported"))
    else:
        fa = bool(opts.get("flash_attn", info.get("flash_attn", False)))
    threads = opts.get("threads") or (info.get("threads") if isinstance(info.get("threads"), int) else None)
    notes: list[str] = []
    if ngl and not llama_cpp.llama_supports_gpu_offload():
        ctx.record_fallback(_label(fa, ngl, layers), _label(False, 0, layers),
                            "this llama-cpp-python build has no GPU offload (llama_supports_gpu_offload() is "
                            "false: CPU-only build or no GPU)")
        ngl, fa = 0, False
    elif ngl:
        free, how = _free_device_bytes()
        if free is not None and layers:
            fit = _layers_that_fit({**info, "layers": layers}, n_ctx, free)
            notes.append(f"{how}: {free / 1e9:.2f} GB -> {fit}/{layers + 1} layers fit")
            if fit < ngl:
                ctx.record_fallback(_label(fa, ngl, layers), _label(fa, fit, layers),
                                    f"free device memory {free / 1e9:.2f} GB ({how}) holds {fit} of {layers + 1} "
                                    "layers with their KV cache")
                ngl = fit
        else:
            notes.append(how)
    risky = bool(opts.get("probe_in_child")) or bool(profile is not None and profile.sm in RISKY_SMS)
    errors = []
    tried = _attempts(fa, ngl)
    for i, (a_fa, a_ngl) in enumerate(tried):
        why = _probe_in_child(path, a_ngl, a_fa, n_ctx) if risky else None
        llm = None
        if why is None:
            try:
                llm = llama_cpp.Llama(model_path=path, n_gpu_layers=a_ngl, flash_attn=a_fa, n_ctx=n_ctx,
                                      n_threads=threads, n_threads_batch=threads, verbose=False)
                llm.eval(llm.tokenize(b"Hello", add_bos=True))  # the first decode is where bad kernels fail
                llm.reset()
            except Exception as exc:  # noqa: BLE001 - llama.cpp raises ValueError/RuntimeError/OSError
                why = f"{type(exc).__name__}: {str(exc)[:160]}"
                if llm is not None:
                    with contextlib.suppress(Exception):
                        llm.close()
                llm = None
        if llm is not None:
            report = {"runtime": f"llama-cpp-python {llama_cpp.__version__}", "n_gpu_layers": a_ngl,
                      "layers": layers, "flash_attn": a_fa, "n_ctx": n_ctx, "threads": llm.n_threads,
                      "gpu_offload_supported": bool(llama_cpp.llama_supports_gpu_offload()),
                      "placement": "CPU" if a_ngl == 0 else f"{min(a_ngl, layers + 1)}/{layers + 1} layers on GPU",
                      "probe": "child process first (risky platform)" if risky else "in-process",
                      "attempts": errors + [f"{_label(a_fa, a_ngl, layers)}: ok"], "notes": notes}
            settings = {"n_gpu_layers": a_ngl, "flash_attn": a_fa, "n_ctx": n_ctx, "threads": llm.n_threads}
            attrs = {"edgesdk.backend": "llama.cpp", "edgesdk.gguf.quant_type": info.get("quant_type", ""),
                     "edgesdk.device.profile": profile.name if profile is not None else "",
                     "edgesdk.precision": bundle.precision or info.get("quant_type", ""),
                     "edgesdk.gguf.n_gpu_layers": a_ngl, "edgesdk.gguf.flash_attn": a_fa,
                     "edgesdk.bundle.id": bundle.bundle_id}
            return LlamaCppBackend(llm, settings=settings, report=report, model=bundle.model_name, attributes=attrs)
        errors.append(f"{_label(a_fa, a_ngl, layers)}: {why}")
        if i + 1 < len(tried):
            ctx.record_fallback(_label(a_fa, a_ngl, layers), _label(*tried[i + 1], layers), why)
    raise BackendUnavailableError(f"llama.cpp could not load {path}: " + "; ".join(errors))
