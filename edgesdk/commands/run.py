# SPDX-License-Identifier: Apache-2.0
"""``edgesdk run BUNDLE``: load a bundle on this machine and run it."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from edgesdk.commands._common import emit_json


def _load_npz(path: Path) -> dict:
    from edgesdk.errors import InputError

    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable .npz of named arrays ({exc})") from exc


@click.command("run")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--input", "-i", "texts", multiple=True, help="Text to embed (text encoders; repeatable).")
@click.option("--inputs", "npz", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=".npz file of named input arrays (any model).")
@click.option("--prompt", help="Prompt for an LLM bundle.")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="LLM: tokens to generate.")
@click.option("--stream", is_flag=True, help="LLM: print tokens as they are generated.")
@click.option("--profile", help="Device profile to run under (default: the one the bundle was built for).")
@click.option("--threads", type=int, help="CPU threads for the backend.")
@click.option("--report", "show_report", is_flag=True, help="Print the session report (backend, fallbacks).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write traces/metrics as OTLP-JSON lines.")
def run_cmd(bundle: Path, texts, npz, prompt, max_tokens, stream, profile, threads, show_report, as_json,
            trace_file) -> int:
    """Run BUNDLE on this machine: embed text, run tensors, or generate from a prompt."""
    import edgesdk
    from edgesdk import telemetry
    from edgesdk.errors import InputError

    if trace_file:
        telemetry.configure(trace_file=trace_file)
    options = {"threads": threads} if threads else {}
    session = edgesdk.load(bundle, profile=profile, **options)
    result: dict = {}
    if prompt is not None:
        if stream and not as_json:
            pieces = []
            for piece in session.stream(prompt, max_tokens=max_tokens):
                click.echo(piece, nl=False)
                pieces.append(piece)
            click.echo()
            result["text"] = "".join(pieces)
        else:
            out = session.generate(prompt, max_tokens=max_tokens)
            result["text"] = out  # LLMBackend.generate returns the completion text
            if not as_json:
                click.echo(result["text"])
    elif texts:
        emb = session.embed(list(texts))
        result["embeddings"] = {"shape": list(emb.shape), "norms": np.linalg.norm(emb, axis=1).round(4).tolist()}
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
        result["outputs"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outs.items()}
        if not as_json:
            for k, v in outs.items():
                click.echo(f"{k}: shape {list(v.shape)} {v.dtype}  first values {np.ravel(v)[:4].round(4).tolist()}")
    else:
        raise InputError("nothing to run: pass --input TEXT, --inputs FILE.npz or --prompt TEXT")
    rep = session.report()
    if as_json:
        emit_json({**result, "report": rep})
    elif show_report or rep["fallbacks"]:
        click.echo(f"ran on {rep['backend']} ({rep['device']}), load {rep['load_s']} s")
        for f in rep["fallbacks"]:
            click.echo(f"  fallback: {f['from']} -> {f['to']}: {f['reason']}")
    session.close()
    return 0


def register(group: click.Group) -> None:
    group.add_command(run_cmd)
