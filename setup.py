"""krex: builds the shim (shim/Makefile) into the package, so `pip install .` ships libkrex.so."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

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
        # the header parsed for cffi now, not at every import (krex_ctl/wire/cdefs.py, standalone: the package
        # is not importable yet); cffi is a build requirement
        spec = importlib.util.spec_from_file_location("krex_cdefs", ROOT / "krex_ctl" / "wire" / "cdefs.py")
        cdefs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cdefs)
        try:
            cdefs.build((ROOT / "shim" / "krex_proto.h").read_text(), lib / "krex_ffi.py")
        except ImportError as e:    # a build without isolation and without cffi: parsed at import instead
            print(f"krex: krex_ffi.py not built ({e}); the header will be parsed at import")


class PlatformWheel(bdist_wheel):
    """The wheel ships a compiled libkrex.so and krex-exec: tag it for this platform, not py3-none-any. The
    Python code and the shim's C ABI do not depend on the interpreter's version: py3, no ABI tag."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _python, _abi, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithShim, "bdist_wheel": PlatformWheel})
