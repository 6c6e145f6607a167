# SPDX-License-Identifier: Apache-2.0
"""Compliance checks that read bundles and trace files: the license gate (:mod:`.gate`) and
OpenTelemetry trace checks (:mod:`.traces`)."""
