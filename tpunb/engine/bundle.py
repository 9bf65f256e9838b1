"""What is shipped to a host at connect: a tiny bootstrap on the command line, then the modules
of ``tpunb/host`` over stdin, installed as the package ``tpunb_host`` (so a host needs only
Python >= 3.10); and the standalone programs of ``tpunb/host/standalone`` as their own scripts.
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
MODULES = ("protocol", "watchdog", "io", "inbox", "runners", "diagnose", "jax_start", "metrics", "profiler",
           "standalone.idle", "shards", "transfer", "relay", "agent")

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
    _module.__package__ = _module.__name__.rpartition(".")[0]
    sys.modules[_module.__name__] = _module
    setattr(sys.modules[_module.__package__], _name.rpartition(".")[2], _module)
    if _source is None:
        _module.__path__ = []
    else:
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


@functools.lru_cache(maxsize=1)
def idle_script() -> str:
    """The idle watchdog (``idle.py``) as a standalone Python script: a node's startup-script, and
    what host 0's agent runs as the watchdog process."""
    return "#!/usr/bin/env python3\n" + (HOST / "standalone" / "idle.py").read_text()


@functools.lru_cache(maxsize=1)
def service_source() -> str:
    """``service.py``, sent with each request to the service control process."""
    return (HOST / "standalone" / "service.py").read_text()
