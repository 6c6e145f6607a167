# SPDX-License-Identifier: Apache-2.0
"""``python -m edgesdk`` is the ``edgesdk`` command."""

from edgesdk.cli import main

main()
