"""``tpunb.emulator`` is the old name of tpunb.sandbox: it keeps working for one release.

Importing it warns once (DeprecationWarning); its names are the new package's, and every old
module path (``tpunb.emulator.compute``) is the new module itself, so patching through it patches what runs.
Remove this package in tpunb 0.3 (0.2 is the one release that keeps it)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: each old module path and the module it is now
MOVED = {
    "tpunb.emulator.accounts": "tpunb.sandbox.iam.accounts",
    "tpunb.emulator.admin": "tpunb.sandbox.admin",
    "tpunb.emulator.catalog_api": "tpunb.sandbox.tpu.catalog_api",
    "tpunb.emulator.checks": "tpunb.sandbox.tpu.request_checks",
    "tpunb.emulator.compute": "tpunb.sandbox.compute.compute",
    "tpunb.emulator.compute_checks": "tpunb.sandbox.compute.compute_checks",
    "tpunb.emulator.compute_metadata": "tpunb.sandbox.compute.compute_metadata",
    "tpunb.emulator.compute_migs": "tpunb.sandbox.compute.compute_migs",
    "tpunb.emulator.compute_project": "tpunb.sandbox.compute.compute_project",
    "tpunb.emulator.compute_records": "tpunb.sandbox.compute.compute_records",
    "tpunb.emulator.compute_routes": "tpunb.sandbox.compute.compute_routes",
    "tpunb.emulator.hosts": "tpunb.sandbox.hosts.pool",
    "tpunb.emulator.hub": "tpunb.sandbox.hub.hub_server",
    "tpunb.emulator.image": "tpunb.sandbox.hosts.image",
    "tpunb.emulator.machines": "tpunb.sandbox.compute.machines",
    "tpunb.emulator.metadata": "tpunb.sandbox.metadata.metadata_server",
    "tpunb.emulator.quotas": "tpunb.sandbox.quotas",
    "tpunb.emulator.resources": "tpunb.sandbox.tpu.resources",
    "tpunb.emulator.sandbox": "tpunb.sandbox.box",
    "tpunb.emulator.server": "tpunb.sandbox.server",
    "tpunb.emulator.sshd": "tpunb.sandbox.hosts.sshd",
    "tpunb.emulator.state": "tpunb.sandbox.state",
    "tpunb.emulator.storage": "tpunb.sandbox.storage.cloud_storage",
    "tpunb.emulator.vms": "tpunb.sandbox.hosts.vms",
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

warnings.warn(f"{__name__} is deprecated: use tpunb.sandbox (the old name goes in tpunb 0.3)", DeprecationWarning,
              stacklevel=2)  # the importer's line: warnings skips the import machinery's frames


def __getattr__(name: str):
    if f"{__name__}.{name}" in MOVED:  # an old submodule: the module it is now
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module("tpunb.sandbox"), name)
