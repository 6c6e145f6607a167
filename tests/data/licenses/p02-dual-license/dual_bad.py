# SPDX-License-Identifier: GPL-2.0-only OR AGPL-3.0-only
print(2)
