"""The modules a launch imports the first time, imported on a side thread.

Ctrl-C reaches only the main thread. An import it cuts off half-way leaves broken modules behind:
the next launch failed with "partially initialized module 'yaml'" or "module 'requests' has no
attribute 'exceptions'" (a package re-imported after a cut does not get back the submodules that
stayed loaded). Imported on a side thread, they cannot be cut; the launch waits for that thread,
and a Ctrl-C during the wait ends only the wait.
"""
from __future__ import annotations

import importlib
import threading

#: in the order a launch needs them: the launch widget (every backend), paramiko and what it pulls
#: in (invoke, yaml), the Cloud TPU client over REST (requests, urllib3, google-auth)
LAUNCH_MODULES = (
    "ipywidgets",
    "tpunb.widgets.launch",
    "tpunb.transport.ssh",
    "tpunb.transport.keys",
    "tpunb.provision.gcp.api",
    "google.cloud.tpu_v2",
    "google.cloud.oslogin_v1",
    "google.auth",
    "google.auth.credentials",
    "google.auth.exceptions",
    "google.auth.transport.requests",
    "google.api_core.exceptions",
    "requests",
    "netrc",  # requests reads ~/.netrc on the first call
    "_strptime",  # datetime.strptime, on the first API timestamp
)

THREAD = "tpunb-warm-imports"
_lock = threading.Lock()
_started = threading.Event()  # set once per process, by the first start()
#: one event per launch module, set once it is imported (or failed to be)
IMPORTED = {name: threading.Event() for name in LAUNCH_MODULES}


def _import_all() -> None:
    for name in LAUNCH_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # a missing extra is said by the launch that needs it
            pass
        finally:
            IMPORTED[name].set()


def start() -> None:
    """Begin importing (once per process, on a thread of its own)."""
    with _lock:
        if not _started.is_set():
            _started.set()
            threading.Thread(target=_import_all, name=THREAD, daemon=True).start()


def ready(*names: str) -> None:
    """Wait until these launch modules (all, if none named) are imported, starting the imports if
    nobody did."""
    start()
    if threading.current_thread().name == THREAD:  # an import of the list itself asks: it is on its way
        return
    for name in names or LAUNCH_MODULES:
        IMPORTED[name].wait()
