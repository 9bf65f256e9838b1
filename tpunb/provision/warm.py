"""The modules a launch imports the first time, imported on a side thread.

Ctrl-C reaches only the main thread. An import it cuts off half-way leaves broken modules behind:
the next launch failed with "partially initialized module 'yaml'" or "module 'requests' has no
attribute 'exceptions'" (a package re-imported after a cut does not get back the submodules that
stayed loaded). Imported on a side thread, they cannot be cut; the launch waits for that thread,
and a Ctrl-C during the wait ends only the wait.
"""
from __future__ import annotations

import importlib
import os
import threading

from tpunb.transport.fanout import WAKE

#: in the order a launch needs them: the launch widget (every backend), paramiko and what it pulls
#: in (invoke, yaml), the Cloud TPU client over REST (requests, urllib3, google-auth)
LAUNCH_MODULES = (
    "ipywidgets",
    "tpunb.widgets.launch",
    "tpunb.transport.ssh_hosts",
    "tpunb.transport.keys",
    "tpunb.provision.gcp.tpu.api",
    "google.cloud.tpu_v2",
    "google.cloud.oslogin_v1",
    "google.auth",
    "google.auth.credentials",
    "google.auth.exceptions",
    "google.auth.transport.requests",
    "google.api_core.exceptions",
    "requests",
    "netrc",  # requests reads ~/.netrc on the first call
    "tpunb.host.standalone.idle",  # a cloud slice's watchdog: its settings and what it says
    "_strptime",  # datetime.strptime, on the first API timestamp
)
#: Compute Engine's client (TPU7x, v6e and v5p launch through it): 1.5-4 s to import. After the
#: rest, and only when a project or the sandbox is configured as the extension loads (else on a
#: thread of its own when first needed), so a launch elsewhere never waits for it
COMPUTE_MODULES = ("google.cloud.compute_v1",)
CLOUD_SETTINGS = ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "TPUNB_COMPUTE_API_ENDPOINT")

THREAD = "tpunb-warm-imports"
_lock = threading.Lock()
_started = threading.Event()  # set once per process, by the first start()
_compute_started = threading.Event()  # set once per process, when COMPUTE_MODULES are first imported
#: one event per launch module, set once it is imported (or failed to be)
IMPORTED = {name: threading.Event() for name in LAUNCH_MODULES + COMPUTE_MODULES}


def _import(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a missing extra is said by the launch that needs it
            pass
        finally:
            IMPORTED[name].set()


def _import_all() -> None:
    _import(LAUNCH_MODULES)
    if any(os.environ.get(key) for key in CLOUD_SETTINGS):
        _start_compute()


def _start_compute(thread: bool = False) -> None:
    with _lock:
        if _compute_started.is_set():
            return
        _compute_started.set()
    if thread:
        threading.Thread(target=_import_compute, name=THREAD, daemon=True).start()
    else:
        _import_compute()


def _import_compute() -> None:
    _import(COMPUTE_MODULES)


def start() -> None:
    """Begin importing (once per process, on a thread of its own)."""
    with _lock:
        if not _started.is_set():
            _started.set()
            threading.Thread(target=_import_all, name=THREAD, daemon=True).start()


def ready(*names: str) -> None:
    """Wait until these modules (LAUNCH_MODULES, if none named) are imported, starting the imports
    if nobody did."""
    start()
    if threading.current_thread().name == THREAD:  # an import of the list itself asks: it is on its way
        return
    if set(names) & set(COMPUTE_MODULES):
        _start_compute(thread=True)  # unless the warm-up thread has them on its list already
    for name in names or LAUNCH_MODULES:
        while not IMPORTED[name].wait(WAKE):  # a Ctrl-C that woke no sleep is raised within WAKE (fanout)
            pass
