# SPDX-License-Identifier: Apache-2.0
"""Which ops of an ONNX model run where on a device: TensorRT, DLA, CUDA EP, CPU EP; partitions; precision.

    from edgesdk.capability import check_capability, precision_report
    report = check_capability("model.onnx", resolve_profile("orin-agx-64gb"))
    print(render_table(report)); report.to_dict()
    precision_report("model.onnx", profile, "int8")   # which ops stay higher precision, conversions

Support data lives in ``edgesdk/data/capability/*.yaml``, every entry with its source.
"""

from edgesdk.capability.checker import BACKENDS, CapabilityReport, backend_chain, check_capability
from edgesdk.capability.precision import precision_report, precision_report_from
from edgesdk.capability.render import render_table

__all__ = [
    "BACKENDS",
    "CapabilityReport",
    "backend_chain",
    "check_capability",
    "precision_report",
    "precision_report_from",
    "render_table",
]
