#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One commit only on the device, while uncommitted work sits in the checkout (a device call copies the whole
# working tree): `bash tools/device/clean_tree.sh [REV]` writes into .dist/ the wheel of REV (default HEAD, built
# from `git archive`), COMMIT, and head.tgz (REV's edgesdk/ and tools/, under 1 MB). First thing in the call:
#   rm -rf edgesdk tools && tar -xzf .dist/head.tgz
# so the scripts the call runs, and any import of the checkout's edgesdk, are REV's.
set -euo pipefail
REV="${1:-HEAD}"
PY="${PY:-python3}"
tmp=$(mktemp -d)
git archive --format=tar "$REV" | tar -x -C "$tmp"
rm -rf .dist && mkdir .dist
"$PY" -m pip wheel -q --no-deps "$tmp" -w .dist/
rm -rf "$tmp"
git archive --format=tar.gz "$REV" edgesdk tools > .dist/head.tgz
git rev-parse --short "$REV" > .dist/COMMIT
ls -la .dist
