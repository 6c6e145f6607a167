# SPDX-License-Identifier: Apache-2.0
"""Conformance of OTLP/JSON telemetry to the GenAI semantic conventions (``edgesdk check traces``).

:mod:`.otlp_json` reads trace files as a stream; :mod:`.checker` holds the rules' checks.
"""

from edgesdk.tracecheck.checker import Finding, Report, check_telemetry, check_trace_file, render_table
from edgesdk.tracecheck.otlp_json import TraceFileError, iter_otlp_json, read_otlp_json

__all__ = [
    "Finding",
    "Report",
    "TraceFileError",
    "check_telemetry",
    "check_trace_file",
    "iter_otlp_json",
    "read_otlp_json",
    "render_table",
]
