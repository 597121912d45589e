"""Map the one import namespace, ``hopserve``, onto the design card's top-level folders.

``hopserve.worker`` lives in ``worker/``, ``hopserve.server`` in ``server/`` and so on;
``hopserve`` itself (public API re-exports and the CLI) lives in ``hopserve/``.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "hopserve": "hopserve",
    "hopserve.worker": "worker",
    "hopserve.server": "server",
    "hopserve.client": "client",
    "hopserve.proto": "proto",
}

packages: list[str] = []
for package, folder in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=FOLDERS,
    package_data={"hopserve.proto": ["**/*.proto", "**/*.pyi"]},
)
