"""``python -m tpunb stacks NAME``: every host's stacks from a terminal, while the notebook that
owns the slice is busy (or hung). Hosts, pids and how to reach them come from the registry,
which the owning kernel keeps; SSH hosts are reached with tpunb's key and their recorded host keys."""
from __future__ import annotations

import argparse
import sys

from tpunb.errors import TpunbError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m tpunb", description="tpunb from a terminal")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    stacks = commands.add_parser("stacks", help="every host's Python stacks, grouped by identical stacks",
                                 description="Every host's Python stacks, all threads, grouped by identical stacks; "
                                             "works while the slice's notebook runs a cell.")
    stacks.add_argument("name", nargs="?", help="the slice (default: the only one recorded)")
    stacks.add_argument("--hosts", default=None, help="all (default), 0, 0,2, 1:3, s1/0")
    stacks.add_argument("--native", action="store_true", help="also C/C++ frames, through py-spy on the hosts")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(stacks_text(args.name, args.hosts, args.native))
    except TpunbError as exc:
        print(f"tpunb: {exc}", file=sys.stderr)
        return 1
    return 0


def stacks_text(name: str | None, hosts: str | None, native: bool) -> str:
    from tpunb.errors import NoSliceError
    from tpunb.server.outside import recorded_stacks
    from tpunb.registry import Registry

    registry = Registry()
    if name is None:
        known = [r.name for r in registry.list_slices()]
        if len(known) != 1:
            raise NoSliceError(f"name the slice: python -m tpunb stacks NAME ({'known: ' + ', '.join(known) if known else 'none is recorded'})")
        name = known[0]
    record = registry.get_slice(name)
    if record is None:
        known = [r.name for r in registry.list_slices()]
        raise NoSliceError(f"no slice named {name!r}" + (f": known slices are {', '.join(known)}" if known else ""))
    return recorded_stacks(record, registry, hosts, native).text()
