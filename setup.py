"""Packaging beyond pyproject.toml: the zoo (models/ at the top of the repository) goes
into the wheel as the data package `explain._zoo`, where `explain.loading.zoo.zoo_root` finds it
(its files are listed in pyproject.toml's package-data)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["explain", "explain.*"]), "explain._zoo"],
    package_dir={"explain._zoo": "models"},
)
