"""%tpu_snapshot and %tpu_restore: parse the line, make one call into ``tpunb.snapshot``."""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from tpunb import report, manager
from tpunb.errors import UsageError
from tpunb.magics.args import one_line_interrupt, parse_line, usage_of
from tpunb.snapshot.preempt import names_list


@magics_class
class SnapshotMagics(Magics):
    """Host variables that outlive the slice: saved, listed, restored on another shape."""

    @magic_arguments()
    @argument("names", nargs="*", help="host variables to save (jax.Arrays and pytrees of them, or anything that pickles)")
    @argument("--to", default=None, metavar="URI",
              help="a folder every host reaches, or gs://BUCKET/PATH (default: under $TPUNB_HOME; the bucket for cloud slices)")
    @argument("--slice", dest="slice_name", default=None, help="snapshot this slice instead of the current one")
    @argument("--bucket", default=None, help="the Cloud Storage bucket for cloud slices' snapshots, remembered from now on")
    @argument("--list", dest="list_", action="store_true", help="the snapshots: time, size, names, source slice shape")
    @argument("--on-preempt", dest="on_preempt", default=None, metavar="NAME[,NAME]",
              help="arm every host to snapshot these names when its VM is reclaimed (spot preemption)")
    @line_magic
    def tpu_snapshot(self, line: str):
        """Save host variables from every host: %tpu_snapshot NAME [NAME ...] [--to URI]; --list; --on-preempt NAMES."""
        from tpunb import snapshot

        args = parse_line(self.tpu_snapshot, line)
        if args.bucket and not (args.names or args.on_preempt or args.list_):
            snapshot.store.bucket(args.bucket)
            report.info(f"[tpunb] cloud slices' snapshots go to gs://{snapshot.store.bucket()}/{snapshot.store.BUCKET_FOLDER}")
            return None
        if args.list_:
            if args.names or args.on_preempt or args.to:
                raise UsageError("--list lists snapshots: give it alone. Usage: %tpu_snapshot --list")
            if args.bucket:
                snapshot.store.bucket(args.bucket)
            return snapshot.store.table(snapshot.snapshots())
        if args.on_preempt is not None:
            if args.names:
                raise UsageError("give the names after --on-preempt, separated by commas: "
                                 "%tpu_snapshot --on-preempt params,step")
            from tpunb.snapshot import preempt

            with one_line_interrupt():
                preempt.arm(manager.current(args.slice_name), names_list(args.on_preempt, "--on-preempt"), to=args.to,
                            bucket=args.bucket)
            return None
        if not args.names:
            raise UsageError(f"give the host variables to save, e.g. %tpu_snapshot params step. Usage: "
                             f"{usage_of(self.tpu_snapshot)}")
        sl = manager.current(args.slice_name)
        snapshot.snapshot(sl, args.names, to=args.to, bucket=args.bucket)
        return None

    @magic_arguments()
    @argument("where", nargs="*", help="[URI] [NAME ...]: the snapshot (default: the newest of this slice), then names")
    @argument("--slice", dest="slice_name", default=None, help="restore onto this slice instead of the current one")
    @line_magic
    def tpu_restore(self, line: str):
        """Load a snapshot onto the current slice, whatever its shape: %tpu_restore [URI] [NAME ...]."""
        from tpunb import snapshot

        args = parse_line(self.tpu_restore, line)
        uri, names = split_where(args.where)
        snapshot.restore(manager.current(args.slice_name), uri, names or None)
        return None


def split_where(words: list[str]) -> tuple[str | None, list[str]]:
    """[URI] [NAME ...]: a first word that is no Python name is the snapshot's place."""
    if words and not words[0].isidentifier():
        return words[0], words[1:]
    return None, list(words)

