# SPDX-License-Identifier: Apache-2.0
"""``edgesdk push`` / ``pull`` / ``ls`` / ``rm``: bundles on OCI registries and the local store
(:mod:`edgesdk.distribution`); ``edgesdk sign`` / ``verify`` and the trust policy options of ``pull``
(:mod:`edgesdk.distribution.signing`)."""

from __future__ import annotations

import click

from edgesdk.commands._common import emit_json, info, table


def _trust_options(policy_help: str, *key_aliases: str):
    """``--trusted-key`` (repeatable; ``key_aliases``: its other spellings) and ``--policy FILE`` (YAML), as
    ``pull`` and ``verify`` take them (``TrustPolicy.from_options``)."""

    def decorate(f):  # type: ignore[no-untyped-def]
        f = click.option("--policy", "policy_file", type=click.Path(dir_okay=False), help=policy_help)(f)
        return click.option(
            "--trusted-key",
            *key_aliases,
            "trusted_keys",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="A trusted signer's EC public key (PEM); repeatable.",
        )(f)

    return decorate


def _policy_options(f):
    """``--require-signature``, ``--trusted-key`` (repeatable) and ``--policy FILE`` (YAML)."""
    f = _trust_options(
        "Trust policy file (YAML: require_signature, trusted_keys); default $EDGESDK_TRUST_POLICY.", "--verify-key"
    )(f)
    f = click.option("--require-signature", is_flag=True, help="Refuse a bundle that no trusted key signed (exit 7).")(
        f
    )
    return f


def _insecure_option(f):
    return click.option(
        "--insecure",
        is_flag=True,
        help="Plain HTTP to a registry that is not on loopback (loopback always is; otherwise refused, exit 3).",
    )(f)


@click.command("push")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.argument("reference")
@click.option(
    "--sign",
    "sign_key",
    type=click.Path(dir_okay=False),
    help="Sign BUNDLE with this EC private key (PEM) first; the signature is attached to the pushed manifest.",
)
@_insecure_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def push_cmd(bundles: tuple[str, ...], reference: str, sign_key: str | None, insecure: bool, as_json: bool) -> int:
    """Push BUNDLES (one or more builds of one model, one per profile) to REFERENCE
    (oci://REGISTRY/NAMESPACE/NAME:TAG) as one OCI image index with an entry per profile. A signature beside a
    bundle (BUNDLE.sig/) is attached."""
    from edgesdk.distribution.store import push

    out = push(list(bundles), reference, progress=None if as_json else info, sign_key=sign_key, insecure=insecure)
    if as_json:
        emit_json(out)
    else:
        for b in out["bundles"]:
            click.echo(
                f"pushed {b['files']} files ({b['bytes'] / 1e6:.1f} MB, {b['uploaded_bytes'] / 1e6:.1f} MB uploaded) "
                f"as {out['reference']} for profile {b['profile']}: {b['manifest_digest']}"
            )
        click.echo(f"the tag holds {', '.join(out['profiles'])}: {out['index_digest']}")
    return 0


@click.command("pull")
@click.argument("reference")
@click.option(
    "--profile",
    default="auto",
    show_default=True,
    help="Which profile's bundle to take from the tag's index ('auto': the profile this host matches).",
)
@_policy_options
@_insecure_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pull_cmd(
    reference: str,
    profile: str,
    require_signature: bool,
    trusted_keys: tuple[str, ...],
    policy_file: str | None,
    insecure: bool,
    as_json: bool,
) -> int:
    """Pull REFERENCE into the local store ($EDGESDK_HOME or ~/.cache/edgesdk), verified, and print its path."""
    from edgesdk.distribution.signing import TrustPolicy
    from edgesdk.distribution.store import pull

    policy = TrustPolicy.from_options(policy_file, require_signature, trusted_keys)
    got = pull(reference, profile, progress=None if as_json else info, trust=policy, insecure=insecure)
    if as_json:
        emit_json(got.to_dict())
    else:
        info(f"profile {got.profile} ({got.choice}); {got.how}")
        click.echo(str(got.path))
    return 0


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ls_cmd(as_json: bool) -> int:
    """List the bundles in the local store."""
    from edgesdk.distribution.store import entries

    rows = entries()
    if as_json:
        emit_json(rows)
        return 0
    if not rows:
        click.echo("the store is empty")
        return 0
    click.echo(
        table(
            [
                [r["digest"][:19], r["profile"], f"{r['bytes'] / 1e6:.1f} MB", ", ".join(r["references"]) or "-"]
                for r in rows
            ],
            ["digest", "profile", "size", "references"],
        )
    )
    return 0


