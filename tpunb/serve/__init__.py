"""Serving from a slice: services on hosts that outlive cells and kernels, their logs, and
port forwards from the notebook's machine to a host's port."""
from tpunb.serve.services import ServiceState, follow, logs, recorded_services, serve, services, stop, stop_all

__all__ = ["ServiceState", "follow", "logs", "recorded_services", "serve", "services", "stop", "stop_all"]
