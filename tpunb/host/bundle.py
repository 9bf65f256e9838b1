"""What is shipped to a host at connect: a tiny bootstrap on the command line, then the host
modules over stdin, installed as the package ``tpunb_host`` (so a host needs only Python >= 3.10).

This module runs in the kernel; it is the one module of ``tpunb/host`` that is never shipped.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

PACKAGE = "tpunb_host"
#: shipped in this order: each module's relative imports name only modules before it
MODULES = ("protocol", "watchdog", "io", "inbox", "runners", "diagnose", "jax_start", "metrics", "profiler", "idle", "shards", "transfer", "relay", "stacks", "agent")

#: the start of every program given on a host's command line: read a length-prefixed message from stdin
READ = r"""
import json, os, sys, types
def _read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit(3)
        data += chunk
    return data
"""

BOOTSTRAP = READ + r"""_bundle = json.loads(_read(int(_read(12))))
_package = types.ModuleType(_bundle["package"])
_package.__path__ = []
sys.modules[_bundle["package"]] = _package
for _name, _source in _bundle["modules"]:
    _module = types.ModuleType(_bundle["package"] + "." + _name)
    _module.__file__ = "<tpunb:" + _module.__name__ + ">"
    _module.__package__ = _bundle["package"]
    sys.modules[_module.__name__] = _module
    setattr(_package, _name, _module)
    exec(compile(_source, _module.__file__, "exec"), _module.__dict__)
sys.modules[_bundle["package"] + ".agent"].main()
"""

#: the service control process (``service.py``): its source and one request arrive on stdin
SERVICE_CONTROL = READ + r"""_message = json.loads(_read(int(_read(12))))
_module = types.ModuleType("tpunb_host_service")
sys.modules["tpunb_host_service"] = _module
exec(compile(_message["source"], "<tpunb:service>", "exec"), _module.__dict__)
_module.control(_message["request"])
"""

#: reads an agent's stacks on its host (``stacks.read``) without the agent's help: its source and
#: one request arrive on stdin, the reply is length-prefixed JSON on stdout
STACKS_READER = READ + r"""_message = json.loads(_read(int(_read(12))))
_module = types.ModuleType("tpunb_host_stacks")
exec(compile(_message["source"], "<tpunb:stacks>", "exec"), _module.__dict__)
_reply = json.dumps(_module.read(_message["request"])).encode()
sys.stdout.buffer.write(b"%012d" % len(_reply) + _reply)
sys.stdout.flush()
"""


@functools.lru_cache(maxsize=1)
def agent_bundle() -> bytes:
    """The host modules, length-prefixed, as the bootstrap reads them from stdin."""
    here = Path(__file__).parent
    modules = [(name, (here / f"{name}.py").read_text()) for name in MODULES]
    body = json.dumps({"package": PACKAGE, "modules": modules}).encode()
    return b"%012d" % len(body) + body


@functools.lru_cache(maxsize=1)
def idle_script() -> str:
    """The idle watchdog (``idle.py``) as a standalone Python script: a node's startup-script, and
    what host 0's agent runs as the watchdog process."""
    return "#!/usr/bin/env python3\n" + (Path(__file__).parent / "idle.py").read_text()


@functools.lru_cache(maxsize=1)
def stacks_source() -> str:
    """``stacks.py``, sent with each request to the stacks reader."""
    return (Path(__file__).parent / "stacks.py").read_text()


@functools.lru_cache(maxsize=1)
def service_source() -> str:
    """``service.py``, sent with each request to the service control process."""
    return (Path(__file__).parent / "service.py").read_text()
