"""Old import paths kept for one release: each old module path is answered with the module at its
new one (one object under two names, so a patch through the old path patches what runs), the old
package warns once, and its attributes are the new package's. The shims of renamed packages
(tpunb.emulator, tpunb.serve) are a table each and one call here."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module at its new one."""

    def __init__(self, old: str, moved: dict[str, str]) -> None:
        self.old, self.moved, self.specs = old, moved, {}

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in self.moved else None

    def create_module(self, spec):
        module = importlib.import_module(self.moved[spec.name])
        self.specs[spec.name] = module.__spec__  # the import system sets the alias's spec on it
        return module

    def exec_module(self, module) -> None:
        for name, spec in list(self.specs.items()):
            if sys.modules.get(name) is module:
                module.__spec__ = self.specs.pop(name)


def keep(old: str, moved: dict[str, str], new: str, instead: str) -> Callable[[str], Any]:
    """Make package ``old`` an alias of ``new`` for one release: every path in ``moved`` (old module
    path -> new) is the new module, a DeprecationWarning names ``instead``; returns the old package's
    module ``__getattr__``."""
    if not any(isinstance(f, _OldPaths) and f.old == old for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths(old, moved))
    # the importer's line: warnings skips the import machinery's frames, and this function's
    warnings.warn(f"{old} is deprecated: use {instead} (the old name goes in tpunb 0.3)", DeprecationWarning,
                  stacklevel=3)

    def attribute(name: str) -> Any:
        if f"{old}.{name}" in moved:  # an old submodule: the module it is now
            return importlib.import_module(f"{old}.{name}")
        return getattr(importlib.import_module(new), name)

    return attribute
