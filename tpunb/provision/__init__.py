"""Backends that make hosts, one module each, offering the same functions, so callers pick a
module by the slice's backend name and never branch on it:

- ``create(...) -> Slice``: make the hosts, start their agents, record the slice (local and gcp
  take ``(name, accelerator, env, registry, options)``; ssh takes the record %tpu_connect built)
- ``attach(record, registry, env) -> Slice``: a recorded slice's hosts again (agents not started)
- ``delete(record)``: delete what outlives the host processes (a cloud node); idempotent
- ``detached_state(record) -> str``: what %tpu_status says of a recorded slice not attached here
- ``name_reusable(record) -> bool``: a new slice may take this recorded slice's name

``local`` simulates a slice with host processes on this machine, ``ssh`` reaches hosts you
bring, ``gcp`` creates Cloud TPU nodes (and lists their zones for status and orphans).
"""
from __future__ import annotations

from types import ModuleType

from tpunb.errors import UsageError
from tpunb.provision import gcp, local, ssh

#: ways %tpu_launch makes hosts; %tpu_connect brings its own (backend "ssh")
LAUNCH_BACKENDS = ("local", "gcp")
_MODULES = {"local": local, "ssh": ssh, "gcp": gcp}


def backend(name: str) -> ModuleType:
    """The module of a backend, by the name records and --backend use."""
    try:
        return _MODULES[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}: use one of {', '.join(LAUNCH_BACKENDS)}") from None


def default_backend(project: str | None = None) -> str:
    """gcp when a Google Cloud project is given or configured (environment, gcloud), else local."""
    return "gcp" if project or gcp.configured() else "local"
