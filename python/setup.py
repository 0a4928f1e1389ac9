"""Installs the built package (build/python after `bash scripts/build.sh`) without
network: `.venv/bin/python -m pip install --no-build-isolation --no-index build/python`.
The extension is prebuilt by CMake; this only copies the tree."""

from setuptools import setup

setup(
    name="muonshard",
    version=open("muonshard/_build_info.py").read().split('VERSION = "')[1].split('"')[0],
    description="Optimizer sharding for Muon + AdamW training, as a service",
    packages=["muonshard", "muonshard.torch"],
    package_data={"muonshard": ["_muonshard*.so"]},
    python_requires=">=3.9",
    zip_safe=False,
)
