# SPDX-License-Identifier: Apache-2.0
"""Device profiler: detect the device (``device``), measure a bundle on it (``bench``), predict other
devices with a roofline model (``roofline``), write/read/show reports (``report``) and compare two
reports for CI (``compare``). docs/profiler.md documents the report schema.
"""
