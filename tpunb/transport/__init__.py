"""How bytes reach a host: one module per way (local pipes, SSH), one small interface."""
from tpunb.transport.base import AgentProcess, Transport

__all__ = ["AgentProcess", "Transport"]
