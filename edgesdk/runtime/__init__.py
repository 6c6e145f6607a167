# SPDX-License-Identifier: Apache-2.0
"""On-device runtime: :func:`edgesdk.load` -> :class:`~edgesdk.runtime.session.Session`."""
