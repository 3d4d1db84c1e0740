"""Ships the pinned Azurite with the package: ``azurite/package.json`` and its lock file
are copied into ``azqueue/azurite/`` of every build, so that an installed azqueue (no
checkout) installs exactly that Azurite with npm on first use (``azqueue.devstorage``)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PIN = Path(__file__).resolve().parent / "azurite"


class BuildWithAzuritePin(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "azqueue" / "azurite"
        target.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(PIN / name, target / name)


setup(cmdclass={"build_py": BuildWithAzuritePin})
