# SPDX-License-Identifier: LicenseRef-acme-eula
print('acme')
