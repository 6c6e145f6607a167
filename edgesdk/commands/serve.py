# SPDX-License-Identifier: Apache-2.0
"""``edgesdk serve BUNDLE...``: an OpenAI-compatible server over bundles (docs/serve.md)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from edgesdk.commands._common import at_least_option
from edgesdk.commands.run import llm_load_options


@click.command("serve")
@click.argument("bundles", nargs=-1, required=True)
@click.option(
    "--name",
    "names",
    multiple=True,
    help="Model name for the bundle in the same position (default: the bundle directory name).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless given).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option(
    "--api-key",
    envvar="EDGESDK_API_KEY",
    help="Require 'Authorization: Bearer KEY' (or set EDGESDK_API_KEY). An empty key is refused.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests whose Host header names NAME (repeatable; default: localhost and IP "
    "addresses only, others get 421; '*' answers any name).",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Answer CORS requests from ORIGIN, e.g. https://app.example.com (repeatable; '*' for any). "
    "Default: none, so web pages of other origins cannot read answers.",
)
@at_least_option("--max-queue", 0, 16, "LLM requests allowed to wait behind the running one; more get 429.")
@at_least_option("--max-batch", 1, 32, "Embeddings: most inputs in one dynamic batch.")
@at_least_option("--max-wait-ms", 0, 5.0, "Embeddings: longest wait for a batch to fill.")
@at_least_option("--max-body-bytes", 1, 1 << 20, "Largest request body; larger gets 413.")
@at_least_option("--shutdown-timeout", 0, 30.0, "Seconds in-flight requests get to finish after SIGTERM.")
@click.option(
    "--request-timeout",
    type=click.FloatRange(0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Wall-clock limit of one generation request, queueing included: past it the request ends with "
    "504 (or an error event mid-stream) and its slot is freed.",
)
@click.option(
    "--prompt-cache-mb",
    type=click.FloatRange(0),
    default=None,
    help="Per LLM: keep the KV state of recent prompts (up to this many MiB) and reuse the longest "
    "shared token prefix. Default: the profile's policy.llm.prompt_cache_mb, else off (0).",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 256),
    default=None,
    help="Per LLM: requests decoded together in one llama.cpp context (continuous batching). Default: "
    "the bundle's planned slots (plan decision serving.slots, sized for its profile); for a bundle without "
    "one 16 on a GPU, 4 on the CPU; fewer if their KV cache does not fit (the start-up line says why); "
    "1: one request at a time (outputs bit-identical to edgesdk run; --prompt-cache-mb applies).",
)
@click.option(
    "--no-prefix-reuse",
    is_flag=True,
    help="Batched LLMs: do not let a slot reuse the KV cells of its previous request's shared prefix.",
)
@click.option(
    "--chat-template",
    metavar="NAME|FILE",
    help="GGUF bundles: format chats with this template (a shipped name: chatml, gemma, llama-2, llama-3, "
    "mistral, phi-3; or a Jinja file) instead of the one bundled at build time or the GGUF's own.",
)
@click.option(
    "--allow-local-images",
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="VLM bundles: let image_url parts name files under DIR (file:///... or an absolute path; no "
    "escaping DIR). Default: data URLs only.",
)
@click.option("--profile", help="Device profile to run under (default: the one each bundle was built for).")
@click.option("--threads", "-t", type=int, help="CPU threads per backend (llama-server's -t).")
@llm_load_options("llama-server", per_slot=True)
@click.option("--trace-file", type=click.Path(dir_okay=False), help="Write traces/metrics as OTLP-JSON lines.")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
def serve_cmd(
    bundles,
    names,
    host,
    port,
    api_key,
    allowed_hosts,
    cors_origins,
    max_queue,
    max_batch,
    max_wait_ms,
    max_body_bytes,
    shutdown_timeout,
    request_timeout,
    prompt_cache_mb,
    parallel,
    no_prefix_reuse,
    profile,
    threads,
    ctx_size,
    gpu_layers,
    speculative,
    trace_file,
    log_level,
    chat_template=None,
    allow_local_images=None,
) -> int:
    """Serve BUNDLES over the OpenAI API: chat/completions for GGUF bundles, embeddings for text encoders."""
    from edgesdk import telemetry
    from edgesdk.errors import InputError
    from edgesdk.extras import require

    serve_modules = ("starlette", "uvicorn", "pydantic", "prometheus_client", "opentelemetry.exporter.prometheus")
    require("serve", serve_modules, "edgesdk serve")
    from edgesdk.serve import ServeConfig, run

    # click ignores an empty EDGESDK_API_KEY; an empty key, given either way, would turn auth off: refused.
    if api_key is None:
        api_key = os.environ.get("EDGESDK_API_KEY")
        where = "EDGESDK_API_KEY is set but"
    else:
        where = "--api-key is"
    if api_key is not None and (not api_key.strip() or api_key != api_key.strip()):
        raise InputError(
            f"{where} empty or has surrounding whitespace: that would turn authentication off "
            "(give a key, or leave --api-key and EDGESDK_API_KEY out to serve without one)"
        )
    # Checked before any bundle is loaded: a bad option fails at once.
    config = ServeConfig(
        host=host,
        port=port,
        api_key=api_key,
        allowed_hosts=tuple(allowed_hosts),
        cors_origins=tuple(cors_origins),
        max_body_bytes=max_body_bytes,
        max_queue=max_queue,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        prompt_cache_mb=prompt_cache_mb,
        parallel=parallel,
        prefix_reuse=not no_prefix_reuse,
        request_timeout_s=request_timeout,
    )
    if trace_file:
        telemetry.configure(trace_file=trace_file, service_name="edgesdk-serve")
    from edgesdk.serve import bind_sockets

    sockets = bind_sockets(host, port)  # a taken port fails now, before minutes of model loading
    from edgesdk.serve.loading import answering_while_loading

    with answering_while_loading(sockets, config):  # /health: 503 {"status": "loading"} until the models are in
        llm_options = {
            k: v
            for k, v in (("n_ctx", ctx_size or None), ("n_gpu_layers", gpu_layers), ("speculative", speculative))
            if v
        }
        entries = _load(bundles, names, profile, threads, chat_template, allow_local_images, config, llm_options)
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        click.echo(f"warning: listening on {host} without --api-key: anyone who can reach it can use it", err=True)
    run(entries, config, shutdown_timeout_s=shutdown_timeout, log_level=log_level, sockets=sockets)
    for e in entries:
        e.session.close()
    return 0


def _load(bundles, names, profile, threads, chat_template, allow_local_images, config, llm_options=None) -> list:
    """Pull (``oci://``) and load the bundles, printing a line per model."""
    from edgesdk.errors import InputError
    from edgesdk.serve import load_models

    paths: list[str | Path] = []
    full_names: list[str] = []
    for i, b in enumerate(bundles):  # an OCI reference is pulled (verified) into the store first, as `edgesdk pull`
        if b.startswith("oci://"):
            from edgesdk.distribution.oci import Reference
            from edgesdk.distribution.store import pull

            got = pull(b, profile or "auto", progress=None)
            click.echo(f"{b}: profile {got.profile} ({got.choice}); {got.how}: {got.path}", err=True)
            paths.append(got.path)
            full_names.append(names[i] if i < len(names) else Reference.parse(b).repository.rsplit("/", 1)[-1])
        else:
            paths.append(Path(b))
            full_names.append(names[i] if i < len(names) else Path(b).resolve().name)
    if len(names) > len(bundles):
        raise InputError(f"{len(names)} --name values for {len(bundles)} bundles")
    entries = load_models(
        paths,
        full_names,
        profile=profile,
        threads=threads,
        chat_template=chat_template,
        allow_local_images=allow_local_images,
        llm_options=llm_options,
    )
    for e in entries:
        what = "chat/completions, completions" if e.kind == "llm" else "embeddings"
        if e.images is not None:
            what = (
                "chat/completions with image_url parts (data URLs"
                + (f", files under {e.images.allow_local}" if e.images.allow_local else "")
                + "), completions"
            )
        if e.kind == "llm":
            from edgesdk.runtime.backend import BatchingBackend
            from edgesdk.serve.app import llm_parallel
            from edgesdk.serve.app import prompt_cache_mb as _cache_mb

            e.parallel, e.parallel_reason = llm_parallel(e.session, config.parallel)
            backend = e.session.backend
            if e.parallel > 1:
                what += f"; continuous batching, slots: {e.parallel_reason}; prompt budget: " + (
                    backend.prefill_budget()[1] + "; prefix reuse " + ("on" if config.prefix_reuse else "off")
                )
            elif isinstance(backend, BatchingBackend):
                reuse = config.prefix_reuse and _cache_mb(e.session, config.prompt_cache_mb) > 0
                what += f"; slots: {e.parallel_reason}; prefix reuse " + ("on" if reuse else "off")
            else:
                what += f"; slots: {e.parallel_reason}"
            if isinstance(backend, BatchingBackend):
                what += "; speculative decoding: " + backend.speculative_plan()[2]
        click.echo(f"model {e.name}: {e.provider} ({what})", err=True)
    return entries


def register(group: click.Group) -> None:
    group.add_command(serve_cmd)
