"""Ships the kernel sources inside the package: kernels/src and kernels/include are copied into the
built package as wyoming_qwen3tts/_kernels, so a wheel or a non-editable install can build the
library on the machine it runs on (backends/kernels/build.py KERNEL_DIR looks there first). An editable install, the
Docker images and a checkout read kernels/ in place. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_PARTS = ("src", "include")


class BuildWithKernels(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        root = Path(__file__).resolve().parent / "kernels"
        target = Path(self.build_lib) / "wyoming_qwen3tts" / "_kernels"
        for part in KERNEL_PARTS:
            shutil.rmtree(target / part, ignore_errors=True)
            shutil.copytree(root / part, target / part)


setup(cmdclass={"build_py": BuildWithKernels})
