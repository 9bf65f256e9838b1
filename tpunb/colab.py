"""What only Google Colab has, in one place: its sign-in, its widget manager, its own TPU chip.

Everything else in tpunb runs unchanged in Colab's runtime (IPython 7.34, ipywidgets 7.7;
``tests/colab/constraints.txt`` pins it and ``scripts/test_colab`` proves it). This module:

- ``in_colab()``: the kernel is a Colab kernel (``google.colab`` is importable).
- ``authenticate(project)``: Colab's ``google.colab.auth.authenticate_user()``, which writes
  application-default credentials; tpunb's "no credentials" error names it when in Colab.
- ``enable_custom_widgets()``: Colab renders core ipywidgets by itself, but a third-party
  (custom) widget needs ``google.colab.output.enable_custom_widget_manager()``; tpunb's custom
  widgets call this helper once, core ones never do.
- ``%tpu_launch local``: this machine's own TPU chips (a Colab TPU runtime is a v5e-1) as a
  one-host slice. The host process gets the real chip: no CPU forcing, JAX chooses the TPU.
  Only one process can hold a TPU, so if this kernel's JAX already took it, that is said in one
  line instead of failing deep inside libtpu.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Mapping

from tpunb import catalog
from tpunb.errors import UsageError

#: the word ``%tpu_launch`` takes for "this machine's own TPU", instead of an accelerator name
OWN_TPU = "local"
#: a v5e-1 runtime has one chip; multi-chip TPU VMs say what they are in this variable
ACCELERATOR_VARIABLE = "TPU_ACCELERATOR_TYPE"


class TpuHeldError(UsageError):
    """This kernel's own JAX holds the TPU, so no host process can open it."""


def in_colab() -> bool:
    """True in a Colab kernel (which imports google.colab at start; an import check covers the rest)."""
    if "google.colab" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("google.colab") is not None
    except (ImportError, ValueError):
        return False


def authenticate(project: str | None = None) -> None:
    """Sign in with Colab's own flow so google.auth.default() (and so Cloud TPU) works.

    ``project`` also becomes GOOGLE_CLOUD_PROJECT, which makes ``%tpu_launch`` default to Cloud TPU.
    """
    if not in_colab():
        raise UsageError("tpunb.colab.authenticate() is for Colab; elsewhere run "
                         "`gcloud auth application-default login`")
    from google.colab import auth

    if project:
        auth.authenticate_user(project_id=project)
        os.environ["GOOGLE_CLOUD_PROJECT"] = project
    else:
        auth.authenticate_user()


#: what tpunb's "no credentials" and "no project" errors tell a Colab user to run
SIGN_IN = "run `import tpunb.colab; tpunb.colab.authenticate('PROJECT')` (Colab's Google sign-in)"


_custom_widget_manager: list[bool] = []  # once per kernel: Colab keeps it on until the runtime restarts


def enable_custom_widgets() -> bool:
    """Before displaying a custom (non-core) widget: in Colab, turn on its custom widget manager.

    Core ipywidgets render in Colab without it, so only custom widgets call this. Returns True
    when the manager is (now) enabled, False outside Colab, where nothing is needed.
    """
    if not in_colab():
        return False
    if not _custom_widget_manager:
        from google.colab import output

        output.enable_custom_widget_manager()
        _custom_widget_manager.append(True)
    return True


# -- this machine's own TPU -------------------------------------------------------------------


def count_chips(dev: Path = Path("/dev")) -> int:
    """TPU chips this machine exposes: /dev/accelN (v2-v4) or /dev/vfio/N (v5e, v5p, v6e)."""
    accel = [p for p in dev.glob("accel*") if re.fullmatch(r"accel\d+", p.name)]
    vfio = [p for p in (dev / "vfio").glob("*") if p.name.isdigit()] if (dev / "vfio").is_dir() else []
    return len(accel) + len(vfio)


def own_accelerator(environ: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> catalog.Accelerator:
    """What this machine's TPU is: TPU_ACCELERATOR_TYPE if set, else a Colab TPU runtime's v5e-1."""
    name = environ.get(ACCELERATOR_VARIABLE, "").strip()
    if not name:
        chips = count_chips(dev)
        if chips == 0:
            raise UsageError("no TPU on this machine: in Colab pick Runtime > Change runtime type > TPU, "
                             "or simulate a slice with %tpu_launch v5litepod-8")
        if not (in_colab() and chips == 1):
            raise UsageError(f"this machine has {chips} TPU chip{'s' if chips > 1 else ''}: say which TPU it is "
                             f"with %env {ACCELERATOR_VARIABLE}=v5litepod-{chips}, then %tpu_launch {OWN_TPU}")
        name = "v5litepod-1"  # Colab's TPU runtime: one v5e chip
    accel = catalog.lookup(name)
    if accel.hosts != 1:
        raise UsageError(f"this machine is one host of a {accel.name} ({accel.hosts} hosts): reach all of them "
                         f"with %tpu_connect or %tpu_launch {accel.name} --backend gcp")
    return accel


def kernel_holds_tpu() -> bool:
    """True if JAX in this process has opened a TPU backend (importing jax alone opens nothing)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) or {}
    return any(name == "tpu" or getattr(client, "platform", "") == "tpu" for name, client in backends.items())


def check_tpu_free() -> None:
    """One line instead of libtpu's failure deep in a host, when this kernel already took the TPU."""
    if kernel_holds_tpu():
        raise TpuHeldError(f"this kernel already holds the TPU (jax was used here): restart the runtime and run "
                           f"%tpu_launch {OWN_TPU} before using jax in the notebook itself")


def own_tpu_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A host on this machine's real chips: JAX picks the TPU (JAX_PLATFORMS empty means "choose",
    as unset), and the kernel's XLA_FLAGS lose any CPU device forcing."""
    flags = [f for f in environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    return {"JAX_PLATFORMS": "", "XLA_FLAGS": " ".join(flags)}
