# SPDX-License-Identifier: Apache-2.0
"""Device profiles (``*.yaml``), shipped in the wheel as ``edgesdk.profiles_data`` (see setup.py).

Read them through :func:`edgesdk.profiles.list_profiles`; this file only makes the directory a package.
"""
