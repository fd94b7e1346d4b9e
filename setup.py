"""Finds the packages, so that a new one cannot be left out of the wheel (pyproject.toml holds everything else).

adapters/, finetune/ and bench/ install as specdec_adapters, specdec_finetune and specdec_bench (why: see
pyproject.toml); tests/, docs/, vscode-client/ and examples/ are not packages. tests/test_wheel.py builds the wheel and compares it with the tree.
"""

from setuptools import find_packages, setup

RENAMED = {"specdec_adapters": "adapters", "specdec_finetune": "finetune", "specdec_bench": "bench"}

packages = find_packages(include=["specdec", "specdec.*", "lsp_server", "lsp_server.*"])
for name, folder in RENAMED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=RENAMED)
