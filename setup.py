"""Packaging glue pyproject.toml cannot say: the top-level ``algorithm_templates/`` folder (where users browse
and edit the templates) ships inside the wheel as ``autotune/algorithm_templates``. Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["autotune", "autotune.*"]), "autotune.algorithm_templates"],
    package_dir={"autotune.algorithm_templates": "algorithm_templates"},
)
