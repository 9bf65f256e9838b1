"""``%tpu_stacks`` and ``%tpu_restart``: where every host is, and fresh sessions on the same slice.

The magics parse arguments and make one call (``Slice.stacks``, ``Slice.restart``); the rest is
in :mod:`tpunb.stuck`.
"""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tpunb import manager, report
from tpunb.magics.args import one_line_interrupt, parse_line


@magics_class
class HangMagics(Magics):
    """Magics for a run that hangs: look at every host, then restart them."""

    @magic_arguments()
    @argument("--hosts", default=None, help="all (default), 0, 0,2 or 1:3; in a multislice also s1, s1/0")
    @argument("--native", action="store_true", help="also C/C++ frames, through py-spy on the hosts")
    @argument("--slice", dest="slice_name", default=None,
              help="this slice (one another kernel holds too: read through the registry)")
    @line_magic
    def tpu_stacks(self, line: str):
        """Every host's Python stacks, all threads, grouped by identical stacks: works while a cell
        runs and while a host is blocked in C (an XLA collective, a barrier). ``--slice NAME`` of
        a slice another kernel holds reads its hosts from here, through the registry."""
        args = parse_line(self.tpu_stacks, line)
        with one_line_interrupt():
            if args.slice_name and manager.attached(args.slice_name) is None:
                from tpunb.server.stacks_cli import stacks_text

                report.info(stacks_text(args.slice_name, args.hosts, args.native))
                return
            stacks = manager.current(args.slice_name).stacks(hosts=args.hosts, native=args.native)
        report.info(stacks.text())

    @magic_arguments()
    @argument("--hosts", default=None, help="all (default); a subset only while no host runs JAX")
    @argument("--no-jax", action="store_true",
              help="do not start JAX again: the chips stay free for another program (vllm serve)")
    @argument("--slice", dest="slice_name", default=None)
    @line_magic
    def tpu_restart(self, line: str):
        """Fresh Python sessions on every host of the same slice (the node, its environment and
        services stay; JAX starts again over the whole slice, unless --no-jax): the way back from a
        wedged runtime, and how a slice's chips are freed for a service."""
        args = parse_line(self.tpu_restart, line)
        sl = manager.current(args.slice_name)
        with one_line_interrupt():
            done = sl.restart(hosts=args.hosts, jax=not args.no_jax)
        report.info(done.line(sl.name, sl.layout.names))
