"""``tpunb.serve`` is the old name of tpunb.services, tpunb.forwards and tpunb.bench: it keeps working for one release.

Importing it warns once (DeprecationWarning); its names are the new package's, and every old
module path (``tpunb.serve.forward``) is the new module itself, so patching through it patches what runs.
Remove this package in tpunb 0.3 (0.2 is the one release that keeps it)."""
from __future__ import annotations

from tpunb.machine import old_names

#: each old module path and the module it is now
MOVED = {
    "tpunb.serve.bench": "tpunb.bench",
    "tpunb.serve.bench_result": "tpunb.bench.bench_result",
    "tpunb.serve.bench_summary": "tpunb.bench.bench_summary",
    "tpunb.serve.cleanup": "tpunb.services.cleanup",
    "tpunb.serve.control": "tpunb.services.control",
    "tpunb.serve.forward": "tpunb.forwards.port_forward",
    "tpunb.serve.links": "tpunb.forwards.links",
    "tpunb.serve.openssh": "tpunb.forwards.openssh",
    "tpunb.serve.prompts": "tpunb.bench.prompts",
    "tpunb.serve.seen": "tpunb.services.seen",
    "tpunb.serve.services": "tpunb.services.serving",
    "tpunb.serve.tokenizer": "tpunb.bench.tokenizer",
}


__getattr__ = old_names.keep(__name__, MOVED, "tpunb.services", "tpunb.services, tpunb.forwards and tpunb.bench")
