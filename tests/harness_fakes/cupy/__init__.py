"""Shape of what the hooks use of CuPy: cupy.cuda.runtime.deviceSynchronize() (logged as "sync")."""
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _log import log  # noqa: E402

cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: log("sync")))
