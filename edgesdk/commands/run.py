# SPDX-License-Identifier: Apache-2.0
"""``edgesdk run BUNDLE``: load a bundle on this machine and run it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from edgesdk.commands._common import emit_json, info, is_verbose, set_verbosity

if TYPE_CHECKING:
    from edgesdk.runtime.backend import RequestStats

OUTPUT_SUFFIXES = (".npy", ".npz", ".json", ".txt")
DEFAULT_MAX_TOKENS = 64  # one-shot generation; the interactive chat runs to end-of-generation (bounded by context)
UNTIL_END = 2**31 - 1  # "no limit": the backend caps max_tokens at what the context has left

#: the escapes llama-cli's --reverse-prompt/--prompt process (common.cpp string_process_escapes, minus \xNN)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r``, ``\\\\``, ``\\'`` and ``\\"`` typed in a shell argument -> the character, as llama-cli
    does for its arguments (bash passes ``--stop "\\n\\n"`` as backslash-n twice). Any other backslash stays."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str | None:
    """``--prompt -`` reads stdin, ``-f FILE`` reads a file (UTF-8); both at once is a usage mistake."""
    import sys

    from edgesdk.errors import InputError

    if prompt is not None and prompt_file is not None:
        raise InputError("pass the prompt once: --prompt TEXT, --prompt - (stdin) or -f/--file FILE")
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"-f {prompt_file}: cannot read the prompt file ({type(exc).__name__}: {str(exc)[:100]})"
            ) from exc
    if prompt == "-":
        text = sys.stdin.read()
        if not text.strip():
            raise InputError("--prompt -: stdin was empty (pipe the prompt in: echo 'Hi' | edgesdk run B --prompt -)")
        return text
    return prompt


def _load_npz(path: Path) -> dict:
    import zipfile

    from edgesdk.errors import InputError

    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a .npz is a zip archive
        raise InputError(f"{path}: not a readable .npz of named arrays ({exc})") from exc


def _check_output_path(path: Path, force: bool) -> None:
    """Before loading anything: a known suffix, and no silent overwrite (exit 4 without --force)."""
    from edgesdk.errors import InputError, OutputExistsError

    if path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise InputError(
            f"--output {path}: unknown file type {path.suffix or '(none)'}",
            hint=".npy (one output), .npz (all outputs), .json (all outputs), .txt (LLM text)",
        )
    if path.is_dir():
        raise InputError(f"--output {path} is a directory; name a file")
    if path.exists() and not force:
        raise OutputExistsError(f"output file exists: {path}", hint="pass --force to overwrite it")


def _arrays_json(arrays: dict) -> dict:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype), "values": v.tolist()} for k, v in arrays.items()}


def write_outputs(path: Path, arrays: dict, extra: dict | None = None) -> None:
    """Write run outputs: ``.npy`` one array, ``.npz`` every array by name, ``.json`` arrays as nested lists
    (+ ``extra``: LLM text/usage, input texts), ``.txt`` LLM text. Atomic (temp file + rename)."""
    import json
    import os
    import tempfile

    from edgesdk.errors import InputError

    suffix = path.suffix.lower()
    if suffix == ".npy" and len(arrays) != 1:
        raise InputError(
            f"--output {path}: .npy holds one array and this run has "
            f"{len(arrays) or 'no'} output arrays ({', '.join(arrays) or 'text only'})",
            hint="use .npz or .json",
        )
    if suffix == ".npz" and not arrays:
        raise InputError(f"--output {path}: this run produced text, not arrays", hint="use .json or .txt")
    if suffix == ".txt" and (arrays or not extra or "text" not in extra):
        raise InputError(
            f"--output {path}: .txt holds LLM text; this run produced arrays", hint="use .npy, .npz or .json"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if suffix == ".npy":
                np.save(fh, next(iter(arrays.values())), allow_pickle=False)
            elif suffix == ".npz":
                np.savez(fh, **arrays)
            elif suffix == ".txt":
                fh.write(str((extra or {})["text"]).encode("utf-8"))  # checked above: extra holds text
            else:
                body = {**(extra or {}), **({"outputs": _arrays_json(arrays)} if arrays else {})}
                fh.write(json.dumps(body, indent=2, default=str).encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_SAMPLING_FLAGS = ("temperature", "seed", "top_k", "top_p", "min_p", "repeat_penalty")


def _usage(stats: RequestStats | None) -> dict:
    """Usage numbers of the last LLM request, named as llama.cpp users know them."""
    if stats is None:
        return dict.fromkeys(
            ("prompt_tokens", "completion_tokens", "ttft_ms", "tokens_per_s", "finish_reason", "speculative")
            + ("drafted_tokens", "accepted_tokens", "draft_k_start", "draft_k")
        )
    return {
        **stats.usage(),
        # speculative decoding: what the request got, tokens drafted and accepted, and the most tokens a step
        # drafted at its first drafted step and at its end (adaptive k: moved by the measured acceptance)
        "speculative": stats.speculative,
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "draft_k_start": stats.draft_k_start,
        "draft_k": stats.draft_k,
    }


class _Metered:
    """Energy (NVML, INA3221 rails or RAPL: edgesdk.profiler.energy) and device state around one ``--report`` /
    ``--json`` run; nothing when neither is asked for."""

    def __init__(self, enabled: bool) -> None:
        self.meter: Any = None
        if enabled:
            from edgesdk.profiler import device_state
            from edgesdk.profiler.energy import EnergyMeter

            self.before = device_state.snapshot()
            self.meter = EnergyMeter()
            self.meter.start()

    def done(self, result: dict, *, tokens: int | None = None, items: int | None = None) -> None:
        if self.meter is None:
            return
        from edgesdk.profiler import device_state

        self.meter.stop()
        result["energy"] = self.meter.result(tokens=tokens, items=items)
        result["device_state"] = device_state.during(self.before, device_state.snapshot())


def _energy_line(e: dict) -> str:
    if e.get("joules") is None:
        return f"energy: not measured ({e.get('reason')})"
    per = (
        f", {e['tokens_per_joule']:.2f} tokens/J"
        if e.get("tokens_per_joule")
        else f", {e['items_per_joule']:.2f} items/J"
        if e.get("items_per_joule")
        else ""
    )
    return f"energy: {e['joules']:.2f} J at {e['watts']:.1f} W ({e['source']}){per}"


def _usage_line(u: dict) -> str:
    ttft = f"{u['ttft_ms']:.1f} ms" if u["ttft_ms"] is not None else "-"
    rate = f"{u['tokens_per_s']:.1f} tok/s" if u["tokens_per_s"] is not None else "- tok/s"
    drafted = u.get("drafted_tokens")
    spec = (
        f", {u['accepted_tokens']} of {drafted} drafted tokens accepted "
        f"(k {u.get('draft_k_start')} -> {u.get('draft_k')})"
        if drafted
        else ""
    )
    return (
        f"usage: prompt {u['prompt_tokens']} tokens, completion {u['completion_tokens']} tokens, "
        f"TTFT {ttft}, decode {rate}{spec}, finish {u['finish_reason']}"
    )


def _interactive_chat(session, system, gen_kw) -> list[dict]:
    """Chat loop on a terminal: one line per user turn, replies streamed; Ctrl-D or /exit ends it."""
    history = [{"role": "system", "content": system}] if system else []
    click.echo("chat: type a message, Ctrl-D or /exit to end", err=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            click.echo(err=True)
            return history
        if line.strip() in ("/exit", "/quit"):
            return history
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        pieces = []
        for piece in session.chat(history, stream=True, **gen_kw):
            click.echo(piece, nl=False)
            pieces.append(piece)
        click.echo()
        history.append({"role": "assistant", "content": "".join(pieces)})


class _GpuLayers(click.ParamType):
    """llama-cli's -ngl value: a number of layers (-1: all), 'all', or 'auto' (the bundle's plan: None)."""

    name = "gpu_layers"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return None
        if text == "all":
            return "all"
        try:
            n = int(text)
        except ValueError:
            self.fail(f"{value!r} is not a number of layers, 'all' or 'auto'", param, ctx)
        if n < -1:
            self.fail(f"{n} layers: give 0 or more, -1 or 'all'", param, ctx)
        return n


GPU_LAYERS = _GpuLayers()


def llm_load_options(tool: str, *, per_slot: bool = False) -> Callable[[Any], Any]:
    """The load options a llama.cpp user knows, with ``tool``'s meaning: ``-c/--ctx-size`` (each slot's context with
    ``per_slot``), ``-ngl/--gpu-layers`` and ``--speculative`` (edgesdk run and edgesdk serve)."""
    context = "context length of each slot in tokens" if per_slot else "context length in tokens"
    options = (
        click.option(
            "--ctx-size",
            "-c",
            "ctx_size",
            type=click.IntRange(0),
            default=None,
            help=f"LLM: {context}, as {tool}'s -c (0 or left out: the bundle's).",
        ),
        click.option(
            "--gpu-layers",
            "--n-gpu-layers",
            "-ngl",
            "gpu_layers",
            type=GPU_LAYERS,
            default=None,
            metavar="N|all|auto",
            help=f"LLM: layers to put on the GPU, as {tool}'s -ngl (a number, 'all', or 'auto': the bundle's plan).",
        ),
        click.option(
            "--speculative",
            type=click.Choice(["auto", "lookup", "off", "draft"]),
            default=None,
            help="GGUF: speculative decoding: auto (the planner's choice: prompt lookup, or the bundle's draft model "
            "where its plan says so, on a GPU while few requests generate, with a live switch-off), lookup, draft (the "
            "draft model of a bundle built with --draft), off. Default: auto on a GPU, off on the CPU.",
        ),
    )

    def apply(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


@click.command("run")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--input", "texts", multiple=True, help="Text to embed (text encoders; repeatable). (-i is --interactive now.)"
)
@click.option(
    "--interactive",
    "-i",
    "interactive",
    is_flag=True,
    help="LLM: chat interactively on the terminal, as llama-cli's -i (the same as --chat).",
)
@click.option(
    "--inputs",
    "npz",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=".npz file of named input arrays (any model).",
)
@click.option("--prompt", "-p", help="Prompt for an LLM bundle (with --chat: the user message); - reads stdin.")
@click.option(
    "--file",
    "-f",
    "prompt_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the prompt from FILE (UTF-8), as llama-cli's -f.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="VLM: an image the prompt is about (repeatable; needs --prompt).",
)
@click.option(
    "--max-tokens",
    "-n",
    type=int,
    default=None,
    help=f"LLM: tokens to generate (>= 1; default {DEFAULT_MAX_TOKENS}, and in the interactive chat until "
    "the model ends its turn, bounded by the context).",
)
@click.option("--stream", is_flag=True, help="LLM: print tokens as they are generated.")
@click.option(
    "--temperature",
    "--temp",
    "temperature",
    type=float,
    default=None,
    help="LLM sampling temperature (0 = greedy; default 0.8).",
)
@click.option("--seed", type=int, default=None, help="LLM sampling seed (same seed, same settings: same text).")
@click.option("--top-k", type=int, default=None, help="LLM top-k (0 = off; default 40).")
@click.option("--top-p", type=float, default=None, help="LLM top-p, in (0, 1] (default 0.95).")
@click.option("--min-p", type=float, default=None, help="LLM min-p, in [0, 1] (default 0.05).")
@click.option("--repeat-penalty", type=float, default=None, help="LLM repeat penalty, > 0 (default 1.0 = off).")
@click.option(
    "--stop",
    "stops",
    multiple=True,
    metavar="TEXT",
    help="LLM: stop before this text (repeatable). \\n, \\t, \\r, \\\\, \\' and \\\" are unescaped "
    'as llama-cli does: --stop "\\n\\n" stops at a blank line.',
)
@click.option(
    "--chat",
    is_flag=True,
    help="LLM: format the prompt as a chat turn (one turn with --prompt or piped "
    "stdin; an interactive loop when stdin is a terminal).",
)
@click.option("--system", default=None, help="LLM chat: system message (implies --chat).")
@click.option(
    "--chat-template",
    default=None,
    metavar="NAME|FILE",
    help="LLM chat template, over the one bundled at build time or the GGUF's own: gemma, llama-3, "
    "chatml, llama-2, mistral, phi-3, or a Jinja file.",
)
@click.option("--profile", help="Device profile to run under (default: the one the bundle was built for).")
@click.option("--threads", "-t", type=int, help="CPU threads for the backend (llama-cli's -t).")
@llm_load_options("llama-cli")
@click.option(
    "--report",
    "show_report",
    is_flag=True,
    help="Print the session report (backend, fallbacks) and, for LLMs, usage (tokens, TTFT, tok/s) on stderr.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Machine-readable output: the vectors/arrays (or, with --output, the file's name); LLMs: text and usage.",
)
@click.option(
    "--output",
    "-o",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the outputs to FILE: .npy (the one output), .npz (all outputs), .json (all outputs as "
    "lists; LLMs: text and usage), .txt (LLM text).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing --output file.")
@click.option("--verbose", "-v", is_flag=True, help="Show the backend's own log lines (llama.cpp) on stderr.")
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write traces/metrics as OTLP-JSON lines.")
def run_cmd(
    bundle: Path,
    texts,
    npz,
    prompt,
    prompt_file,
    max_tokens,
    stream,
    temperature,
    seed,
    top_k,
    top_p,
    min_p,
    repeat_penalty,
    stops,
    chat,
    system,
    chat_template,
    profile,
    threads,
    ctx_size,
    gpu_layers,
    speculative,
    show_report,
    as_json,
    output,
    force,
    verbose,
    trace_file,
    images=(),
    interactive=False,
) -> int:
    """Run BUNDLE on this machine: embed text, run tensors, or generate from a prompt / chat."""
    import edgesdk
    from edgesdk import telemetry
    from edgesdk.errors import InputError

    chat = chat or interactive or system is not None or chat_template is not None
    stops = tuple(unescape(s) for s in stops)
    prompt = read_prompt(prompt, prompt_file)
    llm = prompt is not None or chat
    given = [
        f"--{k.replace('_', '-')}"
        for k, v in zip(_SAMPLING_FLAGS, (temperature, seed, top_k, top_p, min_p, repeat_penalty))
        if v is not None
    ]
    given += ["--stop"] if stops else []
    if (texts or npz is not None) and llm:
        raise InputError(
            "--input/--inputs run encoders and tensors; --prompt/--chat/--system/--chat-template "
            "run LLMs: pass one kind"
        )
    if texts and npz is not None:
        raise InputError("pass --input TEXT or --inputs FILE.npz, not both")
    if images and prompt is None:
        raise InputError("--image needs --prompt TEXT (the question about the image)")
    if given and not llm:
        raise InputError(f"{', '.join(given)} apply to LLM generation: add --prompt TEXT or --chat")
    if not (texts or npz is not None or llm):
        raise InputError("nothing to run: pass --input TEXT, --inputs FILE.npz, --prompt TEXT or --chat")
    if stream and as_json:
        raise InputError("--stream prints tokens as text and --json prints one object at the end: pass one")
    if stream and not llm:
        raise InputError("--stream applies to LLM generation: add --prompt TEXT or --chat")
    if force and output is None:
        raise InputError("--force overwrites an --output file: pass --output FILE")
    if output is not None:
        _check_output_path(output, force)
    if verbose:
        set_verbosity(1)
    verbose = verbose or is_verbose()
    if chat_template is not None:
        from edgesdk.runtime.backends.llamacpp import resolve_chat_template

        resolve_chat_template(chat_template)  # a bad name or file: exit 3 before loading the model
    if trace_file:
        telemetry.configure(trace_file=trace_file)
    options: dict = {"threads": threads} if threads else {}
    if ctx_size:  # 0: the bundle's, as llama-cli's -c 0 takes the model's
        options["n_ctx"] = ctx_size
    if gpu_layers is not None:
        options["n_gpu_layers"] = gpu_layers
    if speculative is not None:
        options["speculative"] = speculative
    if options.keys() & {"n_ctx", "n_gpu_layers", "speculative"} and not llm:
        raise InputError(
            "-c/--ctx-size, -ngl/--gpu-layers and --speculative apply to LLM bundles: add --prompt TEXT or --chat"
        )
    if verbose:
        options["verbose"] = True
    session = edgesdk.load(bundle, profile=profile, **options)
    try:
        return _run_loaded(
            session,
            texts,
            npz,
            prompt,
            max_tokens,
            stream,
            stops,
            chat,
            system,
            chat_template,
            show_report,
            as_json,
            {
                "seed": seed,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
                "min_p": min_p,
                "repeat_penalty": repeat_penalty,
            },
            output,
            images=images,
        )
    finally:
        session.close()


def _run_loaded(
    session,
    texts,
    npz,
    prompt,
    max_tokens,
    stream,
    stops,
    chat,
    system,
    chat_template,
    show_report,
    as_json,
    sampling,
    output: Path | None = None,
    images=(),
) -> int:
    import sys

    from edgesdk.errors import InputError
    from edgesdk.runtime.backend import LLMBackend

    llm = prompt is not None or chat
    is_llm = isinstance(session.backend, LLMBackend)
    what = f"{session.bundle.format} bundle"
    if llm and not is_llm:
        raise InputError(f"--prompt/--chat need an LLM bundle; this is a {what}: use --input TEXT or --inputs FILE.npz")
    if texts and is_llm:
        raise InputError(f"--input embeds text with an encoder; this is an LLM ({what}): use --prompt TEXT or --chat")
    if images and session.bundle.format != "vlm":
        raise InputError(
            f"this bundle is not a VLM ({what} of {session.report()['model']}, text only): drop "
            "--image, or build a VLM bundle from an image-text-to-text model (docs/vlm.md)"
        )
    result: dict = {}
    gen_kw = {
        "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "stop": list(stops) or None,
        **sampling,
    }
    if llm:
        if chat:
            gen_kw["chat_template"] = chat_template
            if prompt is None and sys.stdin.isatty() and not as_json:
                result["messages"] = _interactive_chat(
                    session, system, {**gen_kw, "max_tokens": UNTIL_END if max_tokens is None else max_tokens}
                )
            else:
                user = prompt if prompt is not None else sys.stdin.read()
                if not user.strip():
                    raise InputError("--chat needs a message: --prompt TEXT, piped stdin, or a terminal")
                content = (
                    user
                    if not images
                    else [*({"type": "image", "path": str(p)} for p in images), {"type": "text", "text": user}]
                )
                messages = ([{"role": "system", "content": system}] if system else []) + [
                    {"role": "user", "content": content}
                ]
                call = lambda **kw: session.chat(messages, **kw)  # noqa: E731
        elif images:
            call = lambda **kw: session.generate(prompt, images=list(images), **kw)  # noqa: E731
        else:
            call = lambda **kw: session.generate(prompt, **kw)  # noqa: E731
        if "messages" not in result:
            meter = _Metered(show_report or as_json)
            if stream and not as_json:
                pieces = []
                for piece in call(stream=True, **gen_kw):
                    click.echo(piece, nl=False)
                    pieces.append(piece)
                click.echo()
                result["text"] = "".join(pieces)
            else:
                result["text"] = call(**gen_kw)  # LLMBackend.generate/chat return the completion text
                if not as_json:
                    click.echo(result["text"])
            result["usage"] = _usage(session.last_stats)
            meter.done(result, tokens=result["usage"]["completion_tokens"])
    elif texts:
        meter = _Metered(show_report or as_json)
        emb = session.embed(list(texts))
        meter.done(result, items=len(texts))
        arrays = {"embeddings": emb}
        result["embeddings"] = {
            "shape": list(emb.shape),
            "dtype": str(emb.dtype),
            "norms": np.linalg.norm(emb, axis=1).round(4).tolist(),
        }
        if as_json and output is None:
            result["embeddings"]["values"] = emb.tolist()
        if len(texts) > 1:
            result["cosine_similarity"] = np.round(emb @ emb.T, 4).tolist()
        if not as_json:
            click.echo(f"embeddings: {emb.shape[0]} x {emb.shape[1]} (float32, L2-normalised)")
            for t, v in zip(texts, emb):
                click.echo(f"  {t[:50]!r:52}  [{', '.join(f'{x:+.3f}' for x in v[:4])}, ...]")
            if len(texts) > 1:
                click.echo("cosine similarity:")
                for row in result["cosine_similarity"]:
                    click.echo("  " + "  ".join(f"{x:.3f}" for x in row))
    elif npz is not None:
        outs = session.run(_load_npz(npz))
        arrays = {k: np.asarray(v) for k, v in outs.items()}
        result["outputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()}
        if as_json and output is None:
            result["outputs"] = _arrays_json(arrays)
        if not as_json:
            for k, v in outs.items():
                click.echo(f"{k}: shape {list(v.shape)} {v.dtype}  first values {np.ravel(v)[:4].round(4).tolist()}")
    if output is not None:
        if llm:
            write_outputs(output, {}, {k: result[k] for k in ("text", "usage", "messages") if k in result})
        else:
            write_outputs(output, arrays, {"inputs": list(texts)} if texts else None)
        result["output_file"] = str(output)
        if not as_json:
            info(f"wrote {output}")
    rep = session.report()
    if as_json:
        emit_json({**result, "report": rep})
    elif show_report or rep["fallbacks"]:  # diagnostics: stderr (stdout is the answer), silenced by -q
        info(f"ran on {rep['backend']} ({rep['device']}), load {rep['load_s']} s")
        for f in rep["fallbacks"]:
            info(f"  fallback: {f['from']} -> {f['to']}: {f['reason']}")
        if show_report and "usage" in result:
            info(_usage_line(result["usage"]))
        if show_report and "energy" in result:
            info(_energy_line(result["energy"]))
    return 0


def register(group: click.Group) -> None:
    group.add_command(run_cmd)
