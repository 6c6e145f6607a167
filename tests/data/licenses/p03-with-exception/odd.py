# SPDX-License-Identifier: MIT WITH LicenseRef-made-up-exception
print(3)
