# SPDX-License-Identifier: Apache-2.0
"""Compliance checks that read bundles: the license gate (:mod:`.gate`). Trace files are checked by
:mod:`edgesdk.tracecheck`."""
