"""SSH hosts' fork servers, seen from the kernel (``tpunb/host/forkserver.py``'s ``serve``).

Most of an agent's start is a fresh Python importing IPython's shell: about 0.6 s of CPU a host,
paid again by every launch, restart and standby, and by every kernel that connects. As the
kernel's local hosts do (``tpunb.transport.forkserver``), an SSH host pays it once: a fork server
that imported it forks each agent, which an exec channel asks for through a small client
(``standalone/forkclient.py``, a Python that imports nothing of note). The server outlives the
connection that started it and serves every kernel of this user, Python, environment and tpunb
(its socket's name says which); it ends after ten minutes with no agent (``IDLE_SECONDS``).

Only a host whose Python tpunb does not prepare first gets one (a prepared host's launcher checks
its environment at every start). ``TPUNB_FORK_SERVER=0`` turns it off, as for local hosts.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
from typing import Any

from tpunb.transport.bundle import SSH_FORK_SERVER, agent_bundle, fork_client_source
from tpunb.errors import TransportError

#: seconds a server's start may take to say it listens (it imports IPython first), and a client
#: to say the pid of the agent it asked for
READY_SECONDS = 60.0


def enabled() -> bool:
    return os.environ.get("TPUNB_FORK_SERVER") != "0"


@functools.lru_cache(maxsize=1)
def digest() -> str:
    """This tpunb's agent, as hosts' fork servers tell one apart from another's."""
    return hashlib.sha256(agent_bundle()).hexdigest()[:16]


def client_command(python: str) -> str:
    """What an agent's exec channel runs to be forked by its host's server."""
    return f"exec {shlex.quote(python)} -I -S -c {shlex.quote(fork_client_source())} {digest()}"


def start_server(transport: Any) -> bool:
    """Start the host's fork server (or find that one serves) through ``transport`` (an
    SSHTransport, which imports this module); False where it cannot run one."""
    python = shlex.quote(transport.python)
    channel = transport.open_command(f"exec {python} -c {shlex.quote(SSH_FORK_SERVER)} 0 {digest()}", wait=False)
    try:
        channel.sendall(agent_bundle())
        channel.settimeout(READY_SECONDS)
        said = _first_line(channel)
    except OSError:
        said = ""
    finally:
        channel.close()
    if said == "ready":
        return True
    if said == "unsupported" or not said:
        return False
    raise TransportError(f"no fork server on {transport.address}: {said}")


def _first_line(channel: Any) -> str:
    line = b""
    while not line.endswith(b"\n"):
        chunk = channel.recv(1)
        if not chunk:
            break
        line += chunk
    return line.decode(errors="replace").strip()
