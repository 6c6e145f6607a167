# SPDX-License-Identifier: Apache-2.0
BAD = 'SPDX-License-Identifier: GPL-3.0-only'
TEMPLATE = """
license: cc-by-nc-4.0
"""
