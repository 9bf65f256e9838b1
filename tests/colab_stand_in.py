"""A stand-in ``google.colab`` package that records every call made to it.

Colab's runtime cannot run outside Google's servers, so its ``google.colab`` package is the one
thing tpunb's tests replace: everything else (IPython 7.34, ipywidgets 7.7, jax 0.7.2, host
processes, a real kernel) is real in the Colab profile. The stand-in keeps Colab's call
signatures for the four functions tpunb uses and does nothing but record the call. It is
stdlib-only so a real Jupyter kernel can install it too (see tests/test_colab.py).
"""
from __future__ import annotations

import os
import sys
import types

NAMES = ("google.colab", "google.colab.auth", "google.colab.output")


def install() -> list[tuple]:
    """Put the stand-in into sys.modules; returns the list every call is appended to."""
    import google  # the real namespace package (google-auth): google.colab hangs off it as in Colab

    calls: list[tuple] = []
    colab = types.ModuleType("google.colab")
    colab.__path__ = []  # a package, as in Colab
    auth = types.ModuleType("google.colab.auth")
    output = types.ModuleType("google.colab.output")

    def authenticate_user(clear_output: bool = True, project_id: str | None = None) -> None:
        calls.append(("auth.authenticate_user", project_id))
        if project_id:  # what Colab's does besides writing application-default credentials
            os.environ["GOOGLE_CLOUD_PROJECT"] = project_id

    def enable_custom_widget_manager() -> None:
        calls.append(("output.enable_custom_widget_manager",))

    def eval_js(script: str, ignore_result: bool = False, timeout_sec: float | None = None):
        """Colab runs ``script`` in the notebook's browser; the one script tpunb sends is
        ``google.colab.kernel.proxyPort(PORT)``, whose answer in Colab is an https URL of Colab's
        proxy that reaches PORT on the kernel's machine. The stand-in answers with a URL of that
        shape (nothing serves it: Colab's proxy is Google's)."""
        calls.append(("output.eval_js", script))
        port = script.removeprefix("google.colab.kernel.proxyPort(").removesuffix(")")
        return f"https://{port}-stand-in-colab.googleusercontent.com/" if port.isdigit() else None

    auth.authenticate_user = authenticate_user
    output.enable_custom_widget_manager = enable_custom_widget_manager
    output.eval_js = eval_js
    colab.auth, colab.output = auth, output
    sys.modules.update({"google.colab": colab, "google.colab.auth": auth, "google.colab.output": output})
    google.colab = colab
    return calls


def uninstall() -> None:
    import google

    for name in NAMES:
        sys.modules.pop(name, None)
    if hasattr(google, "colab"):
        del google.colab
