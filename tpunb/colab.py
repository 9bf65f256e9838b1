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
  one-host slice. The host process gets the real chip: no CPU forcing, JAX chooses the TPU, and
  the slice's type comes from what JAX there sees (``jax.devices()[0].device_kind`` and the
  device count: a v5e-1, a v6e-1, a v2-8 runtime, ...), unless TPU_ACCELERATOR_TYPE says it.
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

from tpunb import catalog, report
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


def enable_custom_widgets() -> bool:
    """Before displaying a custom (non-core) widget: in Colab, turn on its custom widget manager.

    Core ipywidgets render in Colab without it, so only custom widgets call this. Returns True
    when the manager is (now) enabled, False outside Colab, where nothing is needed.
    """
    if not in_colab():
        return False
    if report.once("colab custom widget manager"):  # Colab keeps it on until the runtime restarts
        from google.colab import output

        output.enable_custom_widget_manager()
    return True


# -- this machine's own TPU -------------------------------------------------------------------


def count_chips(dev: Path = Path("/dev")) -> int:
    """TPU chips this machine exposes: /dev/accelN (v2-v4) or /dev/vfio/N (v5e, v5p, v6e)."""
    accel = [p for p in dev.glob("accel*") if re.fullmatch(r"accel\d+", p.name)]
    vfio = [p for p in (dev / "vfio").glob("*") if p.name.isdigit()] if (dev / "vfio").is_dir() else []
    return len(accel) + len(vfio)


#: ``jax.devices()[0].device_kind`` -> (catalog generation, accelerator-name units per JAX device):
#: v2, v3, v4 and v5p names count TensorCores (v2/v3 show each core as a device, v4 and v5p one
#: device per 2-core chip); v5e and v6e count chips. Source: jax's own table of device kinds,
#: jax/_src/pallas/mosaic/tpu_info.py (docs/cloud-facts.md)
DEVICE_KINDS = {"TPU v2": ("v2", 1), "TPU v3": ("v3", 1), "TPU v4": ("v4", 2), "TPU v5": ("v5p", 2),
                "TPU v5p": ("v5p", 2), "TPU v5 lite": ("v5litepod", 1), "TPU v5e": ("v5litepod", 1),
                "TPU v6 lite": ("v6e", 1), "TPU v6e": ("v6e", 1)}
#: run on the host that holds the chips: what JAX sees there
DEVICE_PROBE = "import jax as _jax\n(_jax.devices()[0].device_kind, _jax.device_count())"


def accelerator_from_devices(kind: str, devices: int) -> catalog.Accelerator:
    """The accelerator type of a TPU VM whose JAX sees ``devices`` devices of ``kind``."""
    if kind not in DEVICE_KINDS:
        raise UsageError(f"JAX on this machine sees {devices} {kind!r} device{'s' if devices != 1 else ''}, not a TPU "
                         f"tpunb knows: say which TPU it is with %env {ACCELERATOR_VARIABLE}=TYPE (e.g. v6e-4)")
    generation, units = DEVICE_KINDS[kind]
    return catalog.lookup(f"{generation}-{devices * units}")


def own_accelerator(environ: Mapping[str, str] = os.environ, dev: Path = Path("/dev")) -> catalog.Accelerator | None:
    """What this machine's TPU is: TPU_ACCELERATOR_TYPE if set; None when only JAX on its chips can
    say (``accelerator_from_devices`` once the host runs). No chips at all: a one-line error."""
    name = environ.get(ACCELERATOR_VARIABLE, "").strip()
    if not name:
        if count_chips(dev) == 0:
            raise UsageError("no TPU on this machine: in Colab pick Runtime > Change runtime type > TPU, "
                             "or simulate a slice with %tpu_launch v5litepod-8")
        return None
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


def user_secret(name: str) -> str | None:
    """Colab's secret ``name`` (the key icon in its sidebar: ``google.colab.userdata``), or None
    outside Colab or when it has none of that name; a secret this notebook may not read is one line."""
    if not in_colab():
        return None
    from google.colab import userdata  # type: ignore[import-not-found]

    try:
        return userdata.get(name)
    except userdata.SecretNotFoundError:
        return None
    except userdata.NotebookAccessError:
        raise UsageError(f"Colab's secret {name} exists but this notebook may not read it: switch on its "
                         "'Notebook access' in the key icon's panel, then run this again") from None
