"""``python -m tpunb.emulator``: the old name of ``python -m tpunb.sandbox``, for one release."""
import runpy
import sys
import warnings

warnings.warn("python -m tpunb.emulator is deprecated: run python -m tpunb.sandbox", DeprecationWarning, stacklevel=1)
sys.argv[0] = "python -m tpunb.sandbox"
runpy.run_module("tpunb.sandbox", run_name="__main__", alter_sys=True)
