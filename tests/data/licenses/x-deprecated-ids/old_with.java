// SPDX-License-Identifier: GPL-2.0-with-classpath-exception
class B {}
