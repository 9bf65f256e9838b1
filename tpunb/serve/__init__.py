"""``tpunb.serve`` is the old name of tpunb.services, tpunb.forwards and tpunb.bench: it keeps working for one release.

Importing it warns once (DeprecationWarning); its names are the new package's, and every old
module path (``tpunb.serve.forward``) is the new module itself, so patching through it patches what runs.
Remove this package in tpunb 0.3 (0.2 is the one release that keeps it)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module at its new one (one object under two names)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self.specs[spec.name] = module.__spec__  # the import system sets the alias's spec on it
        return module

    def exec_module(self, module) -> None:
        for name, spec in list(self.specs.items()):
            if sys.modules.get(name) is module:
                module.__spec__ = self.specs.pop(name)


if not any(isinstance(f, _OldPaths) and getattr(f, "old", None) == __name__ for f in sys.meta_path):
    _finder = _OldPaths()
    _finder.old, _finder.specs = __name__, {}
    sys.meta_path.insert(0, _finder)

warnings.warn(f"{__name__} is deprecated: use tpunb.services, tpunb.forwards and tpunb.bench (the old name goes in tpunb 0.3)", DeprecationWarning,
              stacklevel=2)  # the importer's line: warnings skips the import machinery's frames


def __getattr__(name: str):
    if f"{__name__}.{name}" in MOVED:  # an old submodule: the module it is now
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module("tpunb.services"), name)
