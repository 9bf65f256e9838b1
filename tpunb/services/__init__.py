"""Serving from a slice: services on hosts that outlive cells and kernels, their logs, and
port forwards from the notebook's machine to a host's port. A slice holds one ``Serving``."""
from tpunb.services.seen import ServiceState
from tpunb.services.serving import Serving, recorded_services

__all__ = ["ServiceState", "Serving", "recorded_services"]
