"""How bytes reach a host: one module per way (local pipes, SSH), one small interface; and what
every use of hosts below the engine shares: work on N hosts at once (``fanout``) and what is
shipped to them (``bundle``)."""
from tpunb.transport.seam import AgentProcess, Transport

__all__ = ["AgentProcess", "Transport"]
