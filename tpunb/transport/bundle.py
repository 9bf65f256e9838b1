"""What is shipped to a host at connect: a tiny bootstrap on the command line, then the modules
of ``tpunb/host`` over stdin, installed as the package ``tpunb_host`` (so a host needs only
Python >= 3.10); and the standalone programs of ``tpunb/host/standalone`` as their own scripts.
A host whose environment tpunb prepares gets ``LAUNCHER`` instead: it reads the spec and the
bundle, makes or checks the environment (``prepare.py``), then execs the environment's Python
with ``BOOTSTRAP`` reading the same bundle from a memfd (its number is the program's argument).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

PACKAGE = "tpunb_host"
#: where the shipped modules are: every module of tpunb/host, and the standalone programs the
#: agent imports (tests/test_layout.py proves this list matches the folder)
HOST = Path(__file__).resolve().parent.parent / "host"
#: shipped in this order: each module's relative imports name only modules before it
MODULES = ("protocol", "uv_wheel", "prepare", "watchdog", "io", "inbox", "runners", "diagnose", "metrics",
           "profiler", "standalone.idle", "gcs", "snapshot", "preempt", "jaxcache", "jax_start", "shards", "transfer",
           "relay", "fetch", "download", "receive", "hflayout", "spread", "stacks", "exchange", "agent",
           "standalone.forkclient", "forkserver")

#: the start of every program given on a host's command line: read a length-prefixed message from
#: stdin, or from the file descriptor given as the program's argument (the launcher's memfd)
READ = r"""
import json, os, sys, types
_FD = int(sys.argv[1]) if len(sys.argv) > 1 else 0
def _read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(_FD, n - len(data))
        if not chunk:
            raise SystemExit(3)
        data += chunk
    return data
"""

#: what follows READ in a program that runs the agent's bundle: its modules, read and made
LOAD = r"""_bundle = json.loads(_read(int(_read(12))))
_init = None
if _FD:  # the launcher's memfd: the bundle, then this host's init frame (never on disk)
    _init = json.loads(_read(int(_read(12))))
    os.close(_FD)
_package = types.ModuleType(_bundle["package"])
_package.__path__ = []
sys.modules[_bundle["package"]] = _package
for _name, _source in _bundle["modules"]:
    _module = types.ModuleType(_bundle["package"] + "." + _name)
    _module.__file__ = "<tpunb:" + _module.__name__ + ">"
    _module.__package__ = _module.__name__.rpartition(".")[0]
    sys.modules[_module.__name__] = _module
    setattr(sys.modules[_module.__package__], _name.rpartition(".")[2], _module)
    if _source is None:
        _module.__path__ = []
    else:
        exec(compile(_source, _module.__file__, "exec"), _module.__dict__)
"""
BOOTSTRAP = READ + LOAD + """sys.modules[_bundle["package"] + ".agent"].main(_init)\n"""
#: the fork server of a kernel's local hosts (``forkserver.py``): the same bundle on stdin, its
#: control socket's fd in the environment
FORK_SERVER = READ + LOAD + """sys.modules[_bundle["package"] + ".forkserver"].main(int(os.environ.pop("TPUNB_FORK_SERVER_FD")))\n"""
#: the fork server of an SSH host (``forkserver.serve``): the bundle on stdin, its socket's name as
#: the second argument (the first is READ's file descriptor: 0, stdin)
SSH_FORK_SERVER = READ + LOAD + """sys.modules[_bundle["package"] + ".forkserver"].serve(sys.argv[2])\n"""

#: a host tpunb prepares: the spec (with the modules ``prepare`` needs), then the agent's bundle
LAUNCHER = READ + r"""_message = json.loads(_read(int(_read(12))))
_package = types.ModuleType("tpunb_host")
_package.__path__ = []
sys.modules["tpunb_host"] = _package
for _name, _source in _message["modules"]:
    _module = types.ModuleType("tpunb_host." + _name)
    _module.__file__ = "<tpunb:" + _module.__name__ + ">"
    _module.__package__ = "tpunb_host"
    sys.modules[_module.__name__] = _module
    setattr(_package, _name, _module)
    exec(compile(_source, _module.__file__, "exec"), _module.__dict__)
sys.modules["tpunb_host.prepare"].launch(_message["spec"], _read, _message["bootstrap"], _message.get("init"))
"""

#: the service control process (``service.py``): its source and one request arrive on stdin, with
#: the files it runs on (``parts``: e.g. ``log_mask.py``), each run first in the same namespace
SERVICE_CONTROL = READ + r"""_message = json.loads(_read(int(_read(12))))
_module = types.ModuleType("tpunb_host_service")
sys.modules["tpunb_host_service"] = _module
for _name, _part in _message.get("parts", []):
    exec(compile(_part, "<tpunb:" + _name + ">", "exec"), _module.__dict__)
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
    modules, packages = [], set()
    for name in MODULES:
        package = name.rpartition(".")[0]
        if package and package not in packages:  # a subpackage: made (empty) before its modules
            packages.add(package)
            modules.append((package, None))
        modules.append((name, (HOST / f"{name.replace('.', '/')}.py").read_text()))
    body = json.dumps({"package": PACKAGE, "modules": modules}).encode()
    return b"%012d" % len(body) + body


def launcher_message(spec: dict, init: dict | None = None) -> bytes:
    """What ``LAUNCHER`` reads first: the spec, the modules it runs, the agent's bootstrap, and the
    host's init frame (handed to the agent with the bundle: no round trip waits for it)."""
    modules = [(name, (HOST / f"{name}.py").read_text()) for name in ("protocol", "uv_wheel", "prepare")]
    body = json.dumps({"spec": spec, "modules": modules, "bootstrap": BOOTSTRAP, "init": init}).encode()
    return b"%012d" % len(body) + body


@functools.lru_cache(maxsize=1)
def idle_script() -> str:
    """The idle watchdog (``idle.py``) as a standalone Python script: a node's startup-script, and
    what host 0's agent runs as the watchdog process."""
    return "#!/usr/bin/env python3\n" + (HOST / "standalone" / "idle.py").read_text()


@functools.lru_cache(maxsize=1)
def stacks_source() -> str:
    """``stacks.py``, sent with each request to the stacks reader."""
    return (HOST / "stacks.py").read_text()


@functools.lru_cache(maxsize=1)
def fork_client_source() -> str:
    """``forkclient.py``: an agent's start through an SSH host's fork server (run as ``python3 -c``)."""
    return (HOST / "standalone" / "forkclient.py").read_text()


@functools.lru_cache(maxsize=1)
def worker_source() -> str:
    """``worker.py``: which TPU worker a Compute Engine VM is (run as ``python3 -c``)."""
    return (HOST / "standalone" / "worker.py").read_text()


@functools.lru_cache(maxsize=1)
def service_source() -> str:
    """``service.py``, sent with each request to the service control process."""
    return (HOST / "standalone" / "service.py").read_text()


@functools.lru_cache(maxsize=1)
def service_parts() -> tuple[tuple[str, str], ...]:
    """What ``service.py`` runs on, sent ahead of it: ``log_mask.py`` (its supervisor's masking)."""
    return (("log_mask", (HOST / "standalone" / "log_mask.py").read_text()),)
