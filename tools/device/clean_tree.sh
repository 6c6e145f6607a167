#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A wheel and a source tree of one commit only, for a device call made while uncommitted work sits in the checkout
# (the call copies the whole working tree): `bash tools/device/clean_tree.sh [REV]` writes .dist/ (the wheel of
# REV, default HEAD) and .dist/src.tar (`git archive` of REV). On the device, run from that tree:
#   mkdir -p /tmp/src && tar -xf .dist/src.tar -C /tmp/src && cp -r .dist .whl .llamacpp /tmp/src/ && cd /tmp/src
set -euo pipefail
REV="${1:-HEAD}"
PY="${PY:-python3}"
tmp=$(mktemp -d)
git archive --format=tar "$REV" > "$tmp/src.tar"
mkdir "$tmp/tree" && tar -xf "$tmp/src.tar" -C "$tmp/tree"
rm -rf .dist && mkdir .dist
"$PY" -m pip wheel -q --no-deps "$tmp/tree" -w .dist/
cp "$tmp/src.tar" .dist/src.tar
git rev-parse --short "$REV" > .dist/COMMIT
rm -rf "$tmp"
ls -la .dist
