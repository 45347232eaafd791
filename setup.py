"""krex: builds the shim (shim/Makefile) into the package, so `pip install .` ships libkrex.so."""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithShim(build_py):
    def run(self):
        subprocess.check_call(["make", "-C", str(ROOT / "shim"), f"OUT={ROOT / 'build'}"])
        super().run()
        lib = Path(self.build_lib) / "krex_ctl" / "_lib"
        lib.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "build" / "libkrex.so", lib / "libkrex.so")
        shutil.copy2(ROOT / "build" / "krex-exec", lib / "krex-exec")
        shutil.copy2(ROOT / "shim" / "krex_proto.h", lib / "krex_proto.h")
        shutil.copy2(ROOT / "shim" / "krex.h", lib / "krex.h")


setup(cmdclass={"build_py": BuildWithShim})
