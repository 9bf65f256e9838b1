"""Backends that make hosts, one module each, satisfying one contract (``base.Backend``), so
callers pick a module by the slice's backend name and never branch on it. ``base.LaunchRequest``
is the one record every ``create`` takes; each backend's ``slice_status`` says its slices' state,
hosts and price for %tpu_status, the widgets and the sidebar alike.

``local`` simulates a slice with host processes on this machine, ``ssh`` reaches hosts you
bring, ``gcp`` creates Cloud TPU nodes (and lists their zones for status and orphans).
"""
from __future__ import annotations

from typing import cast

from tpunb.errors import UsageError
from tpunb.provision import gcp, local, ssh
from tpunb.provision.base import Backend, LaunchRequest

__all__ = ["Backend", "LaunchRequest", "LAUNCH_BACKENDS", "backend", "default_backend", "gcp", "local", "ssh"]

#: ways %tpu_launch makes hosts; %tpu_connect brings its own (backend "ssh")
LAUNCH_BACKENDS = ("local", "gcp")
_MODULES = {"local": local, "ssh": ssh, "gcp": gcp}


def backend(name: str) -> Backend:
    """The module of a backend, by the name records and --backend use."""
    try:
        return cast(Backend, _MODULES[name])
    except KeyError:
        raise UsageError(f"unknown backend {name!r}: use one of {', '.join(LAUNCH_BACKENDS)}") from None


def default_backend(project: str | None = None) -> str:
    """gcp when a Google Cloud project is given or configured (environment, gcloud), else local."""
    return "gcp" if project or gcp.configured() else "local"
