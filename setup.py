# SPDX-License-Identifier: Apache-2.0
"""Package list only; everything else is in pyproject.toml.

The device profiles live in the top-level ``profiles/`` (one YAML file per device, next to the code
that reads them) and ship inside the wheel as the package ``edgesdk.profiles_data``. pyproject.toml
cannot combine package discovery with a package mapped to another directory, so the list is built here.
"""

from setuptools import find_namespace_packages, setup

setup(
    # Namespace discovery so the data directories (edgesdk/data/...) count as packages too.
    packages=[*find_namespace_packages(include=["edgesdk", "edgesdk.*"], exclude=["*.__pycache__"]),
              "edgesdk.profiles_data"],
    package_dir={"edgesdk.profiles_data": "profiles"},
)