@click.command("rm")
@click.argument("target")
def rm_cmd(target: str) -> int:
    """Remove stored bundles: TARGET is a reference (oci://...) or a digest (at least 12 hex characters)."""
    from edgesdk.distribution.store import remove

    for d in remove(target):
        click.echo(f"removed {d}")
    return 0


@click.command("sign")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option(
    "--key",
    "key",
    required=True,
    type=click.Path(dir_okay=False),
    help="EC private key (PEM, P-256/P-384/P-521); an encrypted one reads $EDGESDK_SIGNING_KEY_PASSWORD.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sign_cmd(bundle: str, key: str, as_json: bool) -> int:
    """Sign BUNDLE (OpenSSF model-signing, plus edgesdk's in-toto statement of its license verdict, SBOM and
    parity); the signature is written beside it, as BUNDLE.sig/."""
    from edgesdk.distribution.signing import sign

    out = sign(bundle, key)
    if as_json:
        emit_json(out)
    else:
        p = out["predicate"]
        click.echo(
            f"signed {out['bundle']} with key {out['key_id'][:16]}: {out['signature']} "
            f"(license {p['license'].get('verdict', '?')}, bundle {p['bundle_id']})"
        )
    return 0


@click.command("verify")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option(
    "--signature",
    type=click.Path(file_okay=False),
    help="The signature directory (default: BUNDLE.sig beside the bundle).",
)
@_trust_options("Trust policy file (YAML) whose trusted_keys to use; default $EDGESDK_TRUST_POLICY.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify_cmd(
    bundle: str, signature: str | None, trusted_keys: tuple[str, ...], policy_file: str | None, as_json: bool
) -> int:
    """Verify BUNDLE's files and its signature by a trusted key (exit 7 naming why), and show what it vouches for."""
    from edgesdk.distribution.signing import TrustPolicy, verify

    policy = TrustPolicy.from_options(policy_file, False, trusted_keys)
    got = verify(bundle, policy.trusted_keys, signature)
    if as_json:
        emit_json(got.to_dict())
    else:
        p = got.predicate
        lic = p.get("license") or {}
        parity = p.get("parity") or {}
        sbom = p.get("sbom") or {}
        click.echo(
            f"verified: {got.bundle} signed by {got.key} (key {got.key_id[:16]}); license {lic.get('verdict', '?')}, "
            f"SBOM {sbom.get('path', '-')} sha256:{str((sbom.get('digest') or {}).get('sha256', '-'))[:12]}, "
            f"parity {parity.get('reference') or parity.get('method') or '-'}"
        )
    return 0


@click.command("export")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--mender", "mender", is_flag=True, help="Write a Mender module-image artifact (mender-artifact).")
@click.option("--output", "-o", "output", required=True, type=click.Path(dir_okay=False), help="OUT.mender to write.")
@click.option(
    "--device-type",
    "device_types",
    multiple=True,
    help="Mender device type the artifact installs on (repeatable; required).",
)
@click.option(
    "--key",
    type=click.Path(dir_okay=False),
    help="Sign the artifact with this private key (PEM: RSA or EC P-256; encrypted: $EDGESDK_SIGNING_KEY_PASSWORD).",
)
@click.option("--artifact-name", help="Mender artifact name (default MODEL-PROFILE-BUNDLEID).")
@click.option("--force", is_flag=True, help="Replace an existing OUT.mender.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def export_cmd(
    bundle: str,
    mender: bool,
    output: str,
    device_types: tuple[str, ...],
    key: str | None,
    artifact_name: str | None,
    force: bool,
    as_json: bool,
) -> int:
    """Export BUNDLE for a fleet updater: --mender writes a Mender module-image artifact (docs/distribution.md)."""
    from edgesdk.errors import InputError

    if not mender:
        raise InputError("edgesdk export needs a target: --mender (a Mender module-image artifact)")
    from edgesdk.distribution.mender import export_mender

    out = export_mender(bundle, output, list(device_types), key=key, artifact_name=artifact_name, force=force)
    if as_json:
        emit_json(out)
    else:
        click.echo(
            f"wrote {out['artifact']} ({out['bytes'] / 1e6:.1f} MB, Mender module-image {out['type']}, "
            f"{'signed' if out['signed'] else 'unsigned'}) for {', '.join(out['device_types'])}: "
            f"{out['artifact_name']}; validated by mender-artifact"
        )
    return 0


@click.group("rollout")
def rollout_group() -> None:
    """Gates for staged roll-outs."""


@rollout_group.command("check")
@click.argument("new", type=click.Path(file_okay=False))
@click.option("--current", required=True, type=click.Path(file_okay=False), help="The bundle in use on this device.")
@click.option(
    "--inputs",
    type=click.Path(dir_okay=False),
    help="Text file: one sentence (embedding bundles) or prompt (LLM bundles) per line; default: built-in ones.",
)
@click.option("--min-cosine", type=click.FloatRange(-1, 1), default=0.99, show_default=True,
              help="Embeddings: least cosine between the two bundles' vectors of each input.")  # fmt: skip
@click.option("--min-agreement", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="LLMs: least share of prompts whose 16 greedy tokens are identical.")  # fmt: skip
@click.option("--max-ppl-ratio", type=click.FloatRange(min=1.0), default=1.05, show_default=True,
              help="LLMs: new perplexity / current (both as their manifests record).")  # fmt: skip
@click.option("--max-regression", default="10%", show_default=True,
              help="Performance: worse by more than this and the noise is a regression ('none': skip).")  # fmt: skip
@click.option("--iterations", type=click.IntRange(5, 100000), default=50, show_default=True,
              help="Profiler iterations per bundle.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rollout_check_cmd(
    new: str,
    current: str,
    inputs: str | None,
    min_cosine: float,
    min_agreement: float,
    max_ppl_ratio: float,
    max_regression: str,
    iterations: int,
    as_json: bool,
) -> int:
    """Check NEW against the bundle in use (--current): its parity, parity against the current one, and a profiler
    compare. Exit 0: no regression; exit 2: a regression (each named)."""
    from edgesdk.distribution.rollout import rollout_check
    from edgesdk.errors import InputError
    from edgesdk.profiler.compare import parse_threshold

    threshold = None if max_regression.strip().lower() == "none" else parse_threshold(max_regression)
    lines = None
    if inputs is not None:
        try:
            text = open(inputs, encoding="utf-8").read(1 << 20)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--inputs {inputs}: {getattr(exc, 'strerror', None) or exc}") from None
        lines = [x.strip() for x in text.splitlines() if x.strip()]
    out = rollout_check(new, current, inputs=lines, min_cosine=min_cosine, min_agreement=min_agreement,
                        max_ppl_ratio=max_ppl_ratio, max_regression=threshold, iterations=iterations,
                        say=None if as_json else info)  # fmt: skip
    if as_json:
        emit_json(out)
    else:
        live = out["parity_vs_current"]
        parity = (
            f"min cosine {live['min_cosine']}"
            if "min_cosine" in live
            else f"greedy identical {live.get('greedy_identical', '-')}"
        )
        perf = out["performance"]
        click.echo(
            f"rollout check {out['new']} vs {out['current']} ({out['kind']}): recorded parity "
            f"{out['recorded_parity']['checks'] - len(out['recorded_parity']['failed'])}/"
            f"{out['recorded_parity']['checks']} passed; vs current: {parity}; performance: "
            + ("not measured" if perf is None else f"{len(perf['rows'])} metrics compared")
        )
    if out["regressions"]:
        click.echo("error: rollout check: regression: " + "; ".join(out["regressions"]), err=True)
        return 2
    return 0


def register(group: click.Group) -> None:
    for cmd in (push_cmd, pull_cmd, ls_cmd, rm_cmd, sign_cmd, verify_cmd, export_cmd, rollout_group):
        group.add_command(cmd)
