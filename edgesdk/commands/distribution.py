# SPDX-License-Identifier: Apache-2.0
"""``edgesdk push`` / ``pull`` / ``ls`` / ``rm``: bundles on OCI registries and the local store
(:mod:`edgesdk.distribution`)."""

from __future__ import annotations

import click

from edgesdk.commands._common import emit_json, info, table


@click.command("push")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.argument("reference")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def push_cmd(bundle: str, reference: str, as_json: bool) -> int:
    """Push BUNDLE to REFERENCE (oci://REGISTRY/NAMESPACE/NAME:TAG); the tag holds one entry per profile."""
    from edgesdk.distribution.store import push

    out = push(bundle, reference, progress=None if as_json else info)
    if as_json:
        emit_json(out)
    else:
        click.echo(
            f"pushed {out['files']} files ({out['bytes'] / 1e6:.1f} MB, {out['uploaded_bytes'] / 1e6:.1f} MB uploaded) "
            f"as {out['reference']} for profile {out['profile']}: {out['manifest_digest']}; "
            f"the tag holds {', '.join(out['profiles'])}"
        )
    return 0


@click.command("pull")
@click.argument("reference")
@click.option(
    "--profile",
    default="auto",
    show_default=True,
    help="Which profile's bundle to take from the tag's index ('auto': the profile this host matches).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pull_cmd(reference: str, profile: str, as_json: bool) -> int:
    """Pull REFERENCE into the local store ($EDGESDK_HOME or ~/.cache/edgesdk), verified, and print its path."""
    from edgesdk.distribution.store import pull

    got = pull(reference, profile, progress=None if as_json else info)
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


def register(group: click.Group) -> None:
    for cmd in (push_cmd, pull_cmd, ls_cmd, rm_cmd):
        group.add_command(cmd)
